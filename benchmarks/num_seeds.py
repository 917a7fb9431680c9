"""Seeds in one process against one process per seed: wall time and returns, on one machine, in one run.

    python benchmarks/num_seeds.py                       # HalfCheetah-v5, 4 seeds of 1M steps: about 25 min on 2 cores
    python benchmarks/num_seeds.py --quick               # smoke test: 2 seeds of 4,096 steps

Three ways to train seeds 1..N of ppo_continuous.py at CleanRL's defaults, each in a fresh working directory:
  together       one process, --num-seeds N;
  two at a time  one process per seed, two running at once;
  one at a time  one process per seed, one after another.
Reports each way's wall time (whole processes) and each seed's final return (summary.json: the mean return of its last
episodes), and compares the returns of "together" with those of the single runs as samples (MuJoCo amplifies float
rounding, so a seed trained together is not the same run as its single run): the difference in means with Welch's
95% interval. Writes the table to --out (default: printed only).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
from learning_report import permutation_floor, permutation_pvalue, welch_interval

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "ppo_continuous.py")


def command(cfg: argparse.Namespace, extra: list[str]) -> list[str]:
    flags = ["--env-id", cfg.env_id, "--total-timesteps", str(cfg.total_timesteps), "--quiet"]
    return [sys.executable, SCRIPT, *flags, *extra]


def final_returns(folder: str, names: list[str]) -> list[float]:
    returns = []
    for name in names:
        with open(os.path.join(folder, "runs", name, "summary.json")) as f:
            summary = json.load(f)
        if summary["status"] != "completed":
            raise SystemExit(f"num_seeds.py: error: run {name} ended {summary['status']}")
        returns.append(summary["mean_return_last_episodes"])
    return returns


def run_together(cfg: argparse.Namespace, seeds: list[int]) -> tuple[float, list[float]]:
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        extra = ["--seed", str(seeds[0]), "--num-seeds", str(len(seeds)), "--run-name", "t"]
        subprocess.run(command(cfg, extra), cwd=folder, check=True, capture_output=True)
        return time.perf_counter() - start, final_returns(folder, [f"t__{seed}" for seed in seeds])


def run_apart(cfg: argparse.Namespace, seeds: list[int], at_once: int) -> tuple[float, list[float]]:
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        for first in range(0, len(seeds), at_once):
            batch = seeds[first : first + at_once]
            processes = [
                subprocess.Popen(
                    command(cfg, ["--seed", str(seed), "--run-name", f"s{seed}"]),
                    cwd=folder,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                for seed in batch
            ]
            if any(process.wait() != 0 for process in processes):
                raise SystemExit("num_seeds.py: error: a single run failed")
        return time.perf_counter() - start, final_returns(folder, [f"s{seed}" for seed in seeds])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="num_seeds.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--env-id", default="HalfCheetah-v5")
    p.add_argument("--seeds", type=int, default=4, help="seeds 1..N (default: 4)")
    p.add_argument("--total-timesteps", type=int, default=1_000_000, help="per seed (default: 1000000)")
    p.add_argument("--quick", action="store_true", help="smoke test: 2 seeds of 4,096 steps")
    p.add_argument("--out", default=None, help="also write the table to this file")
    cfg = p.parse_args(argv)
    if cfg.quick:
        cfg.seeds, cfg.total_timesteps = 2, 4096
    seeds = list(range(1, cfg.seeds + 1))
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    ways = {
        "together (--num-seeds)": run_together(cfg, seeds),
        "two at a time": run_apart(cfg, seeds, 2),
        "one at a time": run_apart(cfg, seeds, 1),
    }
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    lines = [
        f"`python benchmarks/num_seeds.py --env-id {cfg.env_id} --seeds {cfg.seeds} --total-timesteps "
        f"{cfg.total_timesteps}`, started {started} at {commit.stdout.strip() or 'an unknown commit'}, "
        f"{os.cpu_count()} cores, torch {torch.__version__}, Python {sys.version.split()[0]}:",
        "",
        "| way | wall time | " + " | ".join(f"seed {seed} return" for seed in seeds) + " | mean |",
        "|---|--:|" + "--:|" * len(seeds) + "--:|",
    ]
    for way, (seconds, returns) in ways.items():
        cells = " | ".join(f"{value:.0f}" for value in returns)
        lines.append(f"| {way} | {seconds:.0f} s | {cells} | {np.mean(returns):.0f} |")
    together = ways["together (--num-seeds)"][1]
    single = ways["one at a time"][1]  # the same runs as two at a time (a single run is deterministic on one machine)
    low, high = welch_interval(together, single)
    lines += [
        "",
        "Returns together minus the single runs (one at a time): "
        f"{np.mean(together) - np.mean(single):+.0f}, Welch 95% interval {low:+.0f} to {high:+.0f}; exact two-sided "
        f"permutation p = {permutation_pvalue(together, single):.3f} ({len(together)} + {len(single)} seeds, one task: "
        f"the least p possible is {permutation_floor(len(together), len(single)):.3f}).",
    ]
    print("\n".join(lines))
    if cfg.out:
        with open(cfg.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
