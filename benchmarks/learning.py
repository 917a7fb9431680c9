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
--run trains what is missing: on this machine with launcher.Launch, as --num-seeds runs its seeds (each run's lines
behind its name and in its folder's output.log; Ctrl-C passed on once, each run saving a checkpoint), --jobs
single-process runs (ppo, sb3) at a time, then each DPPO run alone; with --ray-address, every run at once as a Ray task
on a cluster's nodes, each run's folder coming back here (ray_cluster.run_on_cluster). --grid makes configurations of
the trainers' flags; each is a row of the tables. --python runs ppo and DPPO in another venv's interpreter:
dm_control's envs need mujoco 3.x, in the venv that benchmarks/requirements-dm_control.txt describes. This file trains;
learning_report.py reads the runs and writes the tables and plots.
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

from common import (
    REPO,
    BenchError,
    HelpFormatter,
    add_output_args,
    display_command,
    relative_to_cwd,
    resolve_out_dir,
    subprocess_env,
)
from learning_report import TARGETS, plot_curves, plot_grid, read_curve, report_lines, summarize_runs

# common put the repository on the path
from command_line import LaunchError, command_flags, grid_configurations
from launcher import Ended, Launch, Seed
from ray_cluster import ClusterError, cluster_job, run_on_cluster
from run_record import file_sha256, last_line
from stop_signals import take_back_stop_signals

# The trainers --run starts besides SB3: script and flags, from the repository root.
COMMANDS = {
    "ppo": ["ppo_continuous.py"],
    "dppo_sync": ["dppo_ray.py", "--mode=sync"],
    "dppo_async": ["dppo_ray.py", "--mode=async"],
}


# What a run's first line says, for each status of run_status
STARTS = {
    "new": "starts",
    "resume": "resumes from its checkpoint",
    "restart": "starts afresh: its folder has no checkpoint",
}


def run_missing(cfg: argparse.Namespace) -> None:
    """Train every run that is not done. Locally (run_here): --jobs single-process runs (ppo, sb3) at a time, then each
    DPPO run with the machine to itself (its actors and learner use every core). With --ray-address: all of them at
    once, as Ray tasks on the cluster (ray_cluster.run_on_cluster)."""
    missing = missing_runs(cfg)
    if cfg.ray_address:
        if cfg.storage:
            os.makedirs(cfg.runs_root, exist_ok=True)  # a node that does not see it refuses its runs
        jobs = [sweep_job(cfg, *run) for run in missing]
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
        if status == "restart":  # nothing of a half-finished run may mix with the new one's, its output.log included
            shutil.rmtree(folder)
        if impl == "sb3":
            command = [sys.executable, *sb3_argv(cfg, env_id, seed, folder, REPO)]  # SB3 runs in this venv
        else:
            command = [cfg.python, *trainer_argv(cfg, (label, impl, config, env_id, seed), folder, status, REPO)]
        run = Seed(seed, folder, [], note=STARTS[status], config=f"{label} on {env_id}", command=command)
        (distributed if impl.startswith("dppo") else single).append(run)
    os.environ.update(subprocess_env())  # the runs inherit it: sb3_ppo.py imports the repository's modules
    run_here([(single, cfg.jobs), (distributed, 1)], cwd=os.path.dirname(root))


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


def sweep_job(cfg: argparse.Namespace, label: str, impl: str, config: list, env_id: str, seed: int, status: str):
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
        flags = command_flags(config)
        cpus = int(flags.get("--num-actors") or 2) * float(flags.get("--actor-cpus") or 1) + 1  # actors, the learner
    else:
        cpus = 1
    return cluster_job(
        f"{label} on {env_id}, seed {seed}",
        run_name,
        argv["new"],
        argv["resume"],
        head_folder if resume_from_head else None,
        os.path.dirname(os.path.abspath(cfg.runs_root)) if cfg.storage else None,
        cfg.python if cfg.python_given else None,
        cpus,
    )


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
    argv += config
    argv.append(f"--run-name={os.path.join(cfg.group, label, f'{env_id}__{seed}')}")
    if status == "restart":
        argv.append("--overwrite")
    return argv


def run_here(phases: list[tuple[list[Seed], int]], cwd: str) -> None:
    """Each phase's runs (launcher.Seed, each with its whole command) in `cwd`, `parallel` at a time, the next phase
    once the last run of one has ended, with launcher.Launch: each run's lines behind its name, and in its folder's
    output.log. After a failure the other runs still finish (each is a long training run), then BenchError names the
    first; flags refused (exit 2 before the run made its folder) start nothing more. After Ctrl-C or SIGTERM, which
    Launch passes on to the running ones (each saves a checkpoint), nothing new starts and KeyboardInterrupt is raised:
    the same command resumes them."""
    ended: list[Ended] = []
    not_started: list[Seed] = []
    for runs, parallel in phases:
        if any(run.early_lines for run in ended):
            not_started += runs
            continue
        launch = Launch("learning.py", runs, parallel, quiet=not sys.stderr.isatty(), cwd=cwd)
        ended += launch.run()
        if launch.stop.signum is not None:
            raise KeyboardInterrupt
        not_started += launch.waiting
    for run in ended:  # Launch holds a refused run's lines: said here
        for line in run.early_lines:
            print(f"{run.seed.name}: {line}", file=sys.stderr)
    failed = [run.seed.name for run in ended if run.returncode != 0]
    if failed:
        count = len(ended) + len(not_started)
        unstarted = f"; {len(not_started)} did not start" if not_started else ""
        first = f"the first: {failed[0]} (its lines are above)"
        raise BenchError(f"{len(failed)} of {count} runs failed; {first}{unstarted}")


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
        cfg.configs = configurations(cfg.impls, cfg.grid)
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


def configurations(impls: list[str], grid: list[str]) -> list[tuple[str, str, list[str]]]:
    """[(label, impl, its flags)] for every implementation and combination of --grid's values, read as the launcher
    reads a --grid (launcher.grid_configurations, from each trainer's source). Labels: the impl alone without a grid,
    else e.g. ppo__learning-rate=0.0001__ent-coef=0.0 (each value written one way for its flag's type)."""
    if not grid:
        return [(impl, impl, []) for impl in impls]
    if "sb3" in impls:
        raise ValueError("--grid takes ppo_continuous.py and dppo_ray.py flags: leave sb3 out of --impls")
    unknown = [impl for impl in impls if impl not in COMMANDS]
    if unknown:
        raise ValueError(f"--grid takes the flags of {' '.join(COMMANDS)}, not of {' '.join(unknown)}")
    reserved = {flag: f"learning.py sets --{flag} itself, or it is not a setting to sweep" for flag in OWN_FLAGS}
    configs = []
    for impl in impls:
        try:
            combos = grid_configurations(grid, os.path.join(REPO, COMMANDS[impl][0]), reserved)
        except LaunchError as e:
            raise ValueError(str(e)) from None
        configs += [(f"{impl}__{label}", impl, flags) for label, flags in combos]
    return configs


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
