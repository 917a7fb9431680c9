"""Env steps/s of our PPO, Stable-Baselines3 PPO, RLlib PPO, CleanRL's script and the raw environment, in one run.

    python benchmarks/throughput.py                 # HalfCheetah-v5 and Hopper-v5, 100k steps, 1 repeat
    python benchmarks/throughput.py --quick         # smoke test: HalfCheetah-v5, 4096 steps
    python benchmarks/throughput.py --impls ppo rllib                 # RLlib from benchmarks/.venv-rllib
    python benchmarks/throughput.py --impls ppo cleanrl --cleanrl-script PATH/ppo_continuous_action.py

Writes <out-dir>/throughput.md (table plus how it was measured) and <out-dir>/throughput.png (--name changes the
name), and prints the table.
The default <out-dir> is a new folder benchmarks/results/local/<UTC date-time>/, which git ignores;
--update-committed writes into benchmarks/results/ instead (the tables the README quotes).

Measured per env and repeat, implementations interleaved (raw, ppo, sb3, raw, ppo, sb3, ...) to spread machine noise:
  raw      the random-action step loop of one gym.make env, in this process (the ceiling any learner can reach);
  ppo      ppo_continuous.py as a subprocess in a fresh temporary working directory;
  ppo_plain, ppo_relu, ppo_third_layer, ppo_dual_clip, ppo_huber
           the same with --no-fast-path, and on copies of the code with ReLU for tanh, a third hidden layer, dual-clip
           PPO or a Huber value loss in gae.ppo_loss (benchmarks/edits.py): what a researcher's edit costs;
  sb3      benchmarks/sb3_ppo.py the same way;
  dppo_sync, dppo_async
           dppo_ray.py with --num-actors actors, each sampling num_steps / actors steps (same batch);
  rllib    benchmarks/rllib_ppo.py with the python of its own venv (--rllib-python, default
           benchmarks/.venv-rllib/bin/python; how to create it: below);
  cleanrl  CleanRL's own ppo_continuous_action.py (not part of this repo: --cleanrl-script PATH) with the python of
           its own venv (--cleanrl-python, default benchmarks/.venv-cleanrl/bin/python; how to create it: below),
           with OMP_NUM_THREADS=1 as in CleanRL's own benchmark, on the -v4 version of a -v5 env (CleanRL's
           gymnasium 0.29.1 has no v5 MuJoCo envs).
Whole-process steps/s = env steps actually run / wall time of the whole subprocess (interpreter start, imports, env
creation, training, saving). In-loop steps/s = the implementation's own rate for its training loop. Median of repeats.

Adding an implementation: write a function (env_id, seed, cfg) -> Result and put it in IMPLS; for a script whose CLI
looks like ppo_continuous.py's (writes runs/<run-name>/summary.json) that is a call of `run_summary_script`.
throughput_report.py writes the results file and the plot; common.py holds what scaling.py and learning.py share.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

from common import (
    REPO,
    VENVS,
    BenchError,
    HelpFormatter,
    add_output_args,
    json_result,
    resolve_out_dir,
    timed_subprocess,
    venv_python,
    venvs_epilog,
)
from edits import edited_copy
from throughput_report import results_header, write_report

from run_record import first_line  # common put the repository on the path

PROG = "throughput.py"

QUICK = {"envs": ["HalfCheetah-v5"], "total_timesteps": 4096, "repeats": 1, "num_steps": 1024, "num_minibatches": 16}
DEFAULTS = {
    "envs": ["HalfCheetah-v5", "Hopper-v5"],
    "total_timesteps": 100_000,
    "repeats": 1,
    "num_steps": 2048,
    "num_minibatches": 32,
}
RAW_MAX_STEPS = 100_000  # the raw loop is only a ceiling; more steps add time, not precision


@dataclass
class Result:
    steps: int
    whole_seconds: float | None  # wall time of the whole process; None when not a separate process (raw)
    inloop_sps: float  # the implementation's own steps/s of its step/training loop
    env_run: str | None = None  # the env id actually run, where it differs from the one asked for (cleanrl: -v4)

    @property
    def whole_sps(self) -> float | None:
        return None if self.whole_seconds is None else self.steps / self.whole_seconds


def common_flags(env_id: str, seed: int, cfg: argparse.Namespace) -> list[str]:
    """Flags both ppo_continuous.py and sb3_ppo.py accept under the same name and meaning.

    Everything else that differs in default between the two scripts is set explicitly per implementation below, so
    the two run the same algorithm: see `PPO_FLAGS` and `SB3_FLAGS`."""
    return [
        f"--env-id={env_id}",
        f"--seed={seed}",
        f"--total-timesteps={cfg.total_timesteps}",
        f"--num-steps={cfg.num_steps}",
        f"--num-minibatches={cfg.num_minibatches}",
        "--update-epochs=10",
        "--learning-rate=0.0003",
        "--anneal-lr",
        "--gamma=0.99",
        "--gae-lambda=0.95",
        "--clip-coef=0.2",
        "--ent-coef=0.0",
        "--max-grad-norm=0.5",
        "--torch-threads=1",
    ]


# Value loss: ours is 0.5 * MSE * vf_coef, SB3's is MSE * vf_coef, so 0.5 here equals 0.25 there. Both clip the value
# loss (CleanRL's default). SB3 is hard-wired to the CPU, so ours is kept there too.
# --num-envs is not common: dppo_ray.py has --num-actors and --num-envs-per-actor instead.
PPO_FLAGS = ["--num-envs=1", "--vf-coef=0.5", "--clip-vloss", "--no-cuda", "--quiet"]
SB3_FLAGS = ["--num-envs=1", "--vf-coef=0.25", "--clip-vloss"]


def run_summary_script(
    name: str, script: str, env_id: str, seed: int, cfg, extra: list[str], num_actors: int | None = None
) -> Result:
    """A script with ppo_continuous.py's conventions: --run-name NAME writes runs/NAME/summary.json (in its cwd) with
    env_steps and wall_time_seconds (the training loop's wall time). With `num_actors` (dppo_ray.py), each actor
    samples num_steps / num_actors steps, so the batch, minibatches and epochs stay those of the others."""
    flags = common_flags(env_id, seed, cfg)
    if num_actors is not None:
        flags = [f for f in flags if not f.startswith("--num-steps=")]
        flags += [f"--num-steps={cfg.num_steps // num_actors}", f"--num-actors={num_actors}"]
    with tempfile.TemporaryDirectory(prefix=f"tp_{name}_") as cwd:
        run_name = f"{name}_{env_id}_{seed}"
        argv = [os.path.join(REPO, script), *flags, f"--run-name={run_name}", *extra]
        _, seconds = timed_subprocess(name, argv, cwd)
        path = os.path.join(cwd, "runs", run_name, "summary.json")
        try:
            with open(path) as f:
                summary = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise BenchError(f"{name} wrote no readable runs/{run_name}/summary.json: {e}") from None
    steps = int(summary["env_steps"])
    return Result(steps=steps, whole_seconds=seconds, inloop_sps=steps / float(summary["wall_time_seconds"]))


def run_ppo(env_id: str, seed: int, cfg) -> Result:
    return run_summary_script("ppo", "ppo_continuous.py", env_id, seed, cfg, PPO_FLAGS)


def run_ppo_plain(env_id: str, seed: int, cfg) -> Result:
    """ppo_continuous.py with --no-fast-path: torch acting, autograd and torch.optim.Adam."""
    return run_summary_script("ppo_plain", "ppo_continuous.py", env_id, seed, cfg, [*PPO_FLAGS, "--no-fast-path"])


def run_edited_ppo(edit: str, env_id: str, seed: int, cfg) -> Result:
    """ppo_continuous.py with one of edits.py's research edits, made to a copy of the code."""
    with tempfile.TemporaryDirectory(prefix=f"tp_{edit}_") as parent:
        script = str(edited_copy(parent, edit) / "ppo_continuous.py")
        return run_summary_script(f"ppo_{edit}", script, env_id, seed, cfg, PPO_FLAGS)


def run_ppo_relu(env_id: str, seed: int, cfg) -> Result:
    return run_edited_ppo("relu", env_id, seed, cfg)


def run_ppo_third_layer(env_id: str, seed: int, cfg) -> Result:
    return run_edited_ppo("third_hidden_layer", env_id, seed, cfg)


def run_ppo_dual_clip(env_id: str, seed: int, cfg) -> Result:
    return run_edited_ppo("dual_clip", env_id, seed, cfg)


def run_ppo_huber(env_id: str, seed: int, cfg) -> Result:
    return run_edited_ppo("huber_value_loss", env_id, seed, cfg)


def run_sb3(env_id: str, seed: int, cfg) -> Result:
    with tempfile.TemporaryDirectory(prefix="tp_sb3_") as cwd:
        argv = [os.path.join(REPO, "benchmarks", "sb3_ppo.py"), *common_flags(env_id, seed, cfg), *SB3_FLAGS]
        stdout, seconds = timed_subprocess("sb3", argv, cwd)
    out = json_result("sb3", stdout)
    return Result(steps=int(out["timesteps_run"]), whole_seconds=seconds, inloop_sps=float(out["sps"]))


def run_raw(env_id: str, seed: int, cfg) -> Result:
    """Random actions (drawn beforehand, so only env.step/env.reset are timed) in one gym.make env."""
    import gymnasium as gym
    import numpy as np

    try:  # MuJoCo would otherwise write MUJOCO_LOG.TXT into the working directory
        import mujoco

        log_config = mujoco.MjLogConfig.get()
        log_config.logto_file = False
        log_config.set()
    except (ImportError, AttributeError):
        pass
    steps = min(cfg.total_timesteps, RAW_MAX_STEPS)
    try:
        env = gym.make(env_id)
    except Exception as e:  # gymnasium raises several kinds (NameNotFound, ImportError, ...)
        raise BenchError(f"raw: cannot make env '{env_id}': {first_line(e)}") from None
    space = env.action_space
    rng = np.random.default_rng(seed)
    actions = rng.uniform(space.low, space.high, size=(steps, *space.shape)).astype(space.dtype)
    env.reset(seed=seed)
    for action in actions[:100]:  # warm-up: first-call allocations, caches
        _, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            env.reset()
    env.reset()
    start = time.perf_counter()
    for action in actions:
        _, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            env.reset()
    seconds = time.perf_counter() - start
    env.close()
    return Result(steps=steps, whole_seconds=None, inloop_sps=steps / seconds)


DPPO_FLAGS = ["--num-envs-per-actor=1", "--vf-coef=0.5", "--clip-vloss", "--no-cuda", "--quiet"]


def run_dppo_sync(env_id: str, seed: int, cfg) -> Result:
    flags = [*DPPO_FLAGS, "--mode=sync"]
    return run_summary_script("dppo_sync", "dppo_ray.py", env_id, seed, cfg, flags, num_actors=cfg.num_actors)


def run_dppo_async(env_id: str, seed: int, cfg) -> Result:
    flags = [*DPPO_FLAGS, "--mode=async", "--max-policy-lag=2"]
    return run_summary_script("dppo_async", "dppo_ray.py", env_id, seed, cfg, flags, num_actors=cfg.num_actors)


def run_rllib(env_id: str, seed: int, cfg) -> Result:
    """RLlib PPO (benchmarks/rllib_ppo.py) in its own venv (--rllib-python, checked by `check_impl_inputs`), with
    --num-actors env runners and the same batch, minibatch size and epochs."""
    argv = [os.path.join(REPO, "benchmarks", "rllib_ppo.py"), f"--env-id={env_id}", f"--seed={seed}"]
    argv += [f"--total-timesteps={cfg.total_timesteps}", f"--num-env-runners={cfg.num_actors}"]
    argv += [f"--train-batch-size={cfg.num_steps}", f"--minibatch-size={cfg.num_steps // cfg.num_minibatches}"]
    argv += ["--num-epochs=10", "--torch-threads=1"]
    with tempfile.TemporaryDirectory(prefix="tp_rllib_") as cwd:
        stdout, seconds = timed_subprocess("rllib", argv, cwd, python=cfg.rllib_python)
    out = json_result("rllib", stdout)
    return Result(steps=int(out["total_timesteps"]), whole_seconds=seconds, inloop_sps=float(out["sps"]))


# CleanRL's ppo_continuous_action.py takes the common flags except --torch-threads (OMP_NUM_THREADS=1 instead, as in
# CleanRL's benchmark), with its defaults written out; its loss has ppo_continuous.py's 0.5 * MSE * vf_coef scale.
CLEANRL_FLAGS = ["--num-envs=1", "--vf-coef=0.5", "--clip-vloss", "--norm-adv", "--no-cuda", "--no-track"]


def cleanrl_env_id(env_id: str) -> str:
    """CleanRL's pinned gymnasium 0.29.1 has the v4 MuJoCo envs, not v5: HalfCheetah-v5 runs as HalfCheetah-v4."""
    return env_id.removesuffix("-v5") + "-v4" if env_id.endswith("-v5") else env_id


def parse_cleanrl_stdout(stdout: str, num_steps: int) -> tuple[int, float]:
    """(env steps, in-loop steps/s) from CleanRL's stdout: one `SPS: N` line per iteration of num_steps steps (1 env),
    N = global_step / time since its first env reset; the last one is the rate of the whole training loop."""
    rates = [line.split(":", 1)[1].strip() for line in stdout.splitlines() if line.startswith("SPS:")]
    if not rates:
        raise BenchError(f"cleanrl printed no 'SPS:' line; last output: {stdout.strip()[-200:]!r}")
    return len(rates) * num_steps, float(rates[-1])


def run_cleanrl(env_id: str, seed: int, cfg) -> Result:
    """CleanRL's own ppo_continuous_action.py (--cleanrl-script) in its own venv (--cleanrl-python)."""
    env_run = cleanrl_env_id(env_id)
    flags = [f for f in common_flags(env_run, seed, cfg) if not f.startswith("--torch-threads=")]
    argv = [cfg.cleanrl_script, *flags, *CLEANRL_FLAGS]
    with tempfile.TemporaryDirectory(prefix="tp_cleanrl_") as cwd:  # it writes runs/<run_name>/ into its cwd
        stdout, seconds = timed_subprocess(
            "cleanrl", argv, cwd, python=cfg.cleanrl_python, extra_env={"OMP_NUM_THREADS": "1"}
        )
    steps, sps = parse_cleanrl_stdout(stdout, cfg.num_steps)
    return Result(steps=steps, whole_seconds=seconds, inloop_sps=sps, env_run=None if env_run == env_id else env_run)


# name -> function(env_id, seed, cfg) -> Result. Runs in this order within each repeat. To add one, write such a
# function (run_summary_script covers scripts with ppo_continuous.py's conventions) and register it here.
IMPLS: dict[str, Callable[[str, int, argparse.Namespace], Result]] = {
    "raw": run_raw,
    "ppo": run_ppo,
    "ppo_plain": run_ppo_plain,
    "ppo_relu": run_ppo_relu,
    "ppo_third_layer": run_ppo_third_layer,
    "ppo_dual_clip": run_ppo_dual_clip,
    "ppo_huber": run_ppo_huber,
    "sb3": run_sb3,
    "dppo_sync": run_dppo_sync,
    "dppo_async": run_dppo_async,
    "rllib": run_rllib,
    "cleanrl": run_cleanrl,
}
DEFAULT_IMPLS = ["raw", "ppo", "sb3", "dppo_sync", "dppo_async"]


def check_impl_inputs(cfg: argparse.Namespace) -> None:
    """Before anything runs: the venvs and files the chosen implementations need. Raises BenchError (one line)."""
    if "rllib" in cfg.impls:
        cfg.rllib_python = venv_python("rllib", cfg.rllib_python)
    if "cleanrl" in cfg.impls:
        if not cfg.cleanrl_script:
            raise BenchError(
                "cleanrl needs --cleanrl-script PATH, your copy of CleanRL's cleanrl/ppo_continuous_action.py "
                "(github.com/vwxyzjn/cleanrl; this repository does not ship it)"
            )
        if not os.path.isfile(cfg.cleanrl_script):
            raise BenchError(f"cleanrl: --cleanrl-script {cfg.cleanrl_script} does not exist")
        cfg.cleanrl_script = os.path.abspath(cfg.cleanrl_script)
        cfg.cleanrl_python = venv_python("cleanrl", cfg.cleanrl_python)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__,
        formatter_class=HelpFormatter,
        epilog=venvs_epilog(list(VENVS)) + "\nsb3 runs in the main venv (pip install -r benchmarks/requirements.txt).",
    )
    p.add_argument("--envs", nargs="+", default=None, help=f"env ids (default: {' '.join(DEFAULTS['envs'])})")
    p.add_argument("--total-timesteps", type=int, default=None, help="per learner run (default: 100000)")
    p.add_argument("--repeats", "--seeds", dest="repeats", type=int, default=None, help="seeds 1..N (default: 1)")
    p.add_argument("--num-steps", type=int, default=None, help="rollout length, all learners (default: 2048)")
    p.add_argument("--num-minibatches", type=int, default=None, help="all learners (default: 32)")
    p.add_argument(
        "--num-actors",
        type=int,
        default=2,
        help="dppo_ray.py actors (each samples num_steps / actors), and RLlib env runners (default: 2)",
    )
    p.add_argument(
        "--rllib-python",
        default=None,
        metavar="PYTHON",
        help="python of the RLlib venv (default: benchmarks/.venv-rllib/bin/python in this repository)",
    )
    p.add_argument(
        "--cleanrl-script",
        default=None,
        metavar="PATH",
        help="your copy of CleanRL's cleanrl/ppo_continuous_action.py (needed by --impls cleanrl; not in this repo)",
    )
    p.add_argument(
        "--cleanrl-python",
        default=None,
        metavar="PYTHON",
        help="python of the CleanRL venv (default: benchmarks/.venv-cleanrl/bin/python in this repository)",
    )
    p.add_argument(
        "--impls",
        nargs="+",
        default=DEFAULT_IMPLS,
        choices=list(IMPLS),
        help=f"in run order (default: {' '.join(DEFAULT_IMPLS)})",
    )
    add_output_args(p, "<name>.md and <name>.png")
    p.add_argument(
        "--name",
        default="throughput",
        help="file name of the table and plot, without extension (default: throughput; benchmarks/results' DPPO "
        "table is throughput_dppo)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: HalfCheetah-v5, 4096 steps, --num-steps 1024 --num-minibatches 16, "
        "1 repeat; flags given explicitly still win",
    )
    args = p.parse_args(argv)
    for key, default in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, default)
    if args.repeats < 1 or args.total_timesteps < 1:
        p.error("--repeats and --total-timesteps must be positive")
    if args.total_timesteps < args.num_steps:
        p.error(f"--total-timesteps {args.total_timesteps} is less than one rollout (--num-steps {args.num_steps})")
    if args.num_steps % args.num_minibatches:
        p.error(f"--num-minibatches {args.num_minibatches} does not divide --num-steps {args.num_steps}")
    if not args.name or os.sep in args.name or "/" in args.name:
        p.error(f"--name {args.name!r} must be a plain file name")
    args.impls = list(dict.fromkeys(args.impls))
    args.out_dir = resolve_out_dir(args)
    return args


def run_all(cfg: argparse.Namespace, t0: float) -> list[tuple[str, str, int, Result]]:
    """(env_id, impl, seed, Result) of every run: seeds outermost, so that each repeat interleaves the
    implementations and machine noise falls on all of them alike."""
    runs = []
    for seed, env_id, impl in itertools.product(range(1, cfg.repeats + 1), cfg.envs, cfg.impls):
        print(f"[{time.perf_counter() - t0:6.0f}s] {env_id} {impl} seed {seed} ...", file=sys.stderr)
        runs.append((env_id, impl, seed, IMPLS[impl](env_id, seed, cfg)))
    return runs


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cfg = parse_args(argv)
    try:
        check_impl_inputs(cfg)
    except BenchError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    header, machine = results_header([os.path.abspath(__file__), *argv], cfg)
    t0 = time.perf_counter()
    try:
        runs = run_all(cfg, t0)
    except BenchError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    elapsed = time.perf_counter() - t0
    write_report(cfg, runs, header, machine, elapsed, raw_steps=min(cfg.total_timesteps, RAW_MAX_STEPS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
