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
For tasks that CleanRL publishes figures for (MuJoCo at 1M steps, dm_control at 8M), one more table per env family
sets each implementation beside CleanRL's figure, and an aggregate gives the interquartile mean of the scores
normalized between random actions (0) and CleanRL's mean (1), with stratified-bootstrap intervals (rliable).
Writes <out-dir>/learning.md, learning.png (return against steps and against seconds) and learning_grid.png (one panel
per task); --name changes the name. The default <out-dir> is a new folder benchmarks/results/local/<UTC date-time>/,
which git ignores; --update-committed writes into benchmarks/results/.
--run trains what is missing: --jobs single-process runs (ppo, sb3) at a time, then each DPPO run alone. --python
runs ppo and DPPO in another venv's interpreter: dm_control's envs need mujoco 3.x, in the venv that
benchmarks/requirements-dm_control.txt describes. Runs of 1M steps on 2 cores (2026-12-01): ppo two at a time 4 to
13 minutes on MuJoCo (Humanoid the longest) and about 10 on dm_control, async DPPO alone 3 to 7.5 minutes, SB3 32 to
34.
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
from concurrent.futures import ThreadPoolExecutor

import numpy as np
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

TARGETS = {"HalfCheetah-v5": 1500.0, "Hopper-v5": 2000.0, "Pendulum-v1": -600.0, "Walker2d-v5": 2000.0}
TARGETS |= {"InvertedPendulum-v5": 950.0, "Humanoid-v5": 700.0, "Pusher-v5": -45.0}
TARGETS |= {"dm_control/cheetah-run-v0": 400.0, "dm_control/walker-walk-v0": 350.0}
TARGETS |= {"dm_control/cartpole-swingup-v0": 600.0}
# CleanRL's ppo_continuous_action.py as its docs publish it (tag pr-424): (mean, std, seeds, env steps). MuJoCo: v4
# envs at 1M steps, as here. dm_control: its benchmark's 8M steps and 10 seeds, so a ceiling for a 1M-step run.
CLEANRL = {
    "HalfCheetah": (1442.64, 46.03, 3, "1M"),
    "Walker2d": (2287.95, 571.78, 3, "1M"),
    "Hopper": (2382.86, 271.74, 3, "1M"),
    "InvertedPendulum": (963.09, 22.20, 3, "1M"),
    "Humanoid": (716.11, 49.08, 3, "1M"),
    "Pusher": (-40.38, 7.15, 3, "1M"),
    "cheetah-run": (432.56, 82.54, 10, "8M"),
    "walker-walk": (392.51, 56.25, 10, "8M"),
    "cartpole-swingup": (640.86, 11.44, 10, "8M"),
}


def task_name(env_id: str) -> str:
    """The env's name without its version or family prefix: HalfCheetah-v5 -> HalfCheetah, as CLEANRL keys them."""
    return env_id.split("/")[-1].rsplit("-v", 1)[0]


def family(env_id: str) -> str:
    return "dm_control" if env_id.startswith("dm_control/") else "MuJoCo"


def published_envs(rows: list[dict], name: str) -> list[str]:
    """The envs of family `name` among the rows that CleanRL publishes a figure for, in the rows' order."""
    return list(dict.fromkeys(r["env"] for r in rows if family(r["env"]) == name and task_name(r["env"]) in CLEANRL))


COMMANDS = {
    "ppo": ["ppo_continuous.py"],
    "dppo_sync": ["dppo_ray.py", "--mode=sync"],
    "dppo_async": ["dppo_ray.py", "--mode=async"],
}


def run_missing(cfg: argparse.Namespace) -> None:
    """Train every run that is not done: --jobs single-process runs (ppo, sb3) at a time, then each DPPO run with the
    machine to itself (its actors and learner use every core)."""
    root = os.path.abspath(cfg.runs_root)
    single, distributed = [], []
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
                python = sys.executable if impl == "sb3" else cfg.python  # SB3 runs in this venv
                job = (f"{status} {impl} on {env_id}, seed {seed}", argv, python)
                (distributed if impl.startswith("dppo") else single).append(job)
    run_jobs(single, cfg.jobs, cwd=os.path.dirname(root))
    run_jobs(distributed, 1, cwd=os.path.dirname(root))


def run_jobs(jobs: list[tuple], parallel: int, cwd: str) -> None:
    """Run (label, argv) or (label, argv, python) jobs, `parallel` at a time. After a failure the others still finish
    (each is hours of compute) before it is raised; after Ctrl-C, which the running trainers also get and answer with a
    checkpoint, nothing new starts."""

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


def reference_tables(rows: list[dict], impls: list[str]) -> list[str]:
    """One table per env family: each implementation's final return (mean ± std over seeds) beside CleanRL's
    published one, and the first implementation's gap to it in CleanRL's stds."""
    lines = []
    for name in ("MuJoCo", "dm_control"):
        envs = list(
            dict.fromkeys(r["env"] for r in rows if family(r["env"]) == name and task_name(r["env"]) in CLEANRL)
        )
        if not envs:
            continue
        present = [i for i in impls if any(r["impl"] == i and r["env"] in envs for r in rows)]
        lines += [
            "",
            f"{name}: final return, mean ± std over seeds (seeds in brackets), against CleanRL's published",
            "",
        ]
        lines += [f"| env | {' | '.join(present)} | CleanRL (published) | {present[0]} - CleanRL, in CleanRL stds |"]
        lines += ["|---|" + "--:|" * (len(present) + 2)]
        for env_id in envs:
            mean, std, seeds, steps = CLEANRL[task_name(env_id)]
            by_impl = {r["impl"]: r for r in rows if r["env"] == env_id}
            cells = [
                f"{by_impl[i]['final']:.0f} ± {by_impl[i]['final_std']:.0f} ({by_impl[i]['seeds']})" if i in by_impl
                else "—" for i in present
            ]  # fmt: skip
            first = by_impl.get(present[0])
            gap = f"{(first['final'] - mean) / std:+.1f}" if first else "—"
            lines.append(
                f"| {env_id} | {' | '.join(cells)} | {mean:.0f} ± {std:.0f} ({seeds}, {steps} steps) | {gap} |"
            )
    return lines


RANDOM_RETURN = """
import sys
from ppo_continuous import make_env
env_id, episodes = sys.argv[1], int(sys.argv[2])
env, total = make_env(env_id), 0.0
env.action_space.seed(0)
for episode in range(episodes):
    env.reset(seed=episode)
    done = False
    while not done:
        _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        total, done = total + float(reward), terminated or truncated
print(total / episodes)
"""


def random_returns(env_ids: list[str], cache: str, python: str, episodes: int = 10) -> dict[str, float]:
    """Mean return of uniformly random actions per env (the 0 of a normalized score), measured once with the runs'
    interpreter (dm_control's envs may exist only in another venv) and kept in `cache` (a JSON file beside the runs)."""
    known = {}
    if os.path.isfile(cache):
        with open(cache) as f:
            known = json.load(f)
    for env_id in [e for e in env_ids if e not in known]:
        stdout, _ = timed_subprocess(
            f"random actions on {env_id}", ["-c", RANDOM_RETURN, env_id, str(episodes)], cwd=REPO, python=python
        )
        known[env_id] = float(stdout.split()[-1])
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        with open(cache, "w") as f:  # after each env: a later env's failure keeps what was measured
            json.dump(known, f, indent=1)
    return known


def normalized_scores(rows: list[dict], envs: list[str], impl: str, random: dict[str, float]) -> np.ndarray | None:
    """(seeds, tasks) final returns scaled so that random actions score 0 and CleanRL's published mean 1; None unless
    the implementation has the same number of seeds on every task (rliable's stratified bootstrap needs that)."""
    by_env = {r["env"]: r for r in rows if r["impl"] == impl}
    if any(e not in by_env for e in envs) or len({by_env[e]["seeds"] for e in envs}) != 1:
        return None
    columns = []
    for env_id in envs:
        zero, one = random[env_id], CLEANRL[task_name(env_id)][0]
        columns.append((np.asarray(by_env[env_id]["finals"]) - zero) / (one - zero))
    return np.stack(columns, axis=1)


def aggregate_table(rows: list[dict], impls: list[str], random: dict[str, float], reps: int = 5000) -> list[str]:
    """Interquartile mean and mean of the normalized scores across the tasks of each family, with 95% stratified-
    bootstrap confidence intervals (rliable, Agarwal et al. 2021: the interquartile mean is robust to one outlier
    seed, and its interval is honest about 3 seeds). An implementation run on some of the tasks only adds a second
    table: every implementation on the tasks that all of them have."""
    lines = []
    for name in ("MuJoCo", "dm_control"):
        envs = list(
            dict.fromkeys(r["env"] for r in rows if family(r["env"]) == name and task_name(r["env"]) in CLEANRL)
        )
        covered = [[e for e in envs if any(r["env"] == e and r["impl"] == impl for r in rows)] for impl in impls]
        covered = [
            tasks for tasks, impl in zip(covered, impls) if normalized_scores(rows, tasks, impl, random) is not None
        ]
        common = [e for e in envs if all(e in tasks for tasks in covered)]
        lines += aggregate_rows(rows, impls, random, name, envs, False, reps)
        if len(common) >= 2 and common != envs:
            lines += aggregate_rows(rows, impls, random, name, common, True, reps)
    return lines


def aggregate_rows(rows, impls, random, name: str, envs: list[str], subset: bool, reps: int) -> list[str]:
    from rliable import library as rly
    from rliable import metrics

    scores = {i: s for i in impls if (s := normalized_scores(rows, envs, i, random)) is not None}
    if len(envs) < 2 or not scores:
        return []
    aggregate = lambda s: np.array([metrics.aggregate_iqm(s), metrics.aggregate_mean(s)])  # noqa: E731
    # Seeded, so that the same runs give the same intervals every time. rliable's stratified bootstrap draws from
    # numpy's global generator whatever its random_state says, so that is the one seeded (and restored after).
    global_state = np.random.get_state()  # noqa: NPY002 (the generator rliable uses)
    np.random.seed(0)  # noqa: NPY002
    try:
        points, intervals = rly.get_interval_estimates(scores, aggregate, reps=reps)
    finally:
        np.random.set_state(global_state)  # noqa: NPY002
    steps = ", ".join(sorted({CLEANRL[task_name(e)][3] for e in envs}))
    which = f" (the tasks all have: {', '.join(task_name(e) for e in envs)})" if subset else ""
    lines = ["", f"{name}, {len(envs)} tasks{which}: score = (return - random) / (CleanRL's published mean ({steps} "]
    lines[-1] += "steps) - random); 95% stratified-bootstrap intervals (rliable)"
    lines += ["", "| impl | seeds per task | IQM [95% CI] | mean [95% CI] |", "|---|--:|--:|--:|"]
    for impl in scores:
        (iqm, mean), (low, high) = points[impl], intervals[impl]
        lines.append(
            f"| {impl} | {scores[impl].shape[0]} | {iqm:.2f} [{low[0]:.2f}, {high[0]:.2f}] | "
            f"{mean:.2f} [{low[1]:.2f}, {high[1]:.2f}] |"
        )
    return lines


def plot_grid(curves: dict, cfg: argparse.Namespace, path: str) -> None:
    """One panel per task: return against env steps, mean ± std over seeds for each implementation, and CleanRL's
    published final return as a dashed line."""
    import matplotlib.pyplot as plt

    envs = [e for e in cfg.envs if any(k[0] == e for k in curves)]
    columns = min(3, len(envs))
    fig, axes = plt.subplots(-(-len(envs) // columns), columns, figsize=(4.2 * columns, 3.2 * -(-len(envs) // columns)))
    axes = np.atleast_1d(axes).reshape(-1)
    for ax, env_id in zip(axes, envs):
        for impl in cfg.impls:
            runs = curves.get((env_id, impl))
            if runs:
                grid = np.linspace(0, min(run[0][-1] for run in runs), 200)
                ys = np.array([np.interp(grid, run[0], run[2]) for run in runs])
                (line,) = ax.plot(grid, ys.mean(0), label=f"{impl} ({len(runs)} seeds)")
                ax.fill_between(grid, ys.mean(0) - ys.std(0), ys.mean(0) + ys.std(0), alpha=0.2, color=line.get_color())
        if task_name(env_id) in CLEANRL:
            mean, _, _, steps = CLEANRL[task_name(env_id)]
            ax.axhline(mean, color="gray", linestyle="--", linewidth=1, label=f"CleanRL, published ({steps} steps)")
        ax.set_title(env_id, fontsize=9)
        ax.set_xlabel("env steps")
        ax.legend(fontsize=7)
    for ax in axes[len(envs) :]:
        ax.axis("off")
    axes[0].set_ylabel("return (last 100 episodes)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


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
        "--jobs",
        type=int,
        default=1,
        help="with --run: single-process runs (ppo, sb3) at a time; DPPO runs always run alone (default: 1)",
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
        help="smoke test: trains Pendulum-v1, 1 seed, 8192 steps, in a temporary runs folder that it then deletes",
    )
    cfg = p.parse_args(argv)
    if cfg.jobs < 1:
        p.error("--jobs must be at least 1")
    if shutil.which(cfg.python) is None:
        p.error(f"--python {cfg.python}: no such executable")
    cfg.python = os.path.abspath(shutil.which(cfg.python))  # the runs start elsewhere; a venv's link must stay a link
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
    lines += reference_tables(rows, cfg.impls)
    scored = sorted({r["env"] for r in rows if task_name(r["env"]) in CLEANRL})
    if len(scored) >= 2:
        random = random_returns(scored, os.path.join(cfg.runs_root, cfg.group, "random_returns.json"), cfg.python)
        lines += aggregate_table(rows, cfg.impls, random)
    with open(os.path.join(cfg.out_dir, f"{cfg.name}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plot_grid(curves, cfg, os.path.join(cfg.out_dir, f"{cfg.name}_grid.png"))

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
    fig.savefig(os.path.join(cfg.out_dir, f"{cfg.name}.png"), dpi=100)
    written = relative_to_cwd(os.path.join(cfg.out_dir, f"{cfg.name}.md"))
    print(f"wrote {written}, {cfg.name}.png and {cfg.name}_grid.png", file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as e:
        sys.exit(f"learning.py: error: {e}")
