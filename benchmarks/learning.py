"""Learning curves side by side: return against env steps and against wall-clock time, over seeds.

    python benchmarks/learning.py                          # read runs/bench/<impl>/<env>__<seed> and plot
    python benchmarks/learning.py --run --impls ppo sb3    # first train what is missing (long: 10-34 min a run);
                                                           # run it again after a Ctrl-C: it resumes where it stopped
    python benchmarks/learning.py --quick                  # smoke test: tiny Pendulum runs, under 3 minutes

Layout: every run logs TensorBoard events under <runs-root>/<group>/<impl>/<env-id>__<seed>/ (ppo_continuous.py and
dppo_ray.py via --run-name, SB3 via its tensorboard_log). Events are read with tensorboard's EventAccumulator.
The curve of a run is the mean return of its last 100 episodes, the quantity SB3 logs as rollout/ep_rew_mean, so the
implementations compare like for like. The table gives the final value (mean ± std over seeds) and the time, in env
steps and in seconds, at which each run first reached the target return (the DPPO notes ask for both: return at a
fixed budget, and time to a fixed return). A second table compares each implementation's final return with the first
one in --impls (an exact permutation test over seeds; a small p means the gap is larger than seed noise).
Writes <out-dir>/learning.md and <out-dir>/learning.png. The default <out-dir> is a new folder
benchmarks/results/local/<UTC date-time>/, which git ignores; --update-committed writes into benchmarks/results/.
--run trains every missing run one after the other: runs of 1M steps (the default) took 10 to 15 minutes for ppo and
DPPO, 32 to 34 for SB3, on 2 CPU cores; the defaults (4 impls, 2 envs, 2 seeds) are 16 runs, about 4 to 5 hours.
"""

from __future__ import annotations

import argparse
import glob
import itertools
import json
import os
import shutil
import sys
import time
from collections import deque

import numpy as np
from throughput import (
    BenchError,
    HelpFormatter,
    add_output_args,
    display_command,
    relative_to_cwd,
    resolve_out_dir,
    timed_subprocess,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGETS = {"HalfCheetah-v5": 1500.0, "Hopper-v5": 2000.0, "Pendulum-v1": -600.0}
COMMANDS = {
    "ppo": ["ppo_continuous.py"],
    "dppo_sync": ["dppo_ray.py", "--mode=sync"],
    "dppo_async": ["dppo_ray.py", "--mode=async"],
}


def run_missing(cfg: argparse.Namespace) -> None:
    root = os.path.abspath(cfg.runs_root)
    for env_id in cfg.envs:
        for seed in range(1, cfg.seeds + 1):
            for impl in cfg.impls:
                folder = os.path.join(root, cfg.group, impl, f"{env_id}__{seed}")
                status = run_status(folder, cfg)
                if status == "done":
                    continue
                if status == "restart" and impl == "sb3":
                    shutil.rmtree(folder)  # SB3 keeps no checkpoint here: its half-finished run starts afresh
                common = [f"--env-id={env_id}", f"--seed={seed}", f"--total-timesteps={cfg.total_timesteps}"]
                common += [f"--num-minibatches={cfg.num_minibatches}"]
                if impl == "sb3":
                    argv = [os.path.join(REPO, "benchmarks", "sb3_ppo.py"), *common, f"--tb-log={folder}"]
                    argv += [f"--num-steps={cfg.num_steps}", "--vf-coef=0.25", "--clip-vloss"]
                else:
                    script, *flags = COMMANDS[impl]
                    steps = cfg.num_steps // 2 if script == "dppo_ray.py" else cfg.num_steps
                    argv = [os.path.join(REPO, script), *flags, *common, f"--num-steps={steps}", "--quiet"]
                    argv += [f"--run-name={os.path.relpath(folder, os.path.join(root))}"]
                    if status == "resume":  # the flags come from the checkpoint
                        argv = [argv[0], f"--resume={os.path.join(folder, 'checkpoint.pt')}", "--quiet"]
                    elif status == "restart":
                        argv.append("--overwrite")
                print(f"learning.py: {status} {impl} on {env_id}, seed {seed} ...", file=sys.stderr, flush=True)
                timed_subprocess(f"{impl} on {env_id} seed {seed}", argv, cwd=os.path.dirname(root))


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


def read_curve(folder: str) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(env steps, seconds since the first event, mean return of the last 100 episodes) of one run."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    event_dirs = sorted({os.path.dirname(p) for p in glob.glob(os.path.join(folder, "**", "events.*"), recursive=True)})
    for event_dir in event_dirs:
        acc = EventAccumulator(event_dir, size_guidance={"scalars": 0})
        acc.Reload()
        tags = acc.Tags()["scalars"]
        if "charts/episodic_return" in tags:  # ours: one point per episode
            events = acc.Scalars("charts/episodic_return")
            window: deque[float] = deque(maxlen=100)
            values = []
            for e in events:
                window.append(e.value)
                values.append(np.mean(window))
        elif "rollout/ep_rew_mean" in tags:  # SB3: already the mean of the last 100 episodes
            events = acc.Scalars("rollout/ep_rew_mean")
            values = [e.value for e in events]
        else:
            continue
        start = min(e.wall_time for e in acc.Scalars(tags[0]))
        return (np.array([e.step for e in events]), np.array([e.wall_time - start for e in events]), np.array(values))
    return None


def first_reach(x: np.ndarray, values: np.ndarray, target: float) -> float | None:
    hit = np.flatnonzero(values >= target)
    return float(x[hit[0]]) if len(hit) else None


def summarize(cfg: argparse.Namespace):
    curves, rows = {}, []
    for env_id in cfg.envs:
        for impl in cfg.impls:
            runs = []
            for seed in range(1, cfg.seeds + 1):
                curve = read_curve(os.path.join(cfg.runs_root, cfg.group, impl, f"{env_id}__{seed}"))
                if curve is not None:
                    runs.append(curve)
            if not runs:
                continue
            curves[env_id, impl] = runs
            finals = [values[-1] for _, _, values in runs]
            target = cfg.target if cfg.target is not None else TARGETS.get(env_id)
            reach_steps = [first_reach(steps, v, target) for steps, _, v in runs] if target is not None else []
            reach_secs = [first_reach(secs, v, target) for _, secs, v in runs] if target is not None else []
            rows.append(
                {
                    "env": env_id,
                    "impl": impl,
                    "seeds": len(runs),
                    "finals": finals,
                    "final": np.mean(finals),
                    "final_std": np.std(finals),
                    "steps": int(np.mean([steps[-1] for steps, _, _ in runs])),
                    "wall": np.mean([secs[-1] for _, secs, _ in runs]),
                    "target": target,
                    "reach_steps": reach_steps,
                    "reach_secs": reach_secs,
                }
            )
    return curves, rows


def permutation_pvalue(a: list[float], b: list[float]) -> float:
    """Two-sided exact permutation test of a difference in means: the share of all ways to split the pooled seeds
    into groups of len(a) and len(b) whose difference in means is at least as large as the observed one. It assumes
    nothing about the distribution of returns, which matters with 2 to 5 seeds and Hopper's occasional collapses."""
    pooled = np.asarray(list(a) + list(b), dtype=np.float64)
    observed = abs(np.mean(a) - np.mean(b))
    splits = list(itertools.combinations(range(len(pooled)), len(a)))
    extreme = 0
    for chosen in splits:
        mask = np.zeros(len(pooled), dtype=bool)
        mask[list(chosen)] = True
        # a small tolerance so that splits tying the observed difference count despite rounding
        extreme += abs(pooled[mask].mean() - pooled[~mask].mean()) >= observed - 1e-9 * max(1.0, observed)
    return extreme / len(splits)


def fmt_reach(values: list[float | None], unit: str) -> str:
    if not values:
        return "—"
    reached = [v for v in values if v is not None]
    if not reached:
        return f"not reached (0/{len(values)})"
    scale, suffix = (1e3, "k") if unit == "steps" and max(reached) >= 1e4 else (1, "")
    return f"{np.mean(reached) / scale:,.0f}{suffix} {unit} ({len(reached)}/{len(values)} seeds)"


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
    p.add_argument("--run", action="store_true", help="train the runs that have no logs yet, one after the other")
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
    add_output_args(p, "learning.md and learning.png")
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: trains Pendulum-v1, 1 seed, 8192 steps, in a temporary runs folder that it then deletes",
    )
    cfg = p.parse_args(argv)
    unknown = [impl for impl in cfg.impls if impl not in (*COMMANDS, "sb3")]
    if (cfg.run or cfg.quick) and unknown:
        p.error(f"--run cannot train {' '.join(unknown)}: it trains {' '.join(COMMANDS)} sb3")
    cfg.out_dir = resolve_out_dir(cfg)
    return cfg


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cfg = parse_args(argv)
    if cfg.quick:
        import tempfile

        cfg.envs, cfg.seeds, cfg.total_timesteps, cfg.run = ["Pendulum-v1"], 1, 8192, True
        cfg.num_steps, cfg.num_minibatches = 1024, 8
        cfg.runs_root = os.path.join(tempfile.mkdtemp(prefix="learning_quick_"), "runs")
    try:
        if cfg.run:
            run_missing(cfg)
        curves, rows = summarize(cfg)
    finally:
        if cfg.quick:
            import shutil

            shutil.rmtree(os.path.dirname(cfg.runs_root), ignore_errors=True)
    if not rows:
        raise SystemExit(f"learning.py: error: no runs found under {os.path.join(cfg.runs_root, cfg.group)}")

    os.makedirs(cfg.out_dir, exist_ok=True)
    lines = [
        "# Learning",
        "",
        f"Command: `{display_command([os.path.abspath(__file__), *argv])}`  ",
        f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine: {os.cpu_count()} cores, no GPU  ",
        "Final return: mean of the last 100 training episodes at the end of the run, mean ± std over seeds.",
        "",
        "| env | impl | seeds | env steps | final return | wall time | target | reached (steps) | reached (time) |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['env']} | {r['impl']} | {r['seeds']} | {r['steps']:,} | {r['final']:.0f} ± {r['final_std']:.0f} | "
            f"{r['wall'] / 60:.1f} min | {r['target']:g} | {fmt_reach(r['reach_steps'], 'steps')} | "
            f"{fmt_reach(r['reach_secs'], 's')} |"
        )
    baselines = {r["env"]: r for r in rows if r["impl"] == cfg.impls[0]}
    comparisons = [(baselines[r["env"]], r) for r in rows if r["env"] in baselines and r is not baselines[r["env"]]]
    if comparisons:
        lines += [
            "",
            f"Difference in final return to {cfg.impls[0]}, with the exact permutation test's two-sided p-value over"
            " seeds (p is 1/3 at best with 2 + 2 seeds, so it needs 3 or more a side to mean much):",
            "",
            "| env | impl | difference | p |",
            "|---|---|--:|--:|",
        ]
        for base, r in comparisons:
            p_value = permutation_pvalue(r["finals"], base["finals"])
            lines.append(f"| {r['env']} | {r['impl']} | {r['final'] - base['final']:+.0f} | {p_value:.2f} |")
    with open(os.path.join(cfg.out_dir, "learning.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = [e for e in cfg.envs if any(k[0] == e for k in curves)]
    fig, axes = plt.subplots(len(envs), 2, figsize=(9, 3.2 * len(envs)), squeeze=False)
    for row_axes, env_id in zip(axes, envs):
        for impl in cfg.impls:
            runs = curves.get((env_id, impl))
            if not runs:
                continue
            for ax, column in zip(row_axes, (0, 1)):
                # resample each seed on a common grid, then mean ± std
                end = min(run[column][-1] for run in runs)
                grid = np.linspace(0, end, 200)
                ys = np.array([np.interp(grid, run[column], run[2]) for run in runs])
                (line,) = ax.plot(grid, ys.mean(0), label=impl)
                ax.fill_between(grid, ys.mean(0) - ys.std(0), ys.mean(0) + ys.std(0), alpha=0.2, color=line.get_color())
        row_axes[0].set_xlabel("env steps")
        row_axes[1].set_xlabel("wall-clock seconds")
        for ax in row_axes:
            ax.set_ylabel("return (last 100 episodes)")
            ax.set_title(env_id, fontsize=9)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(cfg.out_dir, "learning.png"), dpi=100)
    print(f"wrote {relative_to_cwd(os.path.join(cfg.out_dir, 'learning.md'))} and learning.png", file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as e:
        sys.exit(f"learning.py: error: {e}")
