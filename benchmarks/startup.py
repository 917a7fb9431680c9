"""Start-up as a researcher meets it after every edit: a two-iteration run of ppo_continuous.py, timed as a whole
process, with torch's compile cache empty (cold), holding the graph (warm), and with --no-compile.

    python benchmarks/startup.py                       # HalfCheetah-v5, 4,096 steps, 3 rounds
    python benchmarks/startup.py --quick               # smoke test: Pendulum-v1, one round, no cold run
    python benchmarks/startup.py --script my_ppo.py    # an edited copy (its first run after the edit is the cold one)

A round runs each mode once, one after another, so that a load that comes and goes falls on every mode alike.
- cold: --compile (a run this short trains eagerly by default: fast_paths.compile_pays), with a new, empty
  TORCHINDUCTOR_CACHE_DIR. Inductor's precompiled headers live outside it (under the system's
  temporary folder) and are kept: they depend on torch and the C++ compiler, not on the code, so an edit does not
  rebuild them. The very first compile on a machine also builds them; that run is not one of these.
- warm: --compile, with the cache the round's cold run filled.
- no-compile: --no-compile, the eager gradient.
Reports, per mode, the wall time (median, least and most over the rounds), the CPU time of the process and of every
child it waited for (inductor's C++ builds included), and the peak resident memory of the largest of them.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("cold", "warm", "no-compile")


def run_once(cfg: argparse.Namespace, mode: str, cache_dir: str) -> dict:
    """One whole process in a fresh working directory: its wall time, CPU time and peak memory (os.wait4's rusage,
    which counts the children it waited for)."""
    flags = ["--env-id", cfg.env_id, "--total-timesteps", str(cfg.total_timesteps), "--quiet", "--run-name", "s"]
    flags += ["--checkpoint-every", "0", "--no-compile" if mode == "no-compile" else "--compile"]
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache_dir)
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        process = subprocess.Popen(
            [sys.executable, os.path.abspath(cfg.script), *flags],
            cwd=folder,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        stderr = process.stderr.read()
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"startup.py: error: the {mode} run failed: {stderr.decode(errors='replace')[-600:]}")
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "peak_mib": usage.ru_maxrss / 1024}


def summary_row(mode: str, runs: list[dict]) -> str:
    walls = [run["wall"] for run in runs]
    cpu = statistics.median(run["cpu"] for run in runs)
    peak = max(run["peak_mib"] for run in runs)
    return (
        f"| {mode} | {statistics.median(walls):.2f} | {min(walls):.2f} | {max(walls):.2f} | {cpu:.2f} | {peak:.0f} | "
        + ", ".join(f"{w:.2f}" for w in walls)
        + " |"
    )


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{model}, {os.cpu_count()} CPUs"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env-id", default="HalfCheetah-v5")
    p.add_argument("--total-timesteps", type=int, default=4096, help="4,096: two iterations at CleanRL's defaults")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--script", default=os.path.join(REPO, "ppo_continuous.py"), help="the script (or an edited copy)")
    p.add_argument("--out", help="also write the table to this markdown file")
    p.add_argument("--quick", action="store_true", help="Pendulum-v1, 2,048 steps, one round, warm and no-compile")
    cfg = p.parse_args()
    if cfg.quick:
        cfg.env_id, cfg.total_timesteps, cfg.rounds, cfg.modes = "Pendulum-v1", 2048, 1, ["warm", "no-compile"]
    if not os.path.isfile(cfg.script):
        p.error(f"no script at {cfg.script}")
    results: dict[str, list[dict]] = {mode: [] for mode in cfg.modes}
    for _ in range(cfg.rounds):
        cache_dir = tempfile.mkdtemp(prefix="startup_cache_")
        try:
            if "warm" in cfg.modes and "cold" not in cfg.modes:
                run_once(cfg, "cold", cache_dir)  # fills the cache the warm run loads
            for mode in cfg.modes:
                results[mode].append(run_once(cfg, mode, cache_dir))
        finally:
            shutil.rmtree(cache_dir, ignore_errors=True)
    import torch
    from common import display_command, print_report
    from throughput_report import git_commit

    lines = [
        "`" + display_command([os.path.join(REPO, "benchmarks", "startup.py"), *sys.argv[1:]]) + "`",
        "",
        f"{cfg.env_id}, {cfg.total_timesteps} steps, {cfg.rounds} rounds; {machine()}; Python "
        f"{platform.python_version()}, torch {torch.__version__}; script {os.path.basename(cfg.script)}; repo at "
        f"{git_commit()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "",
        "| mode | wall s (median) | least | most | CPU s (median, with children) | peak MiB | each round |",
        "|---|---|---|---|---|---|---|",
        *(summary_row(mode, runs) for mode, runs in results.items()),
    ]
    print_report(lines, cfg.out)


if __name__ == "__main__":
    main()
