"""Learning curves side by side: return against env steps and against wall-clock time, over seeds.

    python benchmarks/learning.py                          # read runs/bench/<impl>/<env>__<seed> and plot
    python benchmarks/learning.py --run --impls ppo sb3    # first train what is missing (long: 1M steps a run);
                                                           # run it again after a Ctrl-C: it resumes where it stopped
    python benchmarks/learning.py --quick                  # smoke test: tiny Pendulum runs
    python benchmarks/learning.py --run --ray-address auto --impls ppo --grid learning-rate=1e-4,3e-4
                                                           # a sweep on a Ray cluster: runs/bench/ppo__learning-rate=...

Layout: every run logs TensorBoard events under <runs-root>/<group>/<impl>/<env-id>__<seed>/ (ppo_continuous.py and
dppo_ray.py via --run-name, SB3 via its tensorboard_log). Events are read with tensorboard's EventAccumulator.
The curve of a run is the mean return of its last 100 episodes, the quantity SB3 logs as rollout/ep_rew_mean, so the
implementations compare like for like. The table gives the final value (per seed, and mean ± sample std over seeds)
and the time, in env steps and in seconds, at which each run first reached the target return (both views: return at a
fixed budget, and time to a fixed return). A second table compares each implementation's final
return with the first one in --impls: a Welch t-interval, and an exact permutation test over seeds whose p is printed
beside the least p its seed counts allow (0.10 with 3 + 3 seeds, 0.029 with 4 + 4).
For tasks that CleanRL publishes figures for (MuJoCo at 1M steps, dm_control at 8M), one more table per env family
sets each implementation beside CleanRL's figure, and an aggregate gives the interquartile mean of the scores
normalized between random actions (0) and CleanRL's mean (1), with stratified-bootstrap intervals (rliable).
Writes <out-dir>/learning.md, learning.png (return against steps and against seconds) and learning_grid.png (one panel
per task); --name changes the name. The default <out-dir> is a new folder benchmarks/results/local/<UTC date-time>/,
which git ignores; --update-committed writes into benchmarks/results/.
A run is reused only when it is the run asked for: its run.json (written by the trainer when it started) must hold
the same command, flag for flag, budget included, and the same code (the SHA-256 of the repository's scripts, resumes
included). Otherwise --run refuses in one line naming the first difference, or with --rerun-changed trains it afresh.
The tables give each row's code and say so when the runs mix versions.
--run trains what is missing: --jobs single-process runs (ppo, sb3) at a time, then each DPPO run alone; with
--ray-address, every run at once as a Ray task on a cluster's nodes, each run's folder coming back here
(ray_cluster.run_on_cluster). --grid makes configurations of the trainers' flags; each is a row of the tables. --python
runs ppo and DPPO in another venv's interpreter: dm_control's envs need mujoco 3.x, in the venv that
benchmarks/requirements-dm_control.txt describes. This file trains; learning_report.py reads the runs and writes the
tables and plots.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from common import (
    REPO,
    BenchError,
    HelpFormatter,
    add_output_args,
    display_command,
    relative_to_cwd,
    resolve_out_dir,
    timed_subprocess,
)
from learning_report import TARGETS, plot_curves, plot_grid, read_curve, report_lines, summarize_runs

# common put the repository on the path
from launcher import command_flags
from ray_cluster import ClusterError, pack_folder, run_on_cluster
from run_record import file_sha256, last_line
from stop_signals import take_back_stop_signals

# The trainers --run starts besides SB3: script and flags, from the repository root.
COMMANDS = {
    "ppo": ["ppo_continuous.py"],
    "dppo_sync": ["dppo_ray.py", "--mode=sync"],
    "dppo_async": ["dppo_ray.py", "--mode=async"],
}


def run_missing(cfg: argparse.Namespace) -> None:
    """Train every run that is not done. Locally: --jobs single-process runs (ppo, sb3) at a time, then each DPPO run
    with the machine to itself (its actors and learner use every core). With --ray-address: all of them at once, as
    Ray tasks on the cluster (ray_cluster.run_on_cluster)."""
    missing = missing_runs(cfg)
    if cfg.ray_address:
        if cfg.storage:
            os.makedirs(cfg.runs_root, exist_ok=True)  # a node that does not see it refuses its runs
        jobs = [cluster_job(cfg, *run) for run in missing]
        try:
            statuses, stopped = run_on_cluster(
                jobs, cfg.ray_address, cfg.runs_root, REPO, cfg.max_retries, prog="learning.py"
            )
        except ClusterError as e:
            raise BenchError(str(e)) from None
        if stopped is not None:  # the runs in flight came back with their checkpoints: the same command resumes them
            raise KeyboardInterrupt
        failed = [label for label, status in statuses.items() if status != 0]
        if failed:
            raise BenchError(f"{len(failed)} of {len(jobs)} runs failed; the first: {failed[0]} (its line is above)")
        return
    root = os.path.abspath(cfg.runs_root)
    single = []
    distributed = []
    for label, impl, config, env_id, seed, status in missing:
        folder = os.path.join(root, cfg.group, label, f"{env_id}__{seed}")
        if status == "restart" and impl == "sb3":
            shutil.rmtree(folder)  # SB3 keeps no checkpoint here: its half-finished run starts afresh
        title = f"{status} {label} on {env_id}, seed {seed}"
        if impl == "sb3":
            single.append((title, sb3_argv(cfg, env_id, seed, folder, REPO), sys.executable))  # SB3 runs in this venv
            continue
        argv = trainer_argv(cfg, (label, impl, config, env_id, seed), folder, status, REPO)
        (distributed if impl.startswith("dppo") else single).append((title, argv, cfg.python))
    run_jobs(single, cfg.jobs, cwd=os.path.dirname(root))
    run_jobs(distributed, 1, cwd=os.path.dirname(root))


def missing_runs(cfg: argparse.Namespace) -> list[tuple]:
    """(label, impl, config, env id, seed, status) of every run that is not done; run_status says what status means.
    A run folder made by another command or other code is never reused: refused in one line naming the first
    difference, or, with --rerun-changed, set aside (renamed, kept) and run afresh."""
    root = os.path.abspath(cfg.runs_root)
    missing = []
    for env_id, seed, (label, impl, config) in itertools.product(cfg.envs, range(1, cfg.seeds + 1), cfg.configs):
        folder = os.path.join(root, cfg.group, label, f"{env_id}__{seed}")
        status = run_status(folder, cfg)
        if status in ("done", "resume"):
            expected = expected_command(cfg, (label, impl, config, env_id, seed))
            difference = run_difference(folder, expected, expected_environment(run_python(cfg, impl)))
            if difference and not cfg.rerun_changed:
                advice = "rerun it with --rerun-changed" if cfg.run else "report with the flags it was run with"
                raise BenchError(f"{relative_to_cwd(folder)} {difference}: {advice}, or sweep into another --group")
            if difference:
                set_aside(folder, difference)
                status = "new"
        if status != "done":
            missing.append((label, impl, config, env_id, seed, status))
    return missing


def set_aside(folder: str, difference: str) -> str:
    """--rerun-changed: the old run's folder renamed beside the new one's (<folder>.replaced-<time>), never deleted;
    the tables read only <env>__<seed> folders."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = f"{folder}.replaced-{stamp}"
    for n in itertools.count(2):
        if not os.path.exists(aside):
            break
        aside = f"{folder}.replaced-{stamp}-{n}"
    os.rename(folder, aside)
    sys.stderr.write(f"learning.py: {relative_to_cwd(folder)} {difference}: kept as {os.path.basename(aside)}\n")
    return aside


# Flags that name where a run logs or how it talks, not what it is: two runs that differ only in these compare.
WHERE_FLAGS = {"--run-name", "--tb-log", "--overwrite", "--quiet"}


def expected_command(cfg: argparse.Namespace, run: tuple) -> list[str]:
    """The command line (script name, then flags) that --run starts `run` (label, impl, config, env id, seed) with."""
    label, impl, config, env_id, seed = run
    if impl == "sb3":
        return ["sb3_ppo.py", *sb3_argv(cfg, env_id, seed, "", "")[1:]]
    return trainer_argv(cfg, run, "", "new", "")


def compared_flags(command: list[str]) -> dict[str, str]:
    """{--flag: value} of a command line (its script, then its flags; launcher.command_flags reads them), less
    WHERE_FLAGS; a switch's value is "(set)"."""
    flags = command_flags(command[1:])
    return {flag: "(set)" if value is None else value for flag, value in flags.items() if flag not in WHERE_FLAGS}


# What a resume may say besides its checkpoint: learning.py's own resumes add --num-seeds=1 (and WHERE_FLAGS).
RESUME_FLAGS = {"--resume", "--num-seeds"}


def same_value(a: str | None, b: str | None) -> bool:
    """Two flag values alike as values: 3e-4 and 0.0003 are one learning rate."""
    if a == b:
        return True
    try:
        return a is not None and b is not None and float(a) == float(b)
    except ValueError:
        return False


def run_difference(folder: str, expected: list[str], environment: dict) -> str | None:
    """None when the run in `folder` was started by `expected` (its run.json's command, flag for flag, values as
    values), continued only by resumes that changed no flag, trained by the code now in every module it imported (the
    repository's, a custom env's) and on `environment`'s Python and packages (expected_environment); else what differs
    first, in words."""
    path = os.path.join(folder, "run.json")
    if not os.path.isfile(path):
        return "records no command or code (it has no run.json: made before learning.py checked runs)"
    with open(path) as f:
        record = json.load(f)
    entries = [record, *record.get("resumes", [])]
    if any("modules" not in entry["code"] or "environment" not in entry for entry in entries):
        return "records no module hashes or versions (made before runs recorded them)"
    if os.path.basename(record["command"][0]) != expected[0]:
        return f"was run by {os.path.basename(record['command'][0])}, not {expected[0]}"
    ran, asked = compared_flags(record["command"]), compared_flags(expected)
    for flag in [*asked, *(f for f in ran if f not in asked)]:
        if not same_value(ran.get(flag), asked.get(flag)):
            was = f"{flag}={ran[flag]}" if flag in ran else f"no {flag}"
            now = f"{flag}={asked[flag]}" if flag in asked else f"no {flag}"
            return f"was run with {was}, this sweep asks {now}"
    for resume in record.get("resumes", []):
        for flag, value in compared_flags(resume["command"]).items():
            if flag not in RESUME_FLAGS and not same_value(value, ran.get(flag)):
                return f"was resumed with {flag}={value} (by hand: it is no longer the run its command says)"
    for entry in entries:
        for module in entry["code"]["modules"].values():
            where = module["path"] if os.path.isabs(module["path"]) else os.path.join(REPO, module["path"])
            if file_sha256(where) != module["sha256"]:
                commit = (entry["code"]["commit"] or "unknown")[:12]
                return f"was trained by other code ({module['path']} has changed since; the run's commit {commit})"
        ran_on, now_on = entry["environment"], environment
        if ran_on["python"] != now_on["python"]:
            return f"was trained on Python {ran_on['python']}, this sweep's Python is {now_on['python']}"
        for package, version in now_on["packages"].items():
            if ran_on["packages"].get(package) != version:
                return (
                    f"was trained with {package} {ran_on['packages'].get(package)}, this sweep's Python has {version}"
                )
    return None


@functools.cache
def expected_environment(python: str) -> dict:
    """run_record.run_environment() as the interpreter `python` reports it: what its runs would record."""
    code = f"import json, sys; sys.path.insert(0, {REPO!r}); import run_record as r; "
    code += "print(json.dumps(r.run_environment()))"
    result = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        last = last_line(result.stderr) or "no output"
        raise BenchError(f"--python {python} cannot report its versions ({last})")
    return json.loads(result.stdout.strip().splitlines()[-1])


def run_python(cfg: argparse.Namespace, impl: str) -> str:
    """The interpreter a run of `impl` trains in: SB3 in this one, the trainers in --python."""
    return sys.executable if impl == "sb3" else cfg.python


def cluster_job(cfg: argparse.Namespace, label: str, impl: str, config: dict, env_id: str, seed: int, status: str):
    """A run as ray_cluster.run_on_node takes it. Its paths are relative: the script's to the repo that Ray uploads, the
    run folder's to the node's working folder. The run's commands for a fresh start and for resuming: the node picks
    one by what it finds in the folder."""
    run_name = os.path.join(cfg.group, label, f"{env_id}__{seed}")
    folder = os.path.join("runs", run_name)
    if impl == "sb3":
        argv = {"new": sb3_argv(cfg, env_id, seed, folder, ""), "resume": None}
    else:
        run = (label, impl, config, env_id, seed)
        argv = {status: trainer_argv(cfg, run, folder, status, "") for status in ("new", "resume")}
    head_folder = os.path.join(os.path.abspath(cfg.runs_root), run_name)
    resume_from_head = status == "resume" and not cfg.storage
    if impl.startswith("dppo"):
        cpus = int(config.get("num-actors", 2)) * float(config.get("actor-cpus", 1)) + 1  # actors, and the learner
    else:
        cpus = 1
    return {
        "label": f"{label} on {env_id}, seed {seed}",
        "run_name": run_name,
        "argv": argv,
        "folder_tar": pack_folder(head_folder) if resume_from_head else None,
        "storage": os.path.dirname(os.path.abspath(cfg.runs_root)) if cfg.storage else None,
        "python": cfg.python if cfg.python_given else None,
        "cpus": cpus,
    }


def run_flags(cfg: argparse.Namespace, env_id: str, seed: int) -> list[str]:
    """The flags of every trainer --run starts, SB3's included."""
    return [
        f"--env-id={env_id}",
        f"--seed={seed}",
        f"--total-timesteps={cfg.total_timesteps}",
        f"--num-minibatches={cfg.num_minibatches}",
    ]


def sb3_argv(cfg: argparse.Namespace, env_id: str, seed: int, folder: str, repo: str) -> list[str]:
    """sb3_ppo.py logging into `folder`. --vf-coef 0.25: SB3's value loss is the MSE, ppo_continuous.py's half of it."""
    argv = [os.path.join(repo, "benchmarks", "sb3_ppo.py"), *run_flags(cfg, env_id, seed), f"--tb-log={folder}"]
    return [*argv, f"--num-steps={cfg.num_steps}", "--vf-coef=0.25", "--clip-vloss"]


def trainer_argv(cfg: argparse.Namespace, run: tuple, folder: str, status: str, repo: str) -> list[str]:
    """ppo_continuous.py or dppo_ray.py (in `repo`) for `run` (label, impl, config, env id, seed), logging into
    `folder`, with the configuration's flags: a new run, a "restart" over a half-finished one, or a "resume" from its
    checkpoint, which holds the run's flags."""
    label, impl, config, env_id, seed = run
    script, *flags = COMMANDS[impl]
    if status == "resume":
        argv = [os.path.join(repo, script), f"--resume={os.path.join(folder, 'checkpoint.pt')}", "--quiet"]
        # a seed of a --num-seeds run resumes alone (its checkpoint would resume all its seeds)
        return [*argv, "--num-seeds=1"] if script == "ppo_continuous.py" else argv
    steps = cfg.num_steps // 2 if script == "dppo_ray.py" else cfg.num_steps  # 2 actors: the same batch as ppo's
    argv = [os.path.join(repo, script), *flags, *run_flags(cfg, env_id, seed), f"--num-steps={steps}", "--quiet"]
    argv += config_flags(config, cfg.bool_flags)
    argv.append(f"--run-name={os.path.join(cfg.group, label, f'{env_id}__{seed}')}")
    if status == "restart":
        argv.append("--overwrite")
    return argv


def run_jobs(jobs: list[tuple], parallel: int, cwd: str) -> None:
    """Run (label, argv) or (label, argv, python) jobs, `parallel` at a time. After a failure the others still finish
    (each is a long training run) before it is raised; after Ctrl-C, which the running trainers also get and answer
    with a checkpoint, nothing new starts."""

    def run(label: str, argv: list[str], python: str = sys.executable) -> None:
        sys.stderr.write(f"learning.py: {label} ...\n")  # one write: jobs running side by side print whole lines
        sys.stderr.flush()
        timed_subprocess(label, argv, cwd=cwd, python=python)

    pool = ThreadPoolExecutor(max_workers=parallel)
    try:
        futures = [pool.submit(run, *job) for job in jobs]
        errors = [f.exception() for f in futures]
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown()
    for error in errors:
        if error is not None:
            raise error


def run_status(folder: str, cfg: argparse.Namespace) -> str:
    """What --run does with a run's folder: "done" once it reached --total-timesteps (its summary.json says completed,
    or, for SB3 and runs without one, its last logged step is within a rollout of the budget), "resume" from the
    checkpoint.pt that an interrupted ppo or DPPO run left, "restart" a half-finished run that has none, "new"."""
    if not os.path.isdir(folder):
        return "new"
    summary = os.path.join(folder, "summary.json")
    if os.path.isfile(summary):
        with open(summary) as f:
            if json.load(f).get("status") == "completed":
                return "done"
    curve = read_curve(folder)
    if curve is not None and not os.path.isfile(summary) and curve[0][-1] >= cfg.total_timesteps - cfg.num_steps:
        return "done"
    return "resume" if os.path.isfile(os.path.join(folder, "checkpoint.pt")) else "restart"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="learning.py", description=__doc__, formatter_class=HelpFormatter)
    p.add_argument(
        "--envs", nargs="+", default=["HalfCheetah-v5", "Hopper-v5"], help="env ids (default: HalfCheetah-v5 Hopper-v5)"
    )
    p.add_argument(
        "--impls",
        nargs="+",
        default=["ppo", "dppo_sync", "dppo_async", "sb3"],
        help="folders under <runs-root>/<group>; --run can train ppo, dppo_sync, dppo_async and sb3; the first is the "
        "baseline of the p-value table (default: ppo dppo_sync dppo_async sb3)",
    )
    p.add_argument("--seeds", type=int, default=2, help="seeds 1..N (default: 2)")
    p.add_argument(
        "--runs-root", default="runs", help="where the runs' logs are, in the working directory (default: runs)"
    )
    p.add_argument("--group", default="bench", help="folder under --runs-root (default: bench)")
    p.add_argument("--run", action="store_true", help="train the runs that are not done yet (see --jobs)")
    p.add_argument(
        "--rerun-changed",
        action="store_true",
        help="with --run: a run folder made by another command, other code or other package versions (its run.json) "
        "is renamed <folder>.replaced-<time> and run afresh; without it such a folder is refused, naming the first "
        "difference",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="with --run: single-process runs (ppo, sb3) at a time; DPPO runs always run alone (default: 1)",
    )
    p.add_argument(
        "--grid",
        nargs="+",
        default=[],
        metavar="FLAG=V1,V2",
        help="with --run: a configuration for every combination of these values of the trainers' flags, e.g. "
        "--grid learning-rate=1e-4,3e-4 ent-coef=0,0.01; each runs every env and seed, in <impl>__<flag>=<value>... "
        "folders, and the tables compare the configurations (ppo_continuous.py and dppo_ray.py flags; not sb3)",
    )
    p.add_argument(
        "--ray-address",
        default=None,
        help="with --run: send every run to the Ray cluster at this address (auto, or host:port) as a Ray task, "
        "spread over its nodes; each run's folder comes back into --runs-root (ray_cluster.run_on_cluster)",
    )
    p.add_argument(
        "--storage",
        default=None,
        help="with --ray-address: a folder that every node sees (NFS); the runs write into <storage>/runs directly "
        "instead of coming back as archives, and a run whose node is lost resumes from its last checkpoint",
    )
    p.add_argument(
        "--max-retries",
        type=int,
        default=3,
        help="with --ray-address: times Ray runs a run again after its node or worker died (default: 3)",
    )
    p.add_argument(
        "--python",
        default=sys.executable,
        help="the interpreter of the ppo and DPPO runs (with --run) and of the random-action returns, e.g. a venv's "
        "bin/python with mujoco==3.17.0 and shimmy[dm-control] for the dm_control envs (default: this one)",
    )
    p.add_argument("--total-timesteps", type=int, default=1_000_000, help="per run, with --run (default: 1000000)")
    p.add_argument(
        "--num-steps",
        type=int,
        default=2048,
        help="rollout length (dppo: per actor, halved for 2 actors; default: 2048)",
    )
    p.add_argument("--num-minibatches", type=int, default=32, help="(default: 32)")
    p.add_argument(
        "--target",
        type=float,
        default=None,
        help="target return (default: per env: "
        + ", ".join(f"{env} {target:g}" for env, target in TARGETS.items())
        + ")",
    )
    add_output_args(p, "learning.md, learning.png and learning_grid.png")
    p.add_argument("--name", default="learning", help="file name of the table and plots, without extension")
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: trains Pendulum-v1, 1 seed, 4096 steps, in a temporary runs folder that it then deletes",
    )
    cfg = p.parse_args(argv)
    if cfg.jobs < 1:
        p.error("--jobs must be at least 1")
    if cfg.rerun_changed and not cfg.run:
        p.error("--rerun-changed says what --run does with runs made otherwise: use it with --run")
    if cfg.max_retries < 0:
        p.error("--max-retries must be at least 0")
    if cfg.ray_address and not (cfg.run or cfg.quick):
        p.error("--ray-address sends runs to a cluster: use it with --run")
    if cfg.ray_address and cfg.jobs != 1:
        p.error("--jobs applies to runs on this machine; with --ray-address the cluster's CPUs decide")
    if cfg.storage and not cfg.ray_address:
        p.error("--storage is where cluster runs write: use it with --ray-address")
    if cfg.storage:
        if "--runs-root" in command_flags(argv):
            p.error("--storage sets the runs folder (<storage>/runs): leave out --runs-root")
        if cfg.quick:
            p.error("--quick trains in a temporary folder of this machine: leave out --storage")
        cfg.runs_root = os.path.join(cfg.storage, "runs")
    cfg.python_given = "--python" in command_flags(argv)
    if shutil.which(cfg.python) is None:
        p.error(f"--python {cfg.python}: no such executable")
    cfg.python = os.path.abspath(shutil.which(cfg.python))  # the runs start elsewhere; a venv's link must stay a link
    unknown = [impl for impl in cfg.impls if impl not in (*COMMANDS, "sb3")]
    if (cfg.run or cfg.quick) and unknown:
        p.error(f"--run cannot train {' '.join(unknown)}: it trains {' '.join(COMMANDS)} sb3")
    try:
        cfg.configs, cfg.bool_flags = configurations(cfg.impls, cfg.grid)
    except ValueError as e:
        p.error(str(e))
    cfg.trainers, cfg.impls = cfg.impls, [label for label, _, _ in cfg.configs]  # the tables compare configurations
    cfg.out_dir = resolve_out_dir(cfg)
    return cfg


# learning.py sets these itself for every run, or they say how and where a run runs rather than what it learns: a grid
# over them would collide with learning.py's own flags or with the run's folder.
OWN_FLAGS = {
    "env-id",
    "seed",
    "total-timesteps",
    "num-steps",
    "num-minibatches",
    "run-name",
    "resume",
    "overwrite",
    "quiet",
    "exp-name",
    "eval-checkpoint",
    "mode",
    "ray-address",
    "no-ray",
    "object-store-memory",
}


def configurations(impls: list[str], grid: list[str]) -> tuple[list[tuple], set[str]]:
    """[(label, impl, {flag: value})] for every implementation and combination of --grid's values, and the grid's
    boolean flags. Labels: the impl alone without a grid, else e.g. ppo__learning-rate=0.0001__ent-coef=0.0 (each value
    written one way for its type, as_value)."""
    if not grid:
        return [(impl, impl, {}) for impl in impls], set()
    axes = []
    for item in grid:
        key, sep, values = item.partition("=")
        key = key.removeprefix("--")
        if not sep or not key or not all(values.split(",")):
            raise ValueError(f"--grid {item}: write FLAG=V1,V2 (e.g. learning-rate=1e-4,3e-4)")
        if key in OWN_FLAGS:
            raise ValueError(f"--grid {key}: learning.py sets --{key} itself, or it is not a setting to sweep")
        if key in {k for axis in axes for k, _ in axis}:
            raise ValueError(f"--grid {key}: given twice")
        values = values.split(",")
        if len(set(values)) < len(values) or any(
            not v.strip() or v != v.strip() or "/" in v or "|" in v for v in values
        ):
            raise ValueError(f"--grid {item}: give distinct values, without spaces, '/' or '|' (they name folders)")
        axes.append([(key, value) for value in values])
    if "sb3" in impls:
        raise ValueError("--grid takes ppo_continuous.py and dppo_ray.py flags: leave sb3 out of --impls")
    unknown = [impl for impl in impls if impl not in COMMANDS]
    if unknown:
        raise ValueError(f"--grid takes the flags of {' '.join(COMMANDS)}, not of {' '.join(unknown)}")
    fields = trainer_fields(impls)
    bool_flags = set()
    for (key, _), *_ in axes:
        owners = [impl for impl in impls if key in fields[impl]]
        if len(owners) < len(impls):
            lacking = sorted({COMMANDS[impl][0] for impl in impls if impl not in owners})
            raise ValueError(f"--grid {key}: {' and '.join(lacking)} has no --{key}")
        if any(fields[impl][key] is bool for impl in impls):
            bool_flags.add(key)
    for axis in axes:
        for key, value in axis:
            if key in bool_flags and value.lower() not in ("true", "false"):
                raise ValueError(f"--grid {key}={value}: --{key} is a switch; give True,False")
    # values as values: 3e-4 and 0.0003 are one configuration, in one folder
    axes = [[(key, as_value(key, value, fields[impls[0]][key])) for key, value in axis] for axis in axes]
    for axis in axes:
        if len({value for _, value in axis}) < len(axis):
            raise ValueError(f"--grid {axis[0][0]}: {', '.join(v for _, v in axis)} repeat a value")
    configs = []
    for impl in impls:
        for combination in itertools.product(*axes):
            config = dict(combination)
            configs.append(("__".join([impl, *(f"{k}={v}" for k, v in config.items())]), impl, config))
    return configs, bool_flags


def as_value(key: str, value: str, kind: type) -> str:
    """A grid value written one way for its flag's type: a float as Python writes it (0.0003), an int as an int,
    a switch as True or False; other values as given."""
    try:
        if kind is float:
            return repr(float(value))
        if kind is int:
            return str(int(value))
    except ValueError:
        raise ValueError(
            f"--grid {key}={value}: --{key} takes {'a number' if kind is float else 'an integer'}"
        ) from None
    if kind is bool:
        return "True" if value.lower() == "true" else "False"
    return value


def trainer_fields(impls: list[str]) -> dict[str, dict[str, type]]:
    """{impl: {flag: type}} of the trainers' Args dataclasses (for --grid)."""
    import dataclasses
    import importlib
    import typing

    sys.path.insert(0, REPO)
    import checkpoints

    fields = {}
    for impl in impls:
        module = importlib.import_module(COMMANDS[impl][0].removesuffix(".py"))
        hints = typing.get_type_hints(module.Args, include_extras=False)
        # the computed fields (batch size and the like) are no flags: the script sets them from the others
        computed = checkpoints.computed_flags(module.Args)
        fields[impl] = {
            f.name.replace("_", "-"): hints[f.name] for f in dataclasses.fields(module.Args) if f.name not in computed
        }
    return fields


def config_flags(config: dict, bool_flags: set[str]) -> list[str]:
    """A configuration as the trainer's flags: --flag=value, or --flag / --no-flag for a switch."""
    flags = []
    for key, value in config.items():
        if key in bool_flags:
            flags.append(f"--{key}" if value.lower() == "true" else f"--no-{key}")
        else:
            flags.append(f"--{key}={value}")
    return flags


def use_quick_settings(cfg: argparse.Namespace) -> None:
    """--quick: one short Pendulum-v1 run of each implementation, in a temporary runs folder that main deletes."""
    cfg.envs = ["Pendulum-v1"]
    cfg.seeds = 1
    cfg.total_timesteps = 4096
    cfg.run = True
    cfg.num_steps = 1024
    cfg.num_minibatches = 8
    cfg.runs_root = os.path.join(tempfile.mkdtemp(prefix="learning_quick_"), "runs")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Ctrl-C (or kill -INT) stops the runs even when a parent started this with SIGINT ignored (nohup, `&` in a script)
    take_back_stop_signals()
    cfg = parse_args(argv)
    if cfg.quick:
        use_quick_settings(cfg)
    try:
        if cfg.run:
            run_missing(cfg)
        else:  # report only: the runs read are checked as --run would check them before reusing them
            cfg.unfinished = [run for run in missing_runs(cfg) if run[-1] != "new"]
        curves, rows = summarize_runs(cfg)
    finally:
        if cfg.quick:
            shutil.rmtree(os.path.dirname(cfg.runs_root), ignore_errors=True)
    if not rows:
        raise SystemExit(f"learning.py: error: no runs found under {os.path.join(cfg.runs_root, cfg.group)}")

    os.makedirs(cfg.out_dir, exist_ok=True)
    lines = report_lines(rows, cfg, display_command([os.path.abspath(__file__), *argv]))
    with open(os.path.join(cfg.out_dir, f"{cfg.name}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot_grid(curves, cfg, os.path.join(cfg.out_dir, f"{cfg.name}_grid.png"))
    plot_curves(curves, cfg, os.path.join(cfg.out_dir, f"{cfg.name}.png"))
    written = relative_to_cwd(os.path.join(cfg.out_dir, f"{cfg.name}.md"))
    print(f"wrote {written}, {cfg.name}.png and {cfg.name}_grid.png", file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as e:
        sys.exit(f"learning.py: error: {e}")
    except KeyboardInterrupt:
        print(
            "learning.py: interrupted; the finished runs are kept: the same command trains what is missing",
            file=sys.stderr,
        )
        sys.exit(130)
