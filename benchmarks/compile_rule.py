"""The figures behind the compile rule (fast_paths.COMPILE_PAYS_AFTER_STEPS): what a cold build of the compiled gradient
costs, and what each compiled gradient step saves, whole process, on each env given.

    python benchmarks/compile_rule.py --envs HalfCheetah-v5 Pendulum-v1 --out benchmarks/results/compile_rule.md

Each round runs, per env, ppo_continuous.py with CleanRL's shape (1 env x 2048 steps, 10 epochs x 32 minibatches),
each run a whole process in a fresh working folder (startup.run_once): 2 iterations eager (--no-compile), 2 compiled
with an empty TORCHINDUCTOR_CACHE_DIR (cold), the same again with that cache (warm); then --long-iterations eager and
compiled (warm). From their wall times:
- the build's cost: cold minus eager, 2 iterations each (what a run after an edit of the gradient pays);
- the saving per iteration: the long runs' difference less the short runs', over the iterations between them;
- the gradient steps that repay a cold build: the build's cost over the saving per gradient step.
Run it with the machine to itself: the figures are seconds of wall time.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

from startup import REPO, machine, run_once

STEPS_PER_ITERATION = 10 * 32  # gradient steps at CleanRL's defaults: --update-epochs x --num-minibatches


def one_round(env_id: str, long_iterations: int) -> dict[str, float]:
    """Each run is startup.py's (a whole process in a fresh working folder, CleanRL's defaults but the length; modes
    no-compile, cold and warm: --compile with the round's cache, empty at first)."""
    short = argparse.Namespace(env_id=env_id, total_timesteps=2 * 2048, script=os.path.join(REPO, "ppo_continuous.py"))
    long = argparse.Namespace(**{**vars(short), "total_timesteps": long_iterations * 2048})
    cache = tempfile.mkdtemp(prefix="compile_rule_cache_")
    try:
        t = {
            "eager_2": run_once(short, "no-compile", cache)["wall"],
            "cold_2": run_once(short, "cold", cache)["wall"],
            "warm_2": run_once(short, "warm", cache)["wall"],
            "eager_long": run_once(long, "no-compile", cache)["wall"],
            "warm_long": run_once(long, "warm", cache)["wall"],
        }
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    t["build"] = t["cold_2"] - t["eager_2"]
    t["warm_load"] = t["warm_2"] - t["eager_2"]
    saved = (t["eager_long"] - t["eager_2"]) - (t["warm_long"] - t["warm_2"])
    t["saving_per_iteration"] = saved / (long_iterations - 2)
    per_step = t["saving_per_iteration"] / STEPS_PER_ITERATION
    t["saving_per_step_ms"] = 1000 * per_step
    t["steps_to_repay"] = t["build"] / per_step if per_step > 0 else float("inf")
    return t


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=["HalfCheetah-v5", "Pendulum-v1"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--long-iterations", type=int, default=12, help="the long run's iterations, more than 2")
    parser.add_argument("--out", default=None, help="a Markdown file for the table (default: print only)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.long_iterations <= 2:  # the saving per iteration is the long run's extra time over the 2-iteration run's
        parser.error(f"--long-iterations must be more than 2, got {args.long_iterations}")
    rows = {env_id: [] for env_id in args.envs}
    for round_index in range(args.rounds):
        for env_id in args.envs if round_index % 2 == 0 else reversed(args.envs):
            rows[env_id].append(one_round(env_id, args.long_iterations))
            print(env_id, {k: round(v, 3) for k, v in rows[env_id][-1].items()}, flush=True)
    keys = ["eager_2", "cold_2", "warm_2", "eager_long", "warm_long", "build", "warm_load", "saving_per_iteration"]
    keys += ["saving_per_step_ms", "steps_to_repay"]
    import torch
    from common import display_command, print_report
    from throughput_report import git_commit

    lines = [
        "`" + display_command([os.path.join(REPO, "benchmarks", "compile_rule.py"), *sys.argv[1:]]) + "`",
        "",
        f"{machine()}; Python {platform.python_version()}, torch {torch.__version__}; repo at {git_commit()}; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "",
        "| env | figure (s unless named) | per round | median |",
        "|---|---|---|---|",
    ]
    for env_id, results in rows.items():
        for key in keys:
            values = [r[key] for r in results]
            lines.append(
                f"| {env_id} | {key} | {', '.join(f'{v:.3g}' for v in values)} | {statistics.median(values):.3g} |"
            )
    print_report(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
