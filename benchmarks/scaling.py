"""DPPO throughput as actors are added, against linear scaling (and RLlib PPO with as many env runners).

    python benchmarks/scaling.py                   # 1, 2, 4, 8 actors on a 5 ms-latency env: 4 runs
    python benchmarks/scaling.py --envs HalfCheetah-v5 --actors 1 2 4
    python benchmarks/scaling.py --rllib           # adds RLlib PPO, from its own venv benchmarks/.venv-rllib
    python benchmarks/scaling.py --quick           # smoke test: 1 and 2 actors, a few short updates
    python benchmarks/scaling.py --actors 1 2 8 16 32 --name scaling_32    # up to 32 actors

Every run is dppo_ray.py in async mode with one env per actor and the same per-actor rollout, minibatch size and
epochs, so the batch grows with the actors. Throughput is measured in steady state, from the learner's first update
to its last (actor start-up excluded), from the TensorBoard event times; the whole-run rate is reported beside it,
and so is start-up: the seconds from the process's start (Ray, the learner, the actors' processes and envs, the first
rollouts, the first update and its compile) to the learner's first logged update.
Writes <out-dir>/scaling.md and <out-dir>/scaling.png. The default <out-dir> is a new folder
benchmarks/results/local/<UTC date-time>/, which git ignores; --update-committed writes into benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

from common import (
    REPO,
    BenchError,
    HelpFormatter,
    add_output_args,
    cpu_model,
    display_command,
    json_result,
    package_version,
    pyplot,
    relative_to_cwd,
    resolve_out_dir,
    timed_subprocess,
    venv_python,
    venvs_epilog,
)
from throughput_report import git_commit

LATENCY_ENV = "benchmarks.envs:SlowPendulum-v1"


def update_times(run_dir: str) -> tuple[float, float]:
    """The steady-state rate (env steps/s from the learner's first logged update to its last) and the wall-clock time
    of the first logged update."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    acc.Reload()
    events = acc.Scalars("losses/approx_kl")
    if len(events) < 3:
        raise SystemExit(f"scaling.py: error: too few updates in {run_dir} to measure a steady state")
    return (events[-1].step - events[0].step) / (events[-1].wall_time - events[0].wall_time), events[0].wall_time


def run_dppo(env_id: str, actors: int, cfg: argparse.Namespace) -> dict:
    cores = os.cpu_count() or 1
    actor_cpus = min(1.0, cores / actors)
    total = actors * cfg.num_steps * cfg.updates
    argv = [os.path.join(REPO, "dppo_ray.py"), f"--env-id={env_id}", "--mode=async"]
    argv += [f"--num-actors={actors}", "--num-envs-per-actor=1", f"--num-steps={cfg.num_steps}"]
    argv += [f"--num-minibatches={actors}", "--update-epochs=4", f"--total-timesteps={total}"]
    argv += [f"--actor-cpus={actor_cpus:g}", "--max-policy-lag=4", "--no-cuda", "--quiet", "--run-name=s"]
    with tempfile.TemporaryDirectory(prefix="scaling_") as cwd:
        started = time.time()
        _, seconds = timed_subprocess(f"dppo with {actors} actors", argv, cwd)
        with open(os.path.join(cwd, "runs", "s", "summary.json")) as f:
            summary = json.load(f)
        steady, first_update = update_times(os.path.join(cwd, "runs", "s"))
    steps = summary["env_steps"]
    return {
        "steady": steady,
        "whole": steps / seconds,
        "steps": steps,
        "actor_cpus": actor_cpus,
        "first_update": first_update - started,
    }


def run_rllib(python: str, env_id: str, runners: int, cfg: argparse.Namespace) -> dict:
    cores = os.cpu_count() or 1
    argv = [os.path.join(REPO, "benchmarks", "rllib_ppo.py"), f"--env-id={env_id}"]
    argv += [f"--num-env-runners={runners}", f"--env-runner-cpus={min(1.0, cores / runners):g}"]
    argv += [f"--train-batch-size={runners * cfg.num_steps}", f"--minibatch-size={cfg.num_steps}", "--num-epochs=4"]
    argv += [f"--total-timesteps={runners * cfg.num_steps * cfg.updates}"]
    with tempfile.TemporaryDirectory(prefix="scaling_rllib_") as cwd:
        stdout, seconds = timed_subprocess(f"rllib with {runners} env runners", argv, cwd, python=python)
    out = json_result("rllib", stdout)
    return {"steady": float(out["sps"]), "whole": out["total_timesteps"] / seconds, "steps": out["total_timesteps"]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scaling.py", description=__doc__, formatter_class=HelpFormatter, epilog=venvs_epilog(["rllib"])
    )
    p.add_argument("--envs", nargs="+", default=[LATENCY_ENV], help=f"env ids (default: {LATENCY_ENV})")
    p.add_argument("--actors", nargs="+", type=int, default=[1, 2, 4, 8], help="actor counts (default: 1 2 4 8)")
    p.add_argument(
        "--num-steps", type=int, default=256, help="per-actor rollout length, also the minibatch size (default: 256)"
    )
    p.add_argument("--updates", type=int, default=24, help="learner updates per run (default: 24)")
    p.add_argument(
        "--rllib",
        action="store_true",
        help="also run RLlib PPO with as many env runners (needs the RLlib venv, benchmarks/.venv-rllib)",
    )
    p.add_argument(
        "--rllib-python",
        default=None,
        metavar="PYTHON",
        help="python of the RLlib venv; implies --rllib (default: benchmarks/.venv-rllib/bin/python in this "
        "repository)",
    )
    add_output_args(p, "scaling.md and scaling.png")
    p.add_argument(
        "--name", default="scaling", help="file name of the table and plot, without extension (default: scaling)"
    )
    p.add_argument("--quick", action="store_true", help="smoke test: 1 and 2 actors, 64-step rollouts, 6 updates")
    cfg = p.parse_args(argv)
    if cfg.quick:
        cfg.actors = [1, 2]
        cfg.num_steps = 64
        cfg.updates = 6
    cfg.rllib = cfg.rllib or cfg.rllib_python is not None
    cfg.out_dir = resolve_out_dir(cfg)
    return cfg


def run_all(cfg: argparse.Namespace) -> list[dict]:
    """One row per env and actor count: dppo, then RLlib with as many env runners when asked."""
    rows = []
    for env_id in cfg.envs:
        for actors in cfg.actors:
            print(f"{env_id}: dppo with {actors} actors ...", file=sys.stderr, flush=True)
            rows.append({"env": env_id, "impl": "dppo", "actors": actors, **run_dppo(env_id, actors, cfg)})
            if cfg.rllib:
                print(f"{env_id}: rllib with {actors} env runners ...", file=sys.stderr, flush=True)
                rllib = run_rllib(cfg.rllib_python, env_id, actors, cfg)
                rows.append({"env": env_id, "impl": "rllib", "actors": actors, **rllib})
    return rows


def scaling_table(rows: list[dict], cfg: argparse.Namespace, command: str) -> list[str]:
    """The results file: each row's speed-up over the fewest actors of its env and implementation, and that speed-up
    as a share of linear."""
    lines = [
        "# DPPO scaling",
        "",
        f"Command: `{command}`  ",
        f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}  ",
        f"Machine: {os.cpu_count()} cores ({cpu_model()}), no GPU  ",
        f"Versions: Python {platform.python_version()}, ray {package_version('ray')}, torch "
        f"{package_version('torch')}; repo at {git_commit()}  ",
        f"Per actor: 1 env, {cfg.num_steps}-step rollouts; minibatch {cfg.num_steps}; 4 epochs; async mode.",
        "",
        "| env | impl | actors | steady-state env steps/s | whole-run env steps/s | speed-up | efficiency vs linear "
        "| first update, s |",
        "|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    for row in rows:
        base = next(
            r for r in rows if r["env"] == row["env"] and r["impl"] == row["impl"] and r["actors"] == min(cfg.actors)
        )
        speedup = row["steady"] / base["steady"]
        efficiency = speedup / (row["actors"] / base["actors"])
        lines.append(
            f"| {row['env']} | {row['impl']} | {row['actors']} | {row['steady']:,.0f} | {row['whole']:,.0f} | "
            f"{speedup:.2f}x | {efficiency:.0%} | {first_update_cell(row)} |"
        )
    return lines


def first_update_cell(row: dict) -> str:
    """Seconds from the process's start to the learner's first logged update (dppo); RLlib logs no event to time."""
    return f"{row['first_update']:.1f}" if "first_update" in row else "—"


def plot_scaling(rows: list[dict], envs: list[str], path: str) -> None:
    """Steady-state steps/s against actors, one panel per env, log-log, with dppo's linear scaling dotted."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(envs), figsize=(4.5 * len(envs), 3.6), squeeze=False)
    for ax, env_id in zip(axes[0], envs):
        for impl, style in (("dppo", "o-"), ("rllib", "s--")):
            points = [r for r in rows if r["env"] == env_id and r["impl"] == impl]
            if points:
                ax.plot([r["actors"] for r in points], [r["steady"] for r in points], style, label=impl)
        dppo = [r for r in rows if r["env"] == env_id and r["impl"] == "dppo"]
        ax.plot(
            [r["actors"] for r in dppo],
            [dppo[0]["steady"] * r["actors"] / dppo[0]["actors"] for r in dppo],
            ":",
            color="gray",
            label="linear",
        )
        ax.set_xlabel("actors (RLlib: env runners)")
        ax.set_ylabel("env steps/s (steady state)")
        ax.set_title(env_id.split(":")[-1], fontsize=9)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cfg = parse_args(argv)
    if cfg.rllib:
        cfg.rllib_python = venv_python("rllib", cfg.rllib_python)  # before any run: one line if it is missing
    os.makedirs(cfg.out_dir, exist_ok=True)
    rows = run_all(cfg)
    lines = scaling_table(rows, cfg, display_command([os.path.abspath(__file__), *argv]))
    with open(os.path.join(cfg.out_dir, f"{cfg.name}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot_scaling(rows, cfg.envs, os.path.join(cfg.out_dir, f"{cfg.name}.png"))
    print(f"wrote {relative_to_cwd(os.path.join(cfg.out_dir, cfg.name))}.md and .png", file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as e:
        sys.exit(f"scaling.py: error: {e}")
