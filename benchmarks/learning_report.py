"""learning.py's report: reads the runs' TensorBoard logs and writes the tables (final return, time to target,
permutation p-values, CleanRL's published figures, rliable aggregates) and the plots."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time

import numpy as np
from common import REPO, pyplot, timed_subprocess

from run_record import read_curve  # common put the repository on the path
from seed_statistics import permutation_floor, permutation_pvalue, plot_mean_and_std, sample_std, welch_interval

TARGETS = {
    "HalfCheetah-v5": 1500.0,
    "Hopper-v5": 2000.0,
    "Pendulum-v1": -600.0,
    "Walker2d-v5": 2000.0,
    "InvertedPendulum-v5": 950.0,
    "Humanoid-v5": 700.0,
    "Pusher-v5": -45.0,
    "dm_control/cheetah-run-v0": 400.0,
    "dm_control/walker-walk-v0": 350.0,
    "dm_control/cartpole-swingup-v0": 600.0,
}
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
FAMILIES = ("MuJoCo", "dm_control")


def task_name(env_id: str) -> str:
    """The env's name without its version or family prefix: HalfCheetah-v5 -> HalfCheetah, as CLEANRL keys them."""
    return env_id.split("/")[-1].rsplit("-v", 1)[0]


def family(env_id: str) -> str:
    return "dm_control" if env_id.startswith("dm_control/") else "MuJoCo"


def published_envs(rows: list[dict], name: str) -> list[str]:
    """The envs of family `name` among the rows that CleanRL publishes a figure for, in the rows' order."""
    return list(dict.fromkeys(r["env"] for r in rows if family(r["env"]) == name and task_name(r["env"]) in CLEANRL))


def first_reach(x: np.ndarray, values: np.ndarray, target: float) -> float | None:
    hit = np.flatnonzero(values >= target)
    return float(x[hit[0]]) if len(hit) else None


def run_entries(folder: str) -> list[dict]:
    """The run.json record of the run in `folder` and each of its resumes' ([] for a run without one)."""
    path = os.path.join(folder, "run.json")
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        record = json.load(f)
    return [record, *record.get("resumes", [])]


def run_codes(entries: list[dict]) -> list[str]:
    """The code's SHA-256 (12 characters) that trained a run, from its run.json entries (run_entries): the first run's,
    then each resume's; ["unrecorded"] for a run without one."""
    return list(dict.fromkeys(e["code"]["scripts_sha256"][:12] for e in entries)) if entries else ["unrecorded"]


def summary_row(env_id: str, impl: str, runs: list[tuple], target: float | None, codes: list[str]) -> dict:
    """A row of the first table: final return over the seeds' `runs` (read_curve's curves), when each run first
    reached `target`, in env steps and in seconds, and the code (run_codes) the seeds were trained by."""
    finals = [values[-1] for _, _, values in runs]
    reach_steps = [first_reach(steps, v, target) for steps, _, v in runs] if target is not None else []
    reach_secs = [first_reach(secs, v, target) for _, secs, v in runs] if target is not None else []
    return {
        "env": env_id,
        "impl": impl,
        "seeds": len(runs),
        "finals": finals,
        "final": np.mean(finals),
        "final_std": sample_std(finals),
        "codes": codes,
        "steps": int(np.mean([steps[-1] for steps, _, _ in runs])),
        "wall": np.mean([secs[-1] for _, secs, _ in runs]),
        "target": target,
        "reach_steps": reach_steps,
        "reach_secs": reach_secs,
    }


def summarize_runs(cfg: argparse.Namespace) -> tuple[dict, list[dict]]:
    """({(env_id, impl): the curves of its seeds}, summary rows) of every env and implementation with a run."""
    curves = {}
    rows = []
    for env_id, impl in itertools.product(cfg.envs, cfg.impls):
        impl_folder = os.path.join(cfg.runs_root, cfg.group, impl)
        folders = [os.path.join(impl_folder, f"{env_id}__{seed}") for seed in range(1, cfg.seeds + 1)]
        found = [(folder, curve) for folder in folders if (curve := read_curve(folder)) is not None]
        if not found:
            continue
        runs = [curve for _, curve in found]
        records = [run_entries(folder) for folder, _ in found]  # each run.json read once
        codes = list(dict.fromkeys(code for entries in records for code in run_codes(entries)))
        curves[env_id, impl] = runs
        target = cfg.target if cfg.target is not None else TARGETS.get(env_id)
        rows.append(summary_row(env_id, impl, runs, target, codes))
        rows[-1]["entries"] = [entry for entries in records for entry in entries]
        rows[-1]["unrecorded"] = sum(not entries for entries in records)
    return curves, rows


def fmt_reach(values: list[float | None], unit: str) -> str:
    if not values:
        return "—"
    reached = [v for v in values if v is not None]
    if not reached:
        return f"not reached (0/{len(values)})"
    scale, suffix = (1e3, "k") if unit == "steps" and max(reached) >= 1e4 else (1, "")
    return f"{np.mean(reached) / scale:,.0f}{suffix} {unit} ({len(reached)}/{len(values)} seeds)"


def final_return_table(rows: list[dict]) -> list[str]:
    """Final return per seed and mean ± sample std, time to target, and the code (scripts' SHA-256) of each row's
    runs; a line under the table when the runs were trained by more than one version of the code."""
    lines = [
        "| env | impl | seeds | env steps | final return per seed | mean ± std | wall time | target | reached (steps) "
        "| reached (time) | code |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for r in rows:
        per_seed = ", ".join(f"{v:.0f}" for v in r["finals"])
        lines.append(
            f"| {r['env']} | {r['impl']} | {r['seeds']} | {r['steps']:,} | {per_seed} "
            f"| {r['final']:.0f} ± {r['final_std']:.0f} | {r['wall'] / 60:.1f} min | "
            f"{'—' if r['target'] is None else format(r['target'], 'g')} | "
            f"{fmt_reach(r['reach_steps'], 'steps')} | {fmt_reach(r['reach_secs'], 's')} | {', '.join(r['codes'])} |"
        )
    return lines + provenance_lines(rows)


def unfinished_lines(unfinished: list[tuple]) -> list[str]:
    """A line under the table naming the runs it read that have not reached --total-timesteps (report-only mode)."""
    if not unfinished:
        return []
    names = [f"{label} on {env_id}, seed {seed}" for label, _, _, env_id, seed, _ in unfinished]
    return ["", f"**Unfinished:** {'; '.join(names)}: their rows use the curves as far as they got."]


def provenance_lines(rows: list[dict]) -> list[str]:
    """What the rows' runs ran with, from their run.json (each resume's too): a line on the Python, the packages and
    the CPU when they all share them, and a **Mixed** line when a module of the code, or the Python or a package
    version, differs between them (a difference between rows may then be theirs, not the algorithm's)."""
    lines = []
    modules: dict[str, dict[str, set]] = {}  # module name: {its sha256: the rows that ran it}
    environments: dict[str, set] = {}  # Python and packages, as text: the rows that ran on them
    cpus, commits = set(), set()
    for r in rows:
        name = f"{r['env']} {r['impl']}"
        for entry in r.get("entries", []):
            for module, recorded in entry["code"].get("modules", {}).items():
                modules.setdefault(module, {}).setdefault(recorded["sha256"][:12], set()).add(name)
            ran_on = entry.get("environment")
            if ran_on is None:
                environments.setdefault("versions unrecorded", set()).add(name)
                continue
            packages = ", ".join(f"{p} {v}" for p, v in ran_on["packages"].items() if v is not None)
            environments.setdefault(f"Python {ran_on['python']}; {packages}", set()).add(name)
            cpus.add(f"{ran_on['cpu']} ({ran_on['cores']} cores)")
            commit = (entry["code"].get("commit") or "unknown")[:12]
            commits.add(commit if entry["code"].get("scripts_clean") is not False else f"{commit} with local changes")
    mixed = {module: versions for module, versions in modules.items() if len(versions) > 1}
    unrecorded = sum(r.get("unrecorded", 0) for r in rows)
    if mixed or unrecorded:
        said = [f"{module} in {len(versions)} versions" for module, versions in sorted(mixed.items())]
        if unrecorded:
            said.append(f"{unrecorded} runs without run.json")
        lines += ["", f"**Mixed code:** {'; '.join(said)}. Differences between rows may be the code's."]
    if commits:
        lines += ["", f"Runs' code: commit {', '.join(sorted(commits))}."]
    if len(environments) == 1:
        lines += ["", f"Ran on {next(iter(environments))}; CPU: {', '.join(sorted(cpus)) or 'unrecorded'}."]
    elif environments:
        said = [f"{which} ({', '.join(sorted(names))})" for which, names in sorted(environments.items())]
        lines += ["", f"**Mixed versions:** the runs ran on {'; '.join(said)}. Differences between rows may be theirs."]
    return lines


def difference_table(rows: list[dict], baseline: str) -> list[str]:
    """Each implementation's final return against `baseline`'s on the same env, with the permutation test's p."""
    baselines = {r["env"]: r for r in rows if r["impl"] == baseline}
    comparisons = [(baselines[r["env"]], r) for r in rows if r["env"] in baselines and r is not baselines[r["env"]]]
    if not comparisons:
        return []
    tasks = len({base["env"] for base, _ in comparisons})
    lines = [
        "",
        f"Difference in final return to {baseline}: a 95% Welch t-interval over seeds, and the exact two-sided "
        "permutation test's p beside the smallest p its seed counts allow (with 3 + 3 seeds no difference, however "
        f"large, can give less than 0.10). The p is per task; {tasks} task{'s' if tasks > 1 else ''} compared, so a "
        f"claim across them needs p × {tasks} (Bonferroni), in the last column:",
        "",
        "| env | impl | difference | 95% Welch interval | p | least possible p | p × tasks |",
        "|---|---|--:|--:|--:|--:|--:|",
    ]
    for base, r in comparisons:
        p_value = permutation_pvalue(r["finals"], base["finals"])
        interval = "—"  # one seed on a side has no spread
        if min(len(r["finals"]), len(base["finals"])) >= 2:
            low, high = welch_interval(r["finals"], base["finals"])
            interval = f"[{low:+.0f}, {high:+.0f}]"
        floor = permutation_floor(len(r["finals"]), len(base["finals"]))
        lines.append(
            f"| {r['env']} | {r['impl']} | {r['final'] - base['final']:+.0f} | {interval} | {p_value:.3f} | "
            f"{floor:.3f} | {min(1.0, p_value * tasks):.3f} |"
        )
    return lines


def final_return_cell(row: dict | None) -> str:
    if row is None:
        return "—"
    return f"{row['final']:.0f} ± {row['final_std']:.0f} ({row['seeds']})"


def reference_tables(rows: list[dict], impls: list[str]) -> list[str]:
    """One table per env family: each implementation's final return (mean ± std over seeds) beside CleanRL's
    published one, and the first implementation's gap to it in CleanRL's stds."""
    lines = []
    for name in FAMILIES:
        envs = published_envs(rows, name)
        if not envs:
            continue
        present = [i for i in impls if any(r["impl"] == i and r["env"] in envs for r in rows)]
        lines += [
            "",
            f"{name}: final return, mean ± std over seeds (seeds in brackets), against CleanRL's published",
            "",
            f"| env | {' | '.join(present)} | CleanRL (published) | {present[0]} - CleanRL, in CleanRL stds |",
            "|---|" + "--:|" * (len(present) + 2),
        ]
        for env_id in envs:
            mean, std, seeds, steps = CLEANRL[task_name(env_id)]
            by_impl = {r["impl"]: r for r in rows if r["env"] == env_id}
            cells = [final_return_cell(by_impl.get(i)) for i in present]
            first = by_impl.get(present[0])
            gap = f"{(first['final'] - mean) / std:+.1f}" if first else "—"
            lines.append(
                f"| {env_id} | {' | '.join(cells)} | {mean:.0f} ± {std:.0f} ({seeds}, {steps} steps) | {gap} |"
            )
    return lines


# A script, not a function: it runs in the runs' interpreter (--python), where dm_control's envs may be. argv: env id,
# episodes.
RANDOM_RETURN = """
import sys
from ppo_continuous import make_env
env_id = sys.argv[1]
episodes = int(sys.argv[2])
env = make_env(env_id)
total = 0.0
env.action_space.seed(0)
for episode in range(episodes):
    env.reset(seed=episode)
    done = False
    while not done:
        _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        total += float(reward)
        done = terminated or truncated
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
        zero = random[env_id]
        one = CLEANRL[task_name(env_id)][0]
        columns.append((np.asarray(by_env[env_id]["finals"]) - zero) / (one - zero))
    return np.stack(columns, axis=1)


def aggregate_table(rows: list[dict], impls: list[str], random: dict[str, float], reps: int = 5000) -> list[str]:
    """Interquartile mean and mean of the normalized scores across the tasks of each family, with 95% stratified-
    bootstrap confidence intervals (rliable, Agarwal et al. 2021: the interquartile mean is robust to one outlier
    seed, and its interval is honest about 3 seeds). An implementation run on some of the tasks only adds a second
    table: every implementation on the tasks that all of them have."""
    lines = []
    for name in FAMILIES:
        envs = published_envs(rows, name)
        covered = [[e for e in envs if any(r["env"] == e and r["impl"] == impl for r in rows)] for impl in impls]
        covered = [
            tasks for tasks, impl in zip(covered, impls) if normalized_scores(rows, tasks, impl, random) is not None
        ]
        common = [e for e in envs if all(e in tasks for tasks in covered)]
        lines += aggregate_rows(rows, impls, random, name, envs, False, reps)
        if len(common) >= 2 and common != envs:
            lines += aggregate_rows(rows, impls, random, name, common, True, reps)
    return lines


def iqm_and_mean(scores: np.ndarray) -> np.ndarray:
    from rliable import metrics

    return np.array([metrics.aggregate_iqm(scores), metrics.aggregate_mean(scores)])


def aggregate_rows(rows, impls, random, name: str, envs: list[str], subset: bool, reps: int) -> list[str]:
    from rliable import library as rly

    scores = {i: s for i in impls if (s := normalized_scores(rows, envs, i, random)) is not None}
    if len(envs) < 2 or not scores:
        return []
    # Seeded, so that the same runs give the same intervals every time. rliable's stratified bootstrap draws from
    # numpy's global generator whatever its random_state says, so that is the one seeded (and restored after).
    global_state = np.random.get_state()  # noqa: NPY002 (the generator rliable uses)
    np.random.seed(0)  # noqa: NPY002
    try:
        points, intervals = rly.get_interval_estimates(scores, iqm_and_mean, reps=reps)
    finally:
        np.random.set_state(global_state)  # noqa: NPY002
    steps = ", ".join(sorted({CLEANRL[task_name(e)][3] for e in envs}))
    which = f" (the tasks all have: {', '.join(task_name(e) for e in envs)})" if subset else ""
    lines = [
        "",
        f"{name}, {len(envs)} tasks{which}: score = (return - random) / (CleanRL's published mean ({steps} steps) - "
        "random); 95% stratified-bootstrap intervals (rliable)",
        "",
        "| impl | seeds per task | IQM [95% CI] | mean [95% CI] |",
        "|---|--:|--:|--:|",
    ]
    for impl in scores:
        iqm, mean = points[impl]
        low, high = intervals[impl]
        lines.append(
            f"| {impl} | {scores[impl].shape[0]} | {iqm:.2f} [{low[0]:.2f}, {high[0]:.2f}] | "
            f"{mean:.2f} [{low[1]:.2f}, {high[1]:.2f}] |"
        )
    return lines


def report_lines(rows: list[dict], cfg: argparse.Namespace, command: str) -> list[str]:
    """The whole results file: header, the final-return table, the differences to the first of --impls, and, for
    tasks with a CleanRL figure, the tables beside it and the aggregates (two tasks or more)."""
    lines = [
        "# Learning",
        "",
        f"Command: `{command}`  ",
        f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine: {os.cpu_count()} cores, no GPU  ",
        "Final return: mean of the last 100 training episodes at the end of the run; ± is the sample standard "
        "deviation over seeds (n - 1) in every table but CleanRL's published figures, which are as its docs give them.",
        "",
        *final_return_table(rows),
        *unfinished_lines(getattr(cfg, "unfinished", [])),
        *difference_table(rows, cfg.impls[0]),
        *reference_tables(rows, cfg.impls),
    ]
    scored = sorted({r["env"] for r in rows if task_name(r["env"]) in CLEANRL})
    if len(scored) >= 2:
        random = random_returns(scored, os.path.join(cfg.runs_root, cfg.group, "random_returns.json"), cfg.python)
        lines += aggregate_table(rows, cfg.impls, random)
    return lines


def plot_grid(curves: dict, cfg: argparse.Namespace, path: str) -> None:
    """One panel per task: return against env steps, mean ± sample std over seeds for each implementation, and CleanRL's
    published final return as a dashed line."""
    plt = pyplot()
    envs = [e for e in cfg.envs if any(k[0] == e for k in curves)]
    columns = min(3, len(envs))
    panel_rows = -(-len(envs) // columns)
    fig, axes = plt.subplots(panel_rows, columns, figsize=(4.2 * columns, 3.2 * panel_rows))
    axes = np.atleast_1d(axes).reshape(-1)
    for ax, env_id in zip(axes, envs):
        for impl in cfg.impls:
            runs = curves.get((env_id, impl))
            if runs:
                plot_mean_and_std(ax, runs, 0, f"{impl} ({len(runs)} seeds)")
        if task_name(env_id) in CLEANRL:
            mean, _, _, steps = CLEANRL[task_name(env_id)]
            ax.axhline(mean, color="gray", linestyle="--", linewidth=1, label=f"CleanRL, published ({steps} steps)")
        ax.set_title(env_id, fontsize=9)
        ax.set_xlabel("env steps")
        ax.legend(fontsize=7)
    for ax in axes[len(envs) :]:
        ax.axis("off")
    axes[0].set_ylabel("return (last 100 episodes)")
    fig.suptitle("mean over seeds; band: ± sample std (n - 1)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_curves(curves: dict, cfg: argparse.Namespace, path: str) -> None:
    """One row per env: return against env steps (left) and against wall-clock seconds (right), mean ± sample std."""
    plt = pyplot()
    envs = [e for e in cfg.envs if any(k[0] == e for k in curves)]
    fig, axes = plt.subplots(len(envs), 2, figsize=(9, 3.2 * len(envs)), squeeze=False)
    for row_axes, env_id in zip(axes, envs):
        for impl in cfg.impls:
            runs = curves.get((env_id, impl))
            if runs:
                plot_mean_and_std(row_axes[0], runs, 0, impl)
                plot_mean_and_std(row_axes[1], runs, 1, impl)
        row_axes[0].set_xlabel("env steps")
        row_axes[1].set_xlabel("wall-clock seconds")
        for ax in row_axes:
            ax.set_ylabel("return (last 100 episodes)")
            ax.set_title(env_id, fontsize=9)
            ax.legend(fontsize=8)
    fig.suptitle("mean over seeds; band: ± sample std (n - 1)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
