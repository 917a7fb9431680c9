"""--num-seeds against single runs started by hand: wall time, the launcher's memory, and each seed's return.

    python benchmarks/num_seeds.py                  # HalfCheetah-v5, 8 seeds of 40,960 steps, 3 rounds: about 6 min
    python benchmarks/num_seeds.py --quick          # smoke test: Pendulum-v1, 2 seeds of 2,048 steps, 1 round, eager

Four ways, each a whole process (or processes) in a fresh working folder, alternated in every round (the machine's
load drifts alike for all of them), after one untimed run that fills torch.compile's cache (warm start, as every run
after a researcher's first):
  --num-seeds N          ppo_continuous.py --num-seeds N (its seeds --seed-processes at a time: the cores);
  N by hand              N single runs --seed 1..N, as many at a time as there are cores, the next as one ends;
  --num-seeds 2          two seeds;
  one seed               the single run --seed 1.
Reports each way's wall time (median, least, most over the rounds), the ratios the launcher is judged by (N seeds
against N by hand, two seeds against one), the launcher process's own peak memory (VmHWM, its seeds not counted), and
each seed's final return (summary.json) in each way, with whether every seed's return equals its single run's. Writes
the table to --out (default: printed only).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import statistics
import subprocess
import sys
import tempfile
import time

from common import REPO, print_report

from run_record import final_return, run_summary  # common put the repository on the path

SCRIPT = os.path.join(REPO, "ppo_continuous.py")


def flags(cfg: argparse.Namespace) -> list[str]:
    """Every run's flags, in every way (--quick's runs are eager: a smoke test has no compile worth warming)."""
    every = ["--env-id", cfg.env_id, "--total-timesteps", str(cfg.total_timesteps), "--quiet", "--checkpoint-every=0"]
    return every + (["--no-compile"] if cfg.quick else [])


def peak_memory_mib(pid: int) -> float | None:
    """VmHWM of a live process, in MiB (None once it has gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def launch(cfg: argparse.Namespace, folder: str, count: int) -> tuple[float, float | None]:
    """ppo_continuous.py --num-seeds `count` in `folder`: its wall time, and its own peak memory (polled until it
    ends)."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, SCRIPT, *flags(cfg), "--num-seeds", str(count), "--run-name", "t"],
        cwd=folder,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    peak = None
    while proc.poll() is None:
        peak = peak_memory_mib(proc.pid) or peak
        time.sleep(0.05)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"num_seeds.py: error: --num-seeds {count} failed: {proc.stderr.read()[-500:]}")
    return seconds, peak


def by_hand(cfg: argparse.Namespace, folder: str, seeds: list[int], at_once: int) -> float:
    """Single runs of `seeds`, `at_once` at a time, the next started as one ends: their wall time."""
    start = time.perf_counter()
    waiting, running = list(seeds), []
    while waiting or running:
        while waiting and len(running) < at_once:
            seed = waiting.pop(0)
            command = [sys.executable, SCRIPT, *flags(cfg), "--seed", str(seed), "--run-name", f"t__{seed}"]
            running.append(subprocess.Popen(command, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        done = next((p for p in running if p.poll() is not None), None)
        if done is None:
            time.sleep(0.05)
            continue
        running.remove(done)
        if done.returncode != 0:
            raise SystemExit("num_seeds.py: error: a single run failed")
    return time.perf_counter() - start


def final_returns(folder: str, seeds: list[int]) -> list[float]:
    """Each seed's final return (its summary.json's), once every seed has completed."""
    returns = []
    for seed in seeds:
        summary = run_summary(os.path.join(folder, "runs", f"t__{seed}"))
        if summary.get("status") != "completed":
            raise SystemExit(f"num_seeds.py: error: seed {seed} ended {summary.get('status', 'without a summary')}")
        returns.append(final_return(summary))
    return returns


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="num_seeds.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--env-id", default="HalfCheetah-v5")
    p.add_argument("--seeds", type=int, default=8, help="seeds 1..N (default: 8)")
    p.add_argument("--total-timesteps", type=int, default=40_960, help="per seed (default: 40960)")
    p.add_argument("--repeats", type=int, default=3, help="rounds, each running every way once (default: 3)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: Pendulum-v1, 2 seeds of 2,048 steps, 1 round, --no-compile (no compile to warm up)",
    )
    p.add_argument("--out", default=None, help="also write the table to this file")
    cfg = p.parse_args(argv)
    if cfg.quick:
        cfg.env_id, cfg.seeds, cfg.total_timesteps, cfg.repeats = "Pendulum-v1", 2, 2048, 1
    seeds = list(range(1, cfg.seeds + 1))
    cores = len(os.sched_getaffinity(0))
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if not cfg.quick:
        with tempfile.TemporaryDirectory() as folder:  # one untimed run: torch.compile's cache is warm for all ways
            warm = [sys.executable, SCRIPT, *flags(cfg), "--run-name", "warm"]
            subprocess.run(warm, cwd=folder, check=True, stdout=subprocess.DEVNULL)
    ways = list(dict.fromkeys([f"--num-seeds {cfg.seeds}", f"{cfg.seeds} by hand", "--num-seeds 2", "one seed"]))
    seconds: dict[str, list[float]] = {way: [] for way in ways}
    returns: dict[str, list[float]] = {}
    peaks: list[float] = []
    for _ in range(cfg.repeats):
        for way in ways:
            with tempfile.TemporaryDirectory() as folder:
                if way == "one seed":
                    seconds[way].append(by_hand(cfg, folder, [1], 1))
                    returns[way] = final_returns(folder, [1])
                elif way.endswith("by hand"):
                    seconds[way].append(by_hand(cfg, folder, seeds, cores))
                    returns[way] = final_returns(folder, seeds)
                else:
                    count = int(way.split()[-1])
                    wall, peak = launch(cfg, folder, count)
                    seconds[way].append(wall)
                    peaks += [peak] if peak is not None else []
                    returns[way] = final_returns(folder, seeds[:count])
    median = {way: statistics.median(values) for way, values in seconds.items()}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    asked = f"--env-id {cfg.env_id} --seeds {cfg.seeds} --total-timesteps {cfg.total_timesteps} --repeats {cfg.repeats}"
    lines = [
        f"`python benchmarks/num_seeds.py {'--quick' if cfg.quick else asked}`, started {started} at "
        f"{commit.stdout.strip() or 'an unknown commit'}, {cores} cores, torch {importlib.metadata.version('torch')}, "
        f"Python {sys.version.split()[0]}; {'eager (--no-compile)' if cfg.quick else 'warm compile cache'}, the ways "
        "alternated in each round:",
        "",
        "| way | wall time, median | least | most | " + " | ".join(f"seed {s} return" for s in seeds) + " |",
        "|---|--:|--:|--:|" + "--:|" * len(seeds),
    ]
    for way in ways:
        cells = [f"{value:.1f}" for value in returns[way]] + [""] * (len(seeds) - len(returns[way]))
        lines.append(
            f"| {way} | {median[way]:.1f} s | {min(seconds[way]):.1f} s | {max(seconds[way]):.1f} s | "
            + " | ".join(cells)
            + " |"
        )
    single = returns[f"{cfg.seeds} by hand"]
    same = all(returns[way] == single[: len(returns[way])] for way in ways)
    lines += [
        "",
        f"- --num-seeds {cfg.seeds} against {cfg.seeds} single runs by hand ({cores} at a time): "
        f"{median[ways[0]] / median[ways[1]]:.3f}x the wall time (medians).",
        f"- --num-seeds 2 against one seed: {median['--num-seeds 2'] / median['one seed']:.3f}x.",
        f"- The launcher's own peak memory (VmHWM; its seeds are processes of their own): {max(peaks):.0f} MiB at most."
        if peaks
        else "- The launcher's peak memory could not be read (no /proc).",
        f"- Every seed's final return equals its single run's: {'yes' if same else 'NO'}.",
    ]
    print_report(lines, cfg.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
