"""Where one iteration of ppo_continuous.py spends its time, at CleanRL's defaults (no learning, no files written).

    python benchmarks/iteration_profile.py                         # HalfCheetah-v5, about 30 s on 2 cores
    python benchmarks/iteration_profile.py --env-id Hopper-v5 --quick

- The update: ms per minibatch of `ppo_update` with the compiled gradient (torch.compile of clipped_gradient,
  autograd through Agent and gae.ppo_loss, what a default run trains with) against the same function run eagerly
  (what --no-compile and --no-fast-path run), each step taken by make_learner's optimizer, on a random batch of the
  env's shapes. Best of --repeats, after a first update that compiles (its time is reported too).
- The rollout: us per env step of `Sampler.rollout` (what ppo_continuous.py and every DPPO actor run) against the
  bare `env.step` loop with the same envs, and the share of the rollout spent outside `env.step`.
- The acting audit: ms per iteration of audit_acting (the numpy actor against TorchActor on a real rollout), as a
  share of the iteration (the rollout plus the update).
Prints a markdown table; with --out, writes it to that file too.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import print_report  # noqa: E402

import ppo_continuous as ppo  # noqa: E402
from fast_paths import audit_acting  # noqa: E402


def best_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def profile_update(args: ppo.Args, obs_dim: int, act_dim: int, repeats: int) -> dict:
    n = args.num_envs * args.num_steps
    g = torch.Generator().manual_seed(0)
    batch = {k: torch.randn(n, generator=g) for k in ("logprobs", "advantages", "values", "returns")}
    batch["obs"] = torch.randn(n, obs_dim, generator=g)
    batch["actions"] = torch.randn(n, act_dim, generator=g)
    batch["size"] = n
    cpu = torch.device("cpu")
    loss_kwargs = ppo.loss_settings(args, args.ent_coef)
    minibatches = args.update_epochs * args.num_minibatches
    times = {}
    for name, compiled in (("compiled", True), ("eager", False)):
        learner = ppo.make_learner(args, ppo.Agent(obs_dim, act_dim), cpu)
        ppo.start_fast_paths(learner, dataclasses.replace(args, compile=compiled))
        start = time.perf_counter()
        ppo.ppo_update(learner, batch, args, loss_kwargs, 1)
        times[f"{name}_first_s"] = time.perf_counter() - start
        seconds = best_seconds(lambda learner=learner: ppo.ppo_update(learner, batch, args, loss_kwargs, 1), repeats)
        times[f"{name}_ms"] = 1000 * seconds / minibatches
    times["update_ms"] = times["compiled_ms"] * minibatches
    return times


def profile_rollout(args: ppo.Args, steps: int, repeats: int) -> dict:
    """A single run's Sampler.rollout, with a learner of its own, against the bare env.step loop over its envs."""
    seeds = 1
    samplers = [ppo.Sampler(args.env_id, args.num_envs, args.seed, args)]
    for sampler in samplers:
        learner = ppo.make_learner(args, ppo.Agent(*sampler.spaces), torch.device("cpu"))
        learner.obs_rms.update_from_moments(*sampler.warm_up(256))
        ppo.start_fast_paths(learner, args)
        sampler.set_policy(ppo.policy_weights(learner))
    rollout = best_seconds(lambda: samplers[0].rollout(steps), repeats)
    sampler = samplers[0]
    sample = sampler.rollout(steps)
    noise = sampler.draw_noise(sample["rewards"].shape)  # the audit's cost does not depend on which noise
    plain = sampler.make_actor(False)
    audit = best_seconds(
        lambda: audit_acting(sampler.policy, plain, sample["obs"], noise, sample["actions"], sample["logprobs"]),
        repeats,
    )
    rng = np.random.default_rng(0)
    space = sampler.action_space
    actions = rng.uniform(space.low, space.high, size=(steps, seeds, args.num_envs, *space.shape))

    def bare_steps() -> None:
        for step in range(steps):
            for k, each in enumerate(samplers):
                ppo.step_envs(each.envs, actions[step, k])

    bare = best_seconds(bare_steps, repeats)
    for each in samplers:
        each.close()
    per_step = 1e6 / (steps * seeds * args.num_envs)
    return dict(
        rollout_us=rollout * per_step,
        env_us=bare * per_step,
        outside=1 - bare / rollout,
        overhead=rollout / bare - 1,
        rollout_ms=1000 * rollout / seeds,
        audit_acting_ms=1000 * audit,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="iteration_profile.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--env-id", default="HalfCheetah-v5", help="env whose shapes and steps are timed")
    p.add_argument("--repeats", type=int, default=3, help="best of this many timings (default: 3)")
    p.add_argument("--quick", action="store_true", help="smoke test: one epoch, 256 steps, one repeat")
    p.add_argument("--out", default=None, help="also write the table to this file")
    cfg = p.parse_args(argv)
    torch.set_num_threads(1)
    args = ppo.Args(env_id=cfg.env_id, update_epochs=1 if cfg.quick else 10)
    steps, repeats = (256, 1) if cfg.quick else (args.num_steps, cfg.repeats)
    try:
        ppo.validate_args(args)  # the batch and minibatch sizes, as a run computes them
        rollout = profile_rollout(args, steps, repeats)
    except ppo.UsageError as e:
        print(f"iteration_profile.py: error: {e}", file=sys.stderr)
        return 2
    env = ppo.make_env(args.env_id)
    update = profile_update(args, env.observation_space.shape[0], env.action_space.shape[0], repeats)
    lines = [
        f"{args.env_id}, CleanRL's defaults ({args.num_envs} env x {args.num_steps} steps, {args.num_minibatches} "
        f"minibatches, {args.update_epochs} epochs), torch {torch.__version__}, 1 thread, best of {repeats}" + ":",
        "",
        "| part | this repo | reference | ratio |",
        "|---|--:|--:|--:|",
        f"| update, ms per minibatch (reference: the eager gradient) | {update['compiled_ms']:.3f} | "
        f"{update['eager_ms']:.3f} | {update['eager_ms'] / update['compiled_ms']:.2f}x |",
        f"| rollout, us per env step (reference: bare env.step loop) | {rollout['rollout_us']:.1f} | "
        f"{rollout['env_us']:.1f} | {rollout['outside']:.0%} of the rollout outside env.step, "
        f"{rollout['overhead']:.2f} of env.step's cost |",
    ]
    iteration_ms = rollout["rollout_ms"] * args.num_steps / steps + update["update_ms"]
    audit_ms = rollout["audit_acting_ms"] * args.num_steps / steps
    lines += [
        "",
        f"The first update, which compiles: {update['compiled_first_s']:.1f} s (eager: "
        f"{update['eager_first_s']:.2f} s). The acting audit, per iteration: {audit_ms:.2f} ms of an iteration of "
        f"{iteration_ms:.0f} ms (rollout plus update): **{audit_ms / iteration_ms:.2%}**.",
    ]
    print_report(lines, cfg.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
