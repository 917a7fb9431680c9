"""Distributed PPO on Ray: rollout actors sample environments in parallel, one learner trains.

    python dppo_ray.py --env-id HalfCheetah-v5 --num-actors 2 --mode async
    python dppo_ray.py --env-id CartPole-v1 --num-actors 2 --no-ray      # in-process, for a debugger

This file adds only what distribution needs to ppo_continuous.py, whose agent, sampler, update, numerical guard,
checkpoints and evaluation it imports: a change to the algorithm there reaches both scripts, and the checkpoints of
the two scripts fit each other.

Each `RolloutActor` is ppo_continuous.py's `Sampler` run as a Ray actor: it steps `--num-envs-per-actor` envs with a
numpy copy of the policy and returns its rollout as one dict of numpy arrays, tagged with the version of the policy
that produced it. The learner assembles batch = num_actors x num_envs_per_actor x num_steps env steps (CleanRL's
num_envs x num_steps), runs the PPO epochs (on a GPU with --cuda when one is present), and broadcasts the weights with
one `ray.put` every --sync-every updates.

--mode sync waits for every actor each iteration (a barrier), so with --sync-every 1 all data comes from the current
policy. --mode async consumes rollouts as they arrive while the actors keep sampling; --max-policy-lag bounds how stale
a rollout may be, and older ones are dropped and counted. The same script runs on a laptop's local Ray and, with
--ray-address auto, on a multi-node cluster.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import tyro
from tqdm import tqdm

import ppo_continuous as ppo
from run_utils import (
    PROG,
    Monitor,
    RunState,
    TrainingLoop,
    UsageError,
    cli,
    end_run,
    quiet_mujoco_log,
    ray_address_answers,
    require_positive,
    restore_training,
    resume_checkpoint,
    run_folder,
    save_atomic,
    seed_everything,
    training_checkpoint,
)


@dataclass
class Args(ppo.Args):
    """Every flag of ppo_continuous.py, with the same meaning, plus the distribution's. The rollout's shape is
    --num-actors x --num-envs-per-actor envs of --num-steps steps each."""

    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    env_id: str = "HalfCheetah-v5"
    """the id of the environment (Box or Discrete actions); `module:EnvId-v0` imports `module` in every actor"""
    num_envs: tyro.conf.Suppress[int] = 0
    """num_actors x num_envs_per_actor (computed in runtime)"""
    num_steps: int = 1024
    """the number of steps each actor runs in each environment per rollout"""

    # Distribution
    num_actors: int = 2
    """the number of Ray rollout actors (actor i seeds its envs from seed + 1000 * (i + 1))"""
    num_envs_per_actor: int = 1
    """the number of environments each actor steps"""
    mode: Literal["sync", "async"] = "sync"
    """sync: a barrier every iteration; async: the learner takes rollouts as they arrive while actors keep sampling"""
    sync_every: int = 1
    """broadcast the weights after every K learner updates (async mode also broadcasts whenever the --max-policy-lag
    window would otherwise close on every rollout in flight, so no combination can stall)"""
    max_policy_lag: int = 2
    """async: drop rollouts produced by a policy more than this many updates older than the learner's"""
    stale_correction: Literal["none", "decoupled"] = "none"
    """none: plain PPO on whatever policy sampled; decoupled: decoupled PPO (Hilton et al. 2021), see README"""
    max_is_weight: float = 100.0
    """decoupled: cap of the behaviour-to-proximal importance weight; like Hilton et al.'s reference code, it cuts only
    extreme ratios (1.0 would be V-trace's rho-bar, which also shrinks every step taken on stale data)"""
    ray_address: str | None = None
    """Ray cluster to join (`auto` for the one `ray start` set up on this node); default: start a local Ray"""
    actor_cpus: float | None = None
    """CPUs reserved for each rollout actor (fractions allowed); default: 1, or the free CPUs shared evenly when one
    each does not fit (an actor waiting on a slow env needs far less than a core)"""
    object_store_memory: int | None = None
    """bytes for the object store of a local Ray (default: Ray's choice)"""
    no_ray: tyro.conf.FlagCreatePairsOff[bool] = False
    """run the actors in this process, one after the other, so that a plain debugger can step through everything"""


def validate_args(args: Args) -> None:
    require_positive(args, ["num_actors", "num_envs_per_actor", "sync_every", "actor_cpus", "max_is_weight"])
    if args.max_policy_lag < 0:
        raise UsageError("--max-policy-lag must be >= 0")
    if args.no_ray and args.ray_address:
        raise UsageError("--no-ray and --ray-address do not fit together")
    if args.mode == "sync" and args.stale_correction != "none" and args.sync_every == 1:
        raise UsageError("--stale-correction needs stale data: use --mode async or --sync-every > 1")
    args.num_envs = args.num_actors * args.num_envs_per_actor
    shape = f"--num-actors {args.num_actors} x --num-envs-per-actor {args.num_envs_per_actor} x --num-steps"
    ppo.validate_args(args, batch_shape=f"{shape} {args.num_steps}")


# ---------------------------------------------------------------------------------------------------------------------
# Rollout actors
# ---------------------------------------------------------------------------------------------------------------------
class RolloutActor(ppo.Sampler):
    """ppo_continuous.py's Sampler, run as a Ray actor (`ray.remote(RolloutActor)`) or, with --no-ray, as a plain
    object. A restarted actor has lost its weights: it says so instead of sampling."""

    def __init__(self, *sampler_args):
        super().__init__(*sampler_args)
        ray_module = sys.modules.get("ray")
        in_ray = ray_module is not None and ray_module.is_initialized()
        self.node_id = ray_module.get_runtime_context().get_node_id() if in_ray else "local"

    def rollout(self, num_steps: int) -> dict[str, np.ndarray]:
        if self.policy is None:
            return {"needs_weights": np.array(True)}
        return super().rollout(num_steps) | {"node_id": np.array(self.node_id)}


class Done:
    """A finished call in --no-ray mode, standing in for a Ray ObjectRef."""

    def __init__(self, value=None, error: Exception | None = None):
        self.value, self.error = value, error


class ActorPool:
    """The rollout actors and the learner's side of talking to them: rollouts in flight, weight broadcasts, and
    re-syncing an actor that Ray restarted (max_restarts=-1, same constructor arguments) after it died."""

    def __init__(self, args: Args, ray_module, run_dir: str, state: RunState):
        self.ray = ray_module
        self.args = args
        self.counters = state.counters  # the run's event counts: restarts, lost and dropped rollouts
        actor_cls = RolloutActor
        if ray_module is not None:
            actor_cls = ray_module.remote(RolloutActor).options(num_cpus=args.actor_cpus, max_restarts=-1)
        video_dir = os.path.abspath(os.path.join(run_dir, "videos"))
        self.actors = []
        for index in range(args.num_actors):
            # A resumed run starts new random streams rather than replaying the first iterations' noise.
            seed = args.seed + 1000 * (index + 1) + state.global_step
            actor_args = dataclasses.replace(args, capture_video=args.capture_video and index == 0)
            init = (args.env_id, args.num_envs_per_actor, seed, actor_args, video_dir, True)
            self.actors.append(RolloutActor(*init) if ray_module is None else actor_cls.remote(*init))
        self.in_flight: dict = {}  # ref -> actor index
        self.weights_ref = None
        self.version = -1

    def call(self, index: int, method: str, *call_args):
        if self.ray is None:
            try:
                return Done(getattr(self.actors[index], method)(*call_args))
            except Exception as e:  # noqa: BLE001 (mirrors a failed Ray task)
                return Done(error=e)
        return getattr(self.actors[index], method).remote(*call_args)

    def get(self, ref):
        if self.ray is None:
            if ref.error is not None:
                raise ref.error
            return ref.value
        return self.ray.get(ref)

    def actor_errors(self) -> tuple[type[BaseException], ...]:
        return () if self.ray is None else (self.ray.exceptions.RayActorError,)

    def broadcast(self, weights: dict, version: int) -> float:
        """One ray.put of the numpy weights and observation statistics, then one small call per actor. Sync mode
        waits for the acknowledgements, so that the next rollouts surely use the new weights."""
        start = time.perf_counter()
        self.weights_ref = weights if self.ray is None else self.ray.put(weights)
        self.version = version
        acks = [self.call(i, "set_policy", self.weights_ref, version) for i in range(len(self.actors))]
        for ack in acks if self.args.mode == "sync" else []:
            try:
                self.get(ack)
            except self.actor_errors():
                pass  # the actor's next rollout call reports the failure, and it is re-synced then
        return time.perf_counter() - start

    def resync(self, index: int, why: str) -> None:
        """An actor that was restarted, for whatever reason, is counted, reported and sent the weights again."""
        self.counters["actor_restarts"] += 1
        tqdm.write(f"{PROG}: warning: actor {index} {why}; it is re-synced", file=sys.stderr)
        deadline = time.time() + 300  # waits out Ray's restart of the actor, on this node or another
        while True:
            try:
                self.get(self.call(index, "set_policy", self.weights_ref, self.version))
                return
            except self.actor_errors():
                if time.time() > deadline:
                    raise
                time.sleep(1.0)

    def submit(self, index: int) -> None:
        self.in_flight[self.call(index, "rollout", self.args.num_steps)] = index

    def gather(self, version: int, fast_acting: bool) -> tuple[list[dict], list[dict]]:
        """One batch: a rollout from each of --num-actors actors (sync), or the first --num-actors rollouts that are
        fresh enough (async, where an actor is sent its next rollout as soon as one arrives). Returns the accepted
        rollouts in actor order and the dropped ones, whose steps and episodes still count. Once the audit has moved
        acting to torch (`fast_acting` False), a rollout that the numpy actor acted on is dropped too."""
        if self.args.mode == "sync":
            for i in range(len(self.actors)):
                self.submit(i)
        accepted, dropped = {}, []
        while len(accepted) < len(self.actors):
            refs = list(self.in_flight)
            ready = refs if self.ray is None else self.ray.wait(refs, num_returns=1)[0]
            for ref in ready:
                index = self.in_flight.pop(ref)
                try:
                    rollout = self.get(ref)
                except self.actor_errors() as e:
                    self.counters["lost_rollouts"] += 1
                    self.resync(index, f"failed ({type(e).__name__}) and was restarted by Ray; its rollout is lost")
                    self.submit(index)
                    continue
                if "needs_weights" in rollout:
                    self.resync(index, "was restarted before a broadcast reached it")
                    self.submit(index)
                    continue
                if self.args.mode == "async":
                    self.submit(index)  # keep this actor sampling while the learner works
                    if version - int(rollout["policy_version"]) > self.args.max_policy_lag:
                        self.counters["dropped_rollouts"] += 1
                        dropped.append(rollout)
                        continue
                if bool(rollout["acted_fast"]) and not fast_acting:  # acted before the audit moved acting to torch
                    self.counters["discarded_rollouts"] += 1
                    dropped.append(rollout)
                    if self.args.mode == "sync":
                        self.submit(index)
                    continue
                accepted[(index, len(accepted))] = rollout
                if len(accepted) == len(self.actors):
                    break
        return [accepted[key] for key in sorted(accepted)], dropped


def stack_rollouts(rollouts: list[dict]) -> dict:
    """Several samplers' rollouts as one, their envs side by side (the columns of the (T, N) arrays)."""
    if len(rollouts) == 1:
        return rollouts[0]
    per_step = ("obs", "actions", "logprobs", "rewards", "discounted_returns", "terminations", "truncations")
    stacked = {k: np.concatenate([r[k] for r in rollouts], axis=1) for k in per_step}
    offsets = np.cumsum([0] + [r["rewards"].shape[1] for r in rollouts])
    stacked["final_index"] = np.concatenate([r["final_index"] + [0, off] for r, off in zip(rollouts, offsets)])
    return stacked | {k: np.concatenate([r[k] for r in rollouts]) for k in ("final_obs", "next_obs")}


def broadcast_due(args: Args, version: int, last_broadcast: int) -> bool:
    """Every --sync-every updates. In async mode also once the newest weights the actors have are --max-policy-lag
    updates old: a rollout of theirs that arrived later could only be dropped, and with nothing fresh to train on
    the learner would wait forever."""
    since = version - last_broadcast
    return since >= args.sync_every or (args.mode == "async" and since >= max(1, args.max_policy_lag))


# ---------------------------------------------------------------------------------------------------------------------
# Ray set-up
# ---------------------------------------------------------------------------------------------------------------------
def init_ray(args: Args):
    """Start or join Ray quietly; bad addresses and too few CPUs are usage errors."""
    if args.no_ray:
        return None
    import ray

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    # Workers inherit the driver's import path, so `module:EnvId` env ids and this repo's modules resolve in actors.
    here = os.path.dirname(os.path.abspath(__file__))
    pythonpath = os.pathsep.join(p for p in [here, os.getcwd(), os.environ.get("PYTHONPATH", "")] if p)
    runtime_env = {"env_vars": {"PYTHONPATH": pythonpath, "RAY_DEDUP_LOGS": "0"}}
    kwargs = dict(include_dashboard=False, logging_level=logging.ERROR, log_to_driver=True, runtime_env=runtime_env)
    if args.ray_address is None:
        kwargs["object_store_memory"] = args.object_store_memory
    elif args.object_store_memory is not None:
        raise UsageError("--object-store-memory applies to a local Ray; set it with `ray start` on a cluster")
    if args.ray_address not in (None, "auto", "local") and not ray_address_answers(args.ray_address):
        raise UsageError(f"cannot reach Ray at --ray-address {args.ray_address}: nothing answers there")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # "local" always starts a new Ray; ray.init() with no address would join whatever cluster on this
            # machine was started last (another user's run, a test cluster), against this script's documented default.
            ray.init(address=args.ray_address or "local", **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise UsageError(f"cannot reach Ray at --ray-address {args.ray_address}: {str(e).splitlines()[0]}") from None
    # Actors that do not fit would wait for CPUs forever: refuse at once, counting only what is free now.
    total_cpus, free_cpus = ray.cluster_resources().get("CPU", 0), ray.available_resources().get("CPU", 0)
    if args.actor_cpus is None:
        args.actor_cpus = 1.0 if args.num_actors <= free_cpus else math.floor(100 * free_cpus / args.num_actors) / 100
        if args.actor_cpus < 1:
            print(
                f"{PROG}: {args.num_actors} actors share {free_cpus:g} free CPUs: --actor-cpus {args.actor_cpus:g} each"
            )
    needed = args.num_actors * args.actor_cpus
    if needed > free_cpus or args.actor_cpus <= 0:
        ray.shutdown()
        raise UsageError(
            f"--num-actors {args.num_actors} x --actor-cpus {args.actor_cpus} needs {needed:g} CPUs; the cluster has "
            f"{free_cpus:g} free of {total_cpus:g} (use fractional --actor-cpus to share cores)"
        )
    return ray


# ---------------------------------------------------------------------------------------------------------------------
# Training: ppo_continuous.py's loop, with "gather rollouts from the actors" for the rollout and a broadcast after
# ---------------------------------------------------------------------------------------------------------------------
def train(args: Args) -> int:
    ckpt = resume_checkpoint(args)
    quiet_mujoco_log()
    env = ppo.make_env(args.env_id)  # a bad env id fails here, before Ray starts
    space = env.action_space
    bounds = [space.low, space.high] if hasattr(space, "low") else None
    spaces = (*ppo.check_spaces(args.env_id, env, allow_discrete=True), env.obs_layout, bounds)
    env.close()
    device = seed_everything(args)
    run_dir = run_folder(args)
    ray = init_ray(args)
    try:
        return learn(args, ray, ckpt, spaces, run_dir, device)
    except Exception as e:
        if ray is None or not isinstance(e, ray.exceptions.RayTaskError):
            raise  # in --no-ray mode an error in an env keeps its full traceback, for the debugger
        # An exception inside an actor (usually the env's step or reset): report its last line, not Ray's wrapping.
        last_line = [line for line in str(e).strip().splitlines() if line.strip()][-1]
        print(f"{PROG}: error: a rollout actor failed: {last_line}", file=sys.stderr)
        return 1
    finally:
        if ray is not None:
            ray.shutdown()


def decouple(batch: dict, agent) -> dict:
    """--stale-correction decoupled (Hilton et al. 2021): the clip is anchored to the learner's current policy (the
    proximal one), and the policy that sampled the data becomes the behaviour policy of gae.ppo_loss's weight."""
    with torch.no_grad():
        batch["behaviour_logprobs"] = batch["logprobs"]
        batch["logprobs"] = agent.evaluate(batch["obs"], batch["actions"])[0]
    return batch


def learn(args: Args, ray, ckpt: dict | None, spaces: tuple, run_dir: str, device) -> int:
    """The learner: agent, optimizer and statistics (restored from `ckpt` on --resume), the actors, the loop.
    `spaces`: the env's (obs_dim, act_dim, discrete, obs_layout, action_bounds)."""
    obs_dim, act_dim, discrete, obs_layout, action_bounds = spaces
    learner = ppo.make_learner(args, obs_dim, act_dim, discrete, device)
    learner.agent.obs_layout = obs_layout
    learner.agent.action_bounds = action_bounds
    state = RunState() if ckpt is None else restore_training(ckpt, learner, args.resume)
    for key in ("dropped_rollouts", "actor_restarts", "lost_rollouts", "discarded_rollouts"):
        state.counters.setdefault(key, 0)
    decoupled = args.stale_correction == "decoupled"
    ppo.start_fast_paths(learner, args, decoupled)
    pool = ActorPool(args, ray, run_dir, state)
    if ckpt is None and args.norm_obs and args.obs_warmup_steps:
        for ref in [pool.call(i, "warm_up", args.obs_warmup_steps) for i in range(args.num_actors)]:
            learner.obs_rms.update_from_moments(*pool.get(ref))
    monitor = Monitor(args, run_dir, state, act_dim, learner.fast)
    actor_nodes: set[str] = set()

    def save_checkpoint() -> None:
        save_atomic(training_checkpoint(learner, args, state, monitor), os.path.join(run_dir, "checkpoint.pt"))

    sync_seconds = pool.broadcast(ppo.policy_weights(learner), state.iteration)
    last_broadcast = state.iteration
    learner_seconds = {"wait": 0.0, "prepare": 0.0, "update": 0.0, "broadcast": sync_seconds}  # where its time goes
    if args.mode == "async":
        for i in range(args.num_actors):
            pool.submit(i)
    with TrainingLoop(run_dir) as loop:
        while state.iteration < args.num_iterations and loop.signum is None:
            version = state.iteration  # the learner's policy version: the number of updates so far
            ent_coef = ppo.anneal(learner.optimizer, args, version + 1)
            wait_start = time.perf_counter()
            discarded = True
            while discarded:  # rollouts that a wrong actor acted on are sampled again, the actors acting with torch
                rollouts, dropped = pool.gather(version, learner.fast.acting)
                for rollout in dropped + rollouts:
                    state.global_step += rollout["rewards"].size
                    monitor.episodes(rollout)
                    ppo.update_statistics(rollout, learner, args)
                discarded = ppo.discard_wrongly_acted(learner, rollouts, version + 1, state.counters)
                if discarded:
                    pool.broadcast(ppo.policy_weights(learner), version)
            wait_seconds = time.perf_counter() - wait_start
            lags = [version - int(r["policy_version"]) for r in rollouts]
            actor_speed = float(np.mean([r["rewards"].size / float(r["sample_seconds"]) for r in rollouts]))
            actor_nodes.update(str(r["node_id"]) for r in rollouts)
            batch = ppo.prepare_batch(learner, stack_rollouts(rollouts), args)
            if decoupled:
                batch = decouple(batch, learner.agent)
            update_start = time.perf_counter()
            learner_seconds["prepare"] += update_start - wait_start - wait_seconds
            stats, problem = ppo.ppo_update(learner, batch, args, ent_coef, version + 1)
            update_seconds = time.perf_counter() - update_start
            learner_seconds["wait"] += wait_seconds
            learner_seconds["update"] += update_seconds
            state.iteration += 1
            if broadcast_due(args, state.iteration, last_broadcast):
                sync_seconds = pool.broadcast(ppo.policy_weights(learner), state.iteration)
                last_broadcast = state.iteration
                learner_seconds["broadcast"] += sync_seconds
            extra = {
                "charts/learning_rate": learner.optimizer.param_groups[0]["lr"],
                "charts/ent_coef": ent_coef,
                "charts/policy_lag_min": min(lags),
                "charts/policy_lag_max": max(lags),
                "charts/policy_lag_mean": float(np.mean(lags)),
                "charts/dropped_rollouts": state.counters["dropped_rollouts"],
                "charts/actor_restarts": state.counters["actor_restarts"],
                "charts/lost_rollouts": state.counters["lost_rollouts"],
                "perf/learner_update_seconds": update_seconds,
                "perf/learner_wait_seconds": wait_seconds,
                "perf/weight_sync_seconds": sync_seconds,
                "perf/actor_env_steps_per_second": actor_speed,
            }
            updated = monitor.update(stats, problem, batch, extra)
            if updated and args.checkpoint_every and state.iteration % args.checkpoint_every == 0:
                save_checkpoint()
    if loop.keeps_state:
        save_checkpoint()
    extra = {
        "learner_updates": state.iteration,
        "actor_nodes": len(actor_nodes),
        "learner_seconds": {k: round(v, 2) for k, v in learner_seconds.items()},
    }
    eval_failed = end_run(monitor, loop.status, learner, state, ppo, extra)
    return loop.exit_status() or eval_failed


if __name__ == "__main__":
    sys.exit(cli(Args, validate_args, train, ppo))
