"""throughput.py's results: the file's header (machine, versions), the table of medians, every run, and the plot."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import subprocess
import sys

from common import REPO, cpu_model, display_command, display_path, package_version, pyplot, relative_to_cwd

COLORS = {
    "raw": "#888888",
    "ppo": "#1f77b4",
    "sb3": "#ff7f0e",
    "dppo_sync": "#2ca02c",
    "dppo_async": "#d62728",
    "rllib": "#9467bd",
    "cleanrl": "#8c564b",
}
SPARE_COLORS = ["#e377c2", "#17becf", "#bcbd22", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]  # impls not in COLORS
# How each implementation's in-loop rate is measured, for the notes under the table.
INLOOP_NOTES = {
    "raw": "raw = the bare `env.step` loop in this process, the ceiling for any learner with one env",
    "ppo": "ppo_continuous.py `env_steps / wall_time_seconds` from summary.json",
    "ppo_plain": "the same, with --no-fast-path",
    "ppo_relu": "the same, on a copy with ReLU for tanh (benchmarks/edits.py)",
    "ppo_third_layer": "the same, on a copy with a third hidden layer (benchmarks/edits.py)",
    "ppo_dual_clip": "the same, on a copy with dual-clip PPO in gae.ppo_loss (benchmarks/edits.py)",
    "ppo_huber": "the same, on a copy with a Huber value loss in gae.ppo_loss (benchmarks/edits.py)",
    "sb3": "sb3_ppo.py `sps` (time of `model.learn`)",
    "dppo_sync": "dppo_ray.py `env_steps / wall_time_seconds` from summary.json",
    "dppo_async": "dppo_ray.py `env_steps / wall_time_seconds` from summary.json",
    "rllib": "rllib_ppo.py `sps` (its sampling-and-training loop)",
    "cleanrl": "CleanRL's last `SPS:` line (global_step / time since its first env reset)",
}
# The packages whose versions the header records for a comparison venv, which has its own pins.
VENV_PACKAGES = {
    "rllib": ["ray", "torch", "gymnasium", "mujoco", "numpy"],
    "cleanrl": ["torch", "gymnasium", "mujoco", "numpy", "tyro"],
}


def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine_header(argv: list[str]) -> tuple[list[str], str]:
    """(markdown header lines, a short machine description for the plot title)"""
    import gymnasium
    import torch

    cpu = cpu_model()
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    if torch.cuda.is_available():
        gpu = f"GPU: {torch.cuda.get_device_name(0)} (not used: every learner runs on the CPU)"
    else:
        gpu = "no GPU"
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    machine = f"{cores} cores ({cpu}), {gpu}"
    lines = [
        "# Throughput: env steps/s",
        "",
        f"- Command: `{display_command(argv)}`",
        f"- Date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M:%S UTC')}",
        f"- Machine: {cores} cores (nproc), {cpu}, {gpu}; load average at start {load} (1/5/15 min)",
        f"- Versions: Python {platform.python_version()}, torch {torch.__version__}, "
        f"gymnasium {gymnasium.__version__}, "
        f"stable-baselines3 {package_version('stable-baselines3') or 'not installed'}, "
        f"mujoco {package_version('mujoco') or 'not installed'}; repo at {git_commit()}",
    ]
    return lines, machine


def venv_versions(python: str, packages: list[str]) -> str:
    """'pkg x.y, ...' as installed in another venv (for the results header); 'unknown' if that cannot be asked."""
    code = (
        "import importlib.metadata as m, sys\n"
        "for p in sys.argv[1:]:\n"
        "    try: print(p, m.version(p))\n"
        "    except m.PackageNotFoundError: print(p, 'not installed')"
    )
    try:
        out = subprocess.run([python, "-c", code, *packages], capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return ", ".join(out.stdout.splitlines())


def results_header(argv: list[str], cfg: argparse.Namespace) -> tuple[list[str], str]:
    """machine_header's lines plus one per comparison venv in use; taken before the runs, so the load is the start's."""
    lines, machine = machine_header(argv)
    for kind, packages in VENV_PACKAGES.items():
        if kind in cfg.impls:
            python = getattr(cfg, f"{kind}_python")
            lines.append(f"- {kind} venv ({display_path(python)}): {venv_versions(python, packages)}")
    return lines, machine


def fmt(x: float | None, spec: str = ",.0f") -> str:
    return "—" if x is None else format(x, spec)


def median_or_none(values: list[float | None]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def median_rows(runs: list[tuple], envs: list[str], impls: list[str]) -> list[dict]:
    """One row per env and implementation: the medians over the repeats of `runs` ((env_id, impl, seed, Result) each),
    and their ratios to SB3's whole-process rate and to the raw env loop."""
    rows = []
    for env_id in envs:
        med = {}
        for impl in impls:
            results = [r for e, i, _, r in runs if e == env_id and i == impl]
            med[impl] = {
                "whole": median_or_none([r.whole_sps for r in results]),
                "inloop": median_or_none([r.inloop_sps for r in results]),
                "steps": median_or_none([r.steps for r in results]),
            }
        sb3_whole = med.get("sb3", {}).get("whole")
        raw_limit = med.get("raw", {}).get("inloop")
        for impl in impls:
            m = med[impl]
            rows.append(
                {
                    "env": env_id,
                    "impl": impl,
                    "steps": m["steps"],
                    "whole": m["whole"],
                    "inloop": m["inloop"],
                    "vs_sb3": m["whole"] / sb3_whole if m["whole"] is not None and sb3_whole else None,
                    "vs_raw": m["inloop"] / raw_limit if raw_limit else None,
                }
            )
    return rows


def markdown_table(rows: list[dict]) -> list[str]:
    lines = [
        "| env | impl | steps | whole-process steps/s | in-loop steps/s | ratio to SB3 (whole-process) "
        "| in-loop / raw-env limit |",
        "|---|---|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['env']} | {r['impl']} | {fmt(r['steps'])} | {fmt(r['whole'])} | {fmt(r['inloop'])} "
            f"| {fmt(r['vs_sb3'], '.2f')} | {fmt(r['vs_raw'], '.3f')} |"
        )
    return lines


def every_run_table(runs: list[tuple]) -> list[str]:
    lines = [
        "| env | impl | seed | steps | whole-process s | whole-process steps/s | in-loop steps/s |",
        "|---|---|--:|--:|--:|--:|--:|",
    ]
    for env_id, impl, seed, r in runs:
        lines.append(
            f"| {r.env_run or env_id} | {impl} | {seed} | {r.steps} | {fmt(r.whole_seconds, '.1f')} "
            f"| {fmt(r.whole_sps)} | {fmt(r.inloop_sps)} |"
        )
    return lines


def measurement_notes(impls: list[str]) -> str:
    """The paragraph under the table: what whole-process and in-loop mean for the implementations that ran."""
    notes = (
        "Whole-process = env steps actually run / wall time of the whole subprocess (start-up, imports, env creation, "
        "training, saving), run in a fresh temporary directory. In-loop = the implementation's own rate: "
        + "; ".join(INLOOP_NOTES[impl] for impl in impls)
        + ". Ratio to SB3 compares whole-process rates on the same env."
    )
    if "cleanrl" in impls:
        notes += (
            " cleanrl ran CleanRL's own script in its own venv with OMP_NUM_THREADS=1, on the -v4 version of each -v5 "
            "env (see Every run)."
        )
    return notes


def plot_rates(rows: list[dict], envs: list[str], impls: list[str], path: str, title: str) -> None:
    """Bars per env: whole-process steps/s (left, without raw) and in-loop steps/s on a log scale (right)."""
    import numpy as np

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(8, 4), dpi=100)
    spare = iter(SPARE_COLORS * len(impls))
    colors = {impl: COLORS.get(impl) or next(spare) for impl in impls}
    by_key = {(r["env"], r["impl"]): r for r in rows}
    x = np.arange(len(envs))
    handles = {}
    for ax, metric, label, shown in (
        (axes[0], "whole", "whole process", [i for i in impls if i != "raw"]),
        (axes[1], "inloop", "in loop (log scale)", impls),
    ):
        width = 0.8 / max(len(shown), 1)
        for k, impl in enumerate(shown):
            values = [by_key[env_id, impl][metric] or 0.0 for env_id in envs]
            bars = ax.bar(x + (k - (len(shown) - 1) / 2) * width, values, width, label=impl, color=colors[impl])
            ax.bar_label(bars, labels=[fmt(v) if v else "" for v in values], fontsize=7, padding=1)
            handles[impl] = bars
        ax.set_xticks(x, [e.removesuffix("-v5") for e in envs], fontsize=9)
        ax.set_title(f"steps/s, {label}", fontsize=10)
        ax.tick_params(axis="y", labelsize=8)
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
        ax.margins(y=0.12)
    positive = [r["inloop"] for r in rows if r["inloop"]]
    axes[1].set_yscale("log")
    if positive:
        axes[1].set_ylim(min(positive) / 3, max(positive) * 2)
    fig.legend(
        [handles[i] for i in impls if i in handles],
        [i for i in impls if i in handles],
        loc="lower center",
        ncol=len(handles),
        fontsize=8,
        frameon=False,
    )
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(
    cfg: argparse.Namespace, runs: list[tuple], header: list[str], machine: str, elapsed: float, raw_steps: int
) -> None:
    """<out-dir>/<name>.md and <name>.png from `runs` ((env_id, impl, seed, Result) in run order); prints the table."""
    rows = median_rows(runs, cfg.envs, cfg.impls)
    table = markdown_table(rows)
    settings = (
        f"{cfg.total_timesteps} timesteps per learner run, --num-steps {cfg.num_steps} --num-minibatches "
        f"{cfg.num_minibatches}, 1 env, 10 epochs, 1 torch thread, CPU; raw: {raw_steps} random-action steps"
    )
    md = [
        *header,
        f"- Settings: {settings}; {cfg.repeats} repeat(s) (seeds 1..{cfg.repeats}), medians shown; "
        f"benchmark took {elapsed:.0f} s",
        "",
        *table,
        "",
        measurement_notes(cfg.impls),
        "",
        "## Every run",
        "",
        *every_run_table(runs),
        "",
    ]
    os.makedirs(cfg.out_dir, exist_ok=True)
    md_path = os.path.join(cfg.out_dir, f"{cfg.name}.md")
    with open(md_path, "w") as f:
        f.write("\n".join(md))
    png_path = os.path.join(cfg.out_dir, f"{cfg.name}.png")
    plot_rates(rows, cfg.envs, cfg.impls, png_path, f"{cfg.total_timesteps} steps, median of {cfg.repeats}; {machine}")
    print("\n".join(table))
    print(f"wrote {relative_to_cwd(md_path)} and {cfg.name}.png ({elapsed:.0f} s)", file=sys.stderr)
