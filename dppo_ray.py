"""Distributed PPO on Ray: rollout actors sample environments in parallel, one learner trains.

    python dppo_ray.py --env-id HalfCheetah-v5 --num-actors 2 --mode async
    python dppo_ray.py --env-id CartPole-v1 --num-actors 2 --no-ray      # in-process, for a debugger

This file adds only what distribution needs to ppo_continuous.py. The learner runs that file's run: start_run, its
training_loop (and so whatever the loop calls: sample_rollout, rollout_batch, ppo_update, log_update and the
checkpoints it saves) and finish_run, with the actors in the place of its Sampler (ActorSampler): a change to the
algorithm or the loop there reaches both scripts, and the checkpoints of the two scripts fit each other. The sampler is
where distribution enters the loop: its rollout is the actors' batch, and its anchor step is the stale-data
correction. What only this script needs lives here: the rollout actors and their faults, staleness and its
correction, Ray, and Discrete actions (CartPole, say).

Each `RolloutActor` is ppo_continuous.py's `Sampler` run as a Ray actor: it steps `--num-envs-per-actor` envs with its
own copy of the policy (numpy where the mirror matches, torch otherwise and for Discrete actions) and returns its
rollout as one dict of numpy arrays, tagged with the version of the policy that produced it. The learner assembles
batch = num_actors x num_envs_per_actor x num_steps env steps (CleanRL's num_envs x num_steps), runs the PPO epochs
(on a GPU with --cuda when one is present), and broadcasts the weights with one `ray.put` every --sync-every updates.

--mode sync waits for every actor each iteration (a barrier), so with --sync-every 1 all data comes from the current
policy. --mode async consumes rollouts as they arrive while the actors keep sampling; --max-policy-lag bounds how stale
a rollout may be, and older ones are dropped and counted. The same script runs on a laptop's local Ray and, with
--ray-address auto, on a multi-node cluster.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
import tyro
from torch.distributions import Categorical, Distribution
from tqdm import tqdm

import checkpoints
import gae
import ppo_continuous as ppo
from checkpoints import UsageError, resume_checkpoint
from fast_paths import failure
from ray_cluster import ClusterError, connect, cpu_counts, refuse_what_does_not_fit
from run_management import (
    PROG,
    Interrupted,
    Run,
    StopRun,
    TrainingLoop,
    box_spaces,
    cli,
    finish_run,
    require_positive,
    rollout_timeout,
    say_rounded_timesteps,
    seed_everything,
)
from run_record import last_line

make_env = ppo.make_env  # what a saved policy of this script is evaluated in (checkpoints.Policy)

# The flags of this script that a resumed run may change besides ppo_continuous.py's: how it uses the machine
MACHINE_FLAGS = checkpoints.MACHINE_FLAGS | {
    "actor_cpus",
    "object_store_memory",
    "no_ray",
    "max_actor_restarts",
}

# CleanRL's flags that this script has no field for, each refused in one line that says what to give instead
SEEDS_ARE_PPOS = "is ppo_continuous.py's: run each seed of dppo_ray.py as a run of its own (or sweep them with "
SEEDS_ARE_PPOS += "benchmarks/learning.py)"
REFUSED_FLAGS = {
    "--num-envs": "is ppo_continuous.py's: dppo_ray.py steps --num-actors x --num-envs-per-actor envs (for CleanRL's "
    "--num-envs N, give --num-actors N)",
    "--num-seeds": SEEDS_ARE_PPOS,
    "--seed-processes": SEEDS_ARE_PPOS,
    "--grid": SEEDS_ARE_PPOS,
}


@dataclass
class Args(ppo.Args):
    """Every flag of ppo_continuous.py, with the same meaning, plus the distribution's; but the rollout's shape is
    --num-actors x --num-envs-per-actor envs of --num-steps steps each (ppo_continuous.py's num-envs flag is refused
    in one line, REFUSED_FLAGS), and --num-seeds is ppo_continuous.py's alone."""

    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    env_id: str = "HalfCheetah-v5"
    """the id of the environment (Box or Discrete actions); `module:EnvId-v0` imports `module` in every actor"""
    num_envs: tyro.conf.Suppress[int] = 0
    """num_actors x num_envs_per_actor (computed in runtime)"""
    num_seeds: tyro.conf.Suppress[int] = 1
    """ppo_continuous.py's (refused here, REFUSED_FLAGS)"""
    seed_processes: tyro.conf.Suppress[int] = 0
    """ppo_continuous.py's (refused here, REFUSED_FLAGS)"""
    grid: tyro.conf.Suppress[list[str]] = dataclasses.field(default_factory=list)
    """ppo_continuous.py's (refused here, REFUSED_FLAGS)"""
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
    stale_correction: Literal["auto", "none", "decoupled"] = "auto"
    """none: plain PPO on whatever policy sampled; decoupled: decoupled PPO (Hilton et al. 2021), see README; auto:
    decoupled where the data can be stale (--mode async, or --sync-every above 1), none where it cannot"""
    max_is_weight: float = 100.0
    """decoupled: cap of the behaviour-to-proximal importance weight; like Hilton et al.'s reference code, it cuts only
    extreme ratios (1.0 would be V-trace's rho-bar, which also shrinks every step taken on stale data)"""
    rollout_timeout: float = 0.0
    """seconds an actor may take for a rollout (or to take a broadcast) before it is restarted and its rollout counted
    lost; 0: 60 s plus 20 ms per env step of a rollout (--num-envs-per-actor x --num-steps). --no-ray: the actors'
    rollouts together may take --num-actors times that, past which the run stops as ppo_continuous.py's does"""
    max_actor_restarts: int = 20
    """actor restarts the run rides out (a crashed or timed-out actor, a lost node); one more stops it with a
    checkpoint and one line naming the cause. Raise it on a cluster whose nodes come and go"""
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
    if args.max_actor_restarts < 0:
        raise UsageError("--max-actor-restarts must be >= 0")
    if args.no_ray and args.ray_address:
        raise UsageError("--no-ray and --ray-address do not fit together")
    can_be_stale = args.mode == "async" or args.sync_every > 1
    if args.stale_correction == "auto":
        args.stale_correction = "decoupled" if can_be_stale else "none"
    elif args.stale_correction != "none" and not can_be_stale:
        raise UsageError("--stale-correction needs stale data: use --mode async or --sync-every > 1")
    args.num_envs = args.num_actors * args.num_envs_per_actor
    shape = f"--num-actors {args.num_actors} x --num-envs-per-actor {args.num_envs_per_actor} x --num-steps"
    ppo.validate_args(args, batch_shape=f"{shape} {args.num_steps}")


# ---------------------------------------------------------------------------------------------------------------------
# Discrete actions: ppo_continuous.py's Agent with a categorical over the same actor's outputs
# ---------------------------------------------------------------------------------------------------------------------
class Agent(ppo.Agent):
    """ppo_continuous.py's Agent (its Gaussian for Box actions, so an edit there reaches this script) or, with
    `discrete`, a categorical whose logits are the actor's outputs."""

    def __init__(self, obs_dim: int, act_dim: int, discrete: bool = False):
        super().__init__(obs_dim, act_dim)
        self.discrete = discrete  # saved with the policy, to rebuild it
        if discrete:
            del self.actor_logstd

    def get_distribution(self, x: torch.Tensor) -> Distribution:
        if not self.discrete:
            return super().get_distribution(x)
        return Categorical(logits=self.actor_mean(x), validate_args=False)


class CategoricalActor(ppo.TorchActor):
    """Acting with a categorical policy: inverse-CDF sampling from the rollout's uniform noise, (N, 1)."""

    def act(self, obs: np.ndarray, noise: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            logits = self.agent.get_distribution(torch.from_numpy(obs)).logits
        cumulative = logits.double().softmax(-1).cumsum(-1).numpy()
        index = (cumulative < noise * cumulative[..., -1:]).sum(axis=-1)
        return np.minimum(index, cumulative.shape[-1] - 1)


def check_spaces(env_id: str, env: gym.Env) -> tuple[int, int, bool]:
    """(obs_dim, action_dim or number of actions, discrete): ppo_continuous.py's check, with Discrete actions too."""
    if not isinstance(env.action_space, gym.spaces.Discrete):
        if not isinstance(env.action_space, gym.spaces.Box):
            raise UsageError(f"{env_id} has a {env.action_space} action space; {PROG} needs a Box or Discrete one")
        return (*box_spaces(env_id, env), False)
    space = env.observation_space
    if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
        raise UsageError(f"{env_id} has observation space {space}; a Box, Dict or Tuple is needed")
    return space.shape[0], int(env.action_space.n), True


# ---------------------------------------------------------------------------------------------------------------------
# Rollout actors
# ---------------------------------------------------------------------------------------------------------------------
class RolloutActor(ppo.Sampler):
    """ppo_continuous.py's Sampler, run as a Ray actor (`ray.remote(RolloutActor)`) or, with --no-ray, as a plain
    object. Its rollouts carry the version of the policy that sampled them (for the staleness bound and its
    correction) and where and how fast they were sampled. A restarted actor has lost its weights: it says so instead
    of sampling."""

    def __init__(self, *sampler_args):
        super().__init__(*sampler_args)
        ray_module = sys.modules.get("ray")
        in_ray = ray_module is not None and ray_module.is_initialized()
        self.node_id = ray_module.get_runtime_context().get_node_id() if in_ray else ""  # no node: --no-ray
        self.version = -1

    def check_spaces(self, env_id: str, env: gym.Env) -> tuple[int, int]:
        obs_dim, act_dim, self.discrete = check_spaces(env_id, env)
        return obs_dim, act_dim

    def make_agent(self) -> Agent:
        return Agent(*self.spaces, discrete=self.discrete)

    def make_actor(self, fast: bool):
        return CategoricalActor(self.agent) if self.discrete else super().make_actor(fast)

    def draw_noise(self, shape: tuple[int, ...]) -> np.ndarray:
        return self.rng.random((*shape, 1)) if self.discrete else super().draw_noise(shape)

    def env_action(self, action: np.ndarray) -> np.ndarray:
        return action if self.discrete else super().env_action(action)

    def set_policy(self, weights: dict[str, np.ndarray], version: int) -> int:
        super().set_policy(weights)
        self.version = version
        return version

    def started(self) -> str:
        return self.node_id

    def rollout(self, num_steps: int) -> dict[str, np.ndarray]:
        if self.policy is None:
            return {"needs_weights": np.array(True)}
        start = time.perf_counter()
        rollout = super().rollout(num_steps)
        rollout["sample_seconds"] = np.array(time.perf_counter() - start)
        return rollout | {"policy_version": np.array(self.version), "node_id": np.array(self.node_id)}


class Done:
    """A finished call in --no-ray mode, standing in for a Ray ObjectRef."""

    def __init__(self, value=None, error: Exception | None = None):
        self.value, self.error = value, error


STARTUP_SECONDS = 120.0  # the least time an actor is given to start (a new worker process, imports, its envs)


class ActorPool:
    """The rollout actors and the learner's side of talking to them: rollouts in flight, weight broadcasts, and
    restarting an actor. Ray restarts an actor that died (same constructor arguments); the pool restarts one whose
    rollout is late (--rollout-timeout) and re-sends either the weights it lost. Every restart is counted, and one past
    --max-actor-restarts stops the run (StopRun), as does an exception raised inside an env."""

    def __init__(self, args: Args, ray_module, video_dir: str, first_step: int, counters: dict, loop: TrainingLoop):
        self.ray = ray_module
        self.args = args
        self.loop = loop  # a signal stops a wait for rollouts, not only the iteration after it
        self.counters = counters  # the run's event counts: restarts, lost and dropped rollouts
        self.restarts = 0  # in this process, against --max-actor-restarts
        self.timeout = rollout_timeout(args, args.num_envs_per_actor)
        actor_cls = RolloutActor
        if ray_module is not None:
            restarts = args.max_actor_restarts + 1  # Ray's cap per actor; the pool's own count stops the run first
            actor_cls = ray_module.remote(RolloutActor).options(num_cpus=args.actor_cpus, max_restarts=restarts)
        self.actors = []
        for index in range(args.num_actors):
            # A resumed run starts new random streams rather than replaying the first iterations' noise.
            seed = args.seed + 1000 * (index + 1) + first_step
            actor_args = dataclasses.replace(args, capture_video=args.capture_video and index == 0)
            init = (args.env_id, args.num_envs_per_actor, seed, actor_args, video_dir)
            self.actors.append(RolloutActor(*init) if ray_module is None else actor_cls.remote(*init))
        self.in_flight: dict = {}  # ref -> (actor index, the time by which its rollout is late)
        self.weights_ref = None
        self.version = -1
        # Rollouts are timed from here on: starting a worker process and its envs may take longer than one rollout.
        self.ask_all("started", timeout=max(STARTUP_SECONDS, self.timeout))

    def call(self, index: int, method: str, *call_args):
        if self.ray is None:
            try:
                return Done(getattr(self.actors[index], method)(*call_args))
            except Exception as e:  # noqa: BLE001 (mirrors a failed Ray task)
                return Done(error=e)
        return getattr(self.actors[index], method).remote(*call_args)

    def get(self, ref, timeout: float | None = None):
        """The result of a call. With Ray, an exception raised inside the actor (an env's step or reset) stops the
        run with its last line; in --no-ray mode it is raised as it was (a rollout's then reaches sample_rollout, as
        in ppo_continuous.py)."""
        if self.ray is None:
            if ref.error is not None:
                raise ref.error
            return ref.value
        try:
            return self.ray.get(ref, timeout=timeout)
        except self.ray.exceptions.RayTaskError as e:
            raise StopRun(f"a rollout actor failed: {last_line(e)}") from None

    def actor_errors(self) -> tuple[type[BaseException], ...]:
        return () if self.ray is None else (self.ray.exceptions.RayActorError,)

    def unavailable_errors(self) -> tuple[type[BaseException], ...]:
        return () if self.ray is None else (self.ray.exceptions.ActorUnavailableError,)

    def timeout_errors(self) -> tuple[type[BaseException], ...]:
        return () if self.ray is None else (self.ray.exceptions.GetTimeoutError,)

    def wait_timeout(self, seconds: float | None = None) -> float | None:
        """How long a get waits: `seconds` (default --rollout-timeout) with Ray; in --no-ray mode the call has
        already returned."""
        return None if self.ray is None else seconds or self.timeout

    def restart(self, index: int, why: str, kill: bool, error: BaseException | None = None) -> None:
        """Count a restart of actor `index`, Ray's after `error` or, with `kill`, the pool's (a hung actor is killed and
        Ray starts it again), and re-send it the weights it lost; one past --max-actor-restarts stops the run. An actor
        that fails again while taking the weights is one more restart. An exception raised in the actor's constructor
        (its envs' creation or first reset) would only be raised again: it stops the run at once."""
        cap = self.args.max_actor_restarts
        while True:
            if error is not None and getattr(error, "actor_init_failed", False):
                raise StopRun(f"rollout actor {index} failed as it started: {last_line(error)}")
            self.restarts += 1
            self.counters["actor_restarts"] += 1
            if self.restarts > cap:
                raise StopRun(f"actor {index} {why}: {self.restarts} actor restarts, past --max-actor-restarts {cap}")
            if kill:
                self.ray.kill(self.actors[index], no_restart=False)
            tqdm.write(
                f"{PROG}: warning: actor {index} {why}; restarted and re-synced (restart {self.restarts} of at most "
                f"{cap})",
                file=sys.stderr,
            )
            if self.weights_ref is None:
                return
            failed_again = self.resend_weights(index)
            if failed_again is None:
                return
            why, kill, error = failed_again

    def resend_weights(self, index: int) -> tuple[str, bool, BaseException | None] | None:
        """Send a restarted actor the current weights; None once it has them, else (why, kill, error) for restart.
        While Ray starts it again it answers that it is unavailable: that is asked again, up to the start-up time."""
        startup = max(STARTUP_SECONDS, self.timeout)  # the restarted actor starts a new worker and its envs
        deadline = time.monotonic() + startup
        while True:
            try:
                ack = self.call(index, "set_policy", self.weights_ref, self.version)
                self.get(ack, self.wait_timeout(max(0.1, deadline - time.monotonic())))
                return None
            except self.unavailable_errors():
                if time.monotonic() < deadline:
                    time.sleep(0.5)
                    continue
                return f"did not come back within {startup:g} s of its restart", True, None
            except self.actor_errors() as e:
                return f"failed again on its restart ({failure(e)})", False, e
            except self.timeout_errors():
                return f"did not come back within {startup:g} s of its restart", True, None

    def ask_all(self, method: str, *call_args, timeout: float | None = None) -> list:
        """Every actor's answer to one call, asked of all at once; an actor that fails or does not answer within
        `timeout` (default --rollout-timeout) is restarted and asked again."""
        timeout = timeout or self.timeout
        refs = [self.call(i, method, *call_args) for i in range(len(self.actors))]
        answers = []
        for index, ref in enumerate(refs):
            while True:
                try:
                    answers.append(self.get(ref, self.wait_timeout(timeout)))
                    break
                except self.actor_errors() as e:
                    self.restart(index, f"failed in {method} ({failure(e)})", False, e)
                except self.timeout_errors():
                    self.restart(index, f"did not answer {method} within {timeout:g} s", kill=True)
                ref = self.call(index, method, *call_args)
        return answers

    def broadcast(self, weights: dict, version: int) -> float:
        """One ray.put of the numpy weights and observation statistics, then one small call per actor. Sync mode
        waits for the acknowledgements, so that the next rollouts surely use the new weights."""
        start = time.perf_counter()
        self.weights_ref = weights if self.ray is None else self.ray.put(weights)
        self.version = version
        acks = [self.call(i, "set_policy", self.weights_ref, version) for i in range(len(self.actors))]
        for index, ack in enumerate(acks if self.args.mode == "sync" else []):
            try:
                self.get(ack, self.wait_timeout())
            except self.actor_errors() as e:
                self.restart(index, f"failed ({failure(e)})", False, e)
            except self.timeout_errors():
                self.restart(index, f"did not take the weights within --rollout-timeout {self.timeout:g} s", kill=True)
        return time.perf_counter() - start

    def submit(self, index: int) -> None:
        self.in_flight[self.call(index, "rollout", self.args.num_steps)] = (index, time.monotonic() + self.timeout)

    def ready(self) -> list:
        """The rollouts that have arrived. Waits in short steps, so that Ctrl-C or SIGTERM stops the run while an
        env hangs; an actor whose rollout is late is restarted and sent a new one."""
        if self.ray is None:
            return list(self.in_flight)
        while True:
            if self.loop.signum is not None:
                raise Interrupted
            now = time.monotonic()
            first_deadline = min(deadline for _, deadline in self.in_flight.values())
            wait = min(1.0, max(0.0, first_deadline - now))
            ready, _ = self.ray.wait(list(self.in_flight), num_returns=1, timeout=wait)
            if ready:
                return ready
            for ref, (index, deadline) in list(self.in_flight.items()):
                if deadline <= time.monotonic() and not self.ray.wait([ref], timeout=0)[0]:
                    del self.in_flight[ref]
                    self.counters["lost_rollouts"] += 1
                    why = f"sent no rollout within --rollout-timeout {self.timeout:g} s; its rollout is lost"
                    self.restart(index, why, kill=True)
                    self.submit(index)

    def gather(self, version: int) -> tuple[list[dict], list[dict]]:
        """One batch: a rollout from each of --num-actors actors (sync), or the first --num-actors rollouts that are
        fresh enough (async, where an actor is sent its next rollout as soon as one arrives). Returns the accepted
        rollouts in actor order and the dropped ones, whose steps and episodes still count."""
        if self.args.mode == "sync":
            for i in range(len(self.actors)):
                self.submit(i)
        accepted, dropped = {}, []
        while len(accepted) < len(self.actors):
            for ref in self.ready():
                index, _ = self.in_flight.pop(ref)
                try:
                    rollout = self.get(ref)
                except self.actor_errors() as e:
                    self.counters["lost_rollouts"] += 1
                    self.restart(index, f"failed ({failure(e)}); its rollout is lost", False, e)
                    self.submit(index)
                    continue
                if "needs_weights" in rollout:
                    self.restart(index, "was restarted by Ray before a broadcast reached it", kill=False)
                    self.submit(index)
                    continue
                if self.args.mode == "async":
                    self.submit(index)  # keep this actor sampling while the learner works
                    if version - int(rollout["policy_version"]) > self.args.max_policy_lag:
                        self.counters["dropped_rollouts"] += 1
                        dropped.append(rollout)
                        continue
                accepted[(index, len(accepted))] = rollout
                if len(accepted) == len(self.actors):
                    break
        return [accepted[key] for key in sorted(accepted)], dropped


def merged_moments(moments: list[tuple[np.ndarray, np.ndarray, int]]) -> gae.RunningMeanStd:
    """Several samplers' observation statistics (mean, var, count) as one."""
    merged = gae.RunningMeanStd(shape=np.shape(moments[0][0]), epsilon=0.0)
    for mean, var, count in moments:
        merged.update_from_moments(mean, var, int(count))
    return merged


def stack_rollouts(rollouts: list[dict], dropped: list[dict]) -> dict:
    """Several samplers' rollouts as one, their envs side by side (the columns of the (T, N) arrays). The dropped
    rollouts add their steps, episodes, audits and statistics, not their samples."""
    if len(rollouts) == 1 and not dropped:
        return rollouts[0]
    per_step = ("obs", "actions", "logprobs", "rewards", "terminations", "truncations")
    stacked = {k: np.concatenate([r[k] for r in rollouts], axis=1) for k in per_step}
    offsets = np.cumsum([0] + [r["rewards"].shape[1] for r in rollouts])
    stacked["final_index"] = np.concatenate([r["final_index"] + [0, off] for r, off in zip(rollouts, offsets)])
    stacked |= {k: np.concatenate([r[k] for r in rollouts]) for k in ("final_obs", "next_obs")}
    every = rollouts + dropped
    moments = merged_moments([(r["obs_mean"], r["obs_var"], r["obs_count"]) for r in every])
    return stacked | {
        "discounted_returns": np.concatenate([r["discounted_returns"] for r in every], axis=1),
        "obs_mean": moments.mean,
        "obs_var": moments.var,
        "obs_count": np.array(moments.count),
        "env_steps": sum(int(r["env_steps"]) for r in every),
        "episode_returns": np.concatenate([r["episode_returns"] for r in every]),
        "episode_lengths": np.concatenate([r["episode_lengths"] for r in every]),
        "acting_audit": np.array([r["acting_audit"] for r in every]),
        "acting_problem": np.array([r["acting_problem"] for r in every]),
    }


def broadcast_due(args: Args, version: int, last_broadcast: int) -> bool:
    """Every --sync-every updates. In async mode also once the newest weights the actors have are --max-policy-lag
    updates old: a rollout of theirs that arrived later could only be dropped, and with nothing fresh to train on
    the learner would wait forever."""
    since = version - last_broadcast
    return since >= args.sync_every or (args.mode == "async" and since >= max(1, args.max_policy_lag))


# ---------------------------------------------------------------------------------------------------------------------
# Ray set-up
# ---------------------------------------------------------------------------------------------------------------------
SHARE_CORES = " (use fractional --actor-cpus to share cores)"


def init_ray(args: Args):
    """Start or join Ray quietly; bad addresses and too few CPUs are usage errors."""
    if args.no_ray:
        return None
    # The calls of an actor that the pool restarted fail unread; the restart is reported in one line, not Ray's trace.
    os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")
    # Workers inherit the driver's import path, so `module:EnvId` env ids and this repo's modules resolve in actors.
    here = os.path.dirname(os.path.abspath(__file__))
    pythonpath = os.pathsep.join(p for p in [here, os.getcwd(), os.environ.get("PYTHONPATH", "")] if p)
    runtime_env = {"env_vars": {"PYTHONPATH": pythonpath, "RAY_DEDUP_LOGS": "0"}}
    kwargs = dict(include_dashboard=False)
    if args.ray_address is None:
        kwargs["object_store_memory"] = args.object_store_memory
    elif args.object_store_memory is not None:
        raise UsageError("--object-store-memory applies to a local Ray; set it with `ray start` on a cluster")
    try:
        ray = connect(args.ray_address, runtime_env, **kwargs)
    except ClusterError as e:
        raise UsageError(str(e)) from None
    free = cpu_counts(ray)[0]
    if args.actor_cpus is None:  # one each where they fit, else the free CPUs shared evenly
        args.actor_cpus = 1.0 if args.num_actors <= free else math.floor(100 * free / args.num_actors) / 100
        if args.actor_cpus < 1:
            print(f"{PROG}: {args.num_actors} actors share {free:g} free CPUs: --actor-cpus {args.actor_cpus:g} each")
    what = f"--num-actors {args.num_actors} x --actor-cpus {args.actor_cpus}"
    try:
        if args.actor_cpus <= 0:
            raise ClusterError(f"{what}: no CPU is free for the actors")
        refuse_what_does_not_fit(ray, what, args.num_actors * args.actor_cpus, args.actor_cpus, SHARE_CORES)
    except ClusterError as e:
        ray.shutdown()
        raise UsageError(str(e)) from None
    return ray


# ---------------------------------------------------------------------------------------------------------------------
# The actors as the learner's sampler
# ---------------------------------------------------------------------------------------------------------------------
class ActorSampler:
    """The rollout actors, seen by ppo_continuous.py's run as its sampler: `start_run`, its `training_loop` and
    `finish_run` take them as they take a Sampler. What they add is distribution: a rollout is the batch gathered
    from the actors (stale ones dropped in async mode), the weights go out every --sync-every updates, and the batch
    is anchored for --stale-correction (`anchor`). The
    actors start when the run's training loop has begun (`attach`), so that one that fails to start stops the run
    with its checkpoint and summary."""

    def __init__(self, args: Args, env: gym.Env):
        self.args = args
        obs_dim, act_dim, self.discrete = check_spaces(args.env_id, env)
        self.spaces = (obs_dim, act_dim)
        self.action_space = env.action_space
        self.obs_layout = env.obs_layout
        self.pool: ActorPool | None = None
        self.state = None  # the run's RunState (attach)
        self.last_broadcast = None  # (version, whether the actors act with numpy) of the weights they have
        self.lags: list[int] = []
        self.actor_speed = 0.0
        self.actor_nodes: set[str] = set()
        self.seconds = {"wait": 0.0, "update": 0.0, "broadcast": 0.0}  # where the learner's time goes
        self.last = {"wait": 0.0, "broadcast": 0.0}
        self.update_start: float | None = None

    rng_state = None  # the actors' streams are seeded anew from the step a resumed run starts at
    rollout_timeout = None  # on Ray, the pool times each actor's rollout (TrainingLoop.watch)

    def make_agent(self) -> Agent:
        return Agent(*self.spaces, discrete=self.discrete)

    def attach(self, run: Run, loop: TrainingLoop, ray_module) -> None:
        """Start the actors (on Ray, unless `ray_module` is None), which count into the run's counters and stop a
        wait for rollouts when a signal ends the loop."""
        for key in ("dropped_rollouts", "actor_restarts", "lost_rollouts", "discarded_rollouts"):
            run.state.counters.setdefault(key, 0)
        self.state = run.state
        video_dir = os.path.abspath(os.path.join(run.run_dir, "videos"))
        self.pool = ActorPool(self.args, ray_module, video_dir, run.state.global_step, run.state.counters, loop)
        if ray_module is None:  # the actors step their envs in this process: the run's watchdog times them all
            self.rollout_timeout = self.args.num_actors * self.pool.timeout

    def warm_up(self, steps: int) -> tuple[np.ndarray, np.ndarray, float]:
        """The moments of every actor's random-action warm-up, merged."""
        moments = merged_moments(self.pool.ask_all("warm_up", steps))
        return moments.mean, moments.var, moments.count

    def set_policy(self, weights: dict[str, np.ndarray]) -> None:
        """Broadcast the weights when due (broadcast_due), when the actors have none yet, or when the acting audit
        moved acting to torch since the last broadcast."""
        self.end_update()
        version, fast = self.state.iteration, bool(weights["fast_acting"])
        if self.last_broadcast is None or self.last_broadcast[1] != fast:
            due = True
        else:
            due = broadcast_due(self.args, version, self.last_broadcast[0])
        self.last["broadcast"] = 0.0  # this iteration's, none when not due
        if not due:
            return
        self.last["broadcast"] = self.pool.broadcast(weights, version)
        self.seconds["broadcast"] += self.last["broadcast"]
        self.last_broadcast = (version, fast)

    def rollout(self, num_steps: int) -> dict[str, np.ndarray]:
        """One batch of rollouts (ActorPool.gather) as one rollout, the actors' envs side by side. Dropped rollouts
        count their steps, episodes and statistics, as a discarded one does in ppo_continuous.py."""
        pool = self.pool
        if self.args.mode == "async" and not pool.in_flight:
            for i in range(self.args.num_actors):
                pool.submit(i)
        wait_start = time.perf_counter()
        rollouts, dropped = pool.gather(self.state.iteration)
        self.last["wait"] = time.perf_counter() - wait_start
        self.seconds["wait"] += self.last["wait"]
        self.update_start = time.perf_counter()
        self.lags = [self.state.iteration - int(r["policy_version"]) for r in rollouts]
        self.actor_speed = float(np.mean([r["rewards"].size / float(r["sample_seconds"]) for r in rollouts]))
        self.actor_nodes.update(str(r["node_id"]) for r in rollouts if str(r["node_id"]))
        return stack_rollouts(rollouts, dropped)

    def end_update(self) -> None:
        """Count the time since the last rollout came as the learner's update time."""
        if self.update_start is not None:
            self.seconds["update"] += time.perf_counter() - self.update_start
            self.update_start = None

    def scalars(self) -> dict[str, float]:
        """Staleness, the actors' faults and where the learner's time went, for TensorBoard with each update."""
        update_seconds = time.perf_counter() - self.update_start if self.update_start is not None else 0.0
        return {
            "charts/policy_lag_min": min(self.lags),
            "charts/policy_lag_max": max(self.lags),
            "charts/policy_lag_mean": float(np.mean(self.lags)),
            "charts/dropped_rollouts": self.state.counters["dropped_rollouts"],
            "charts/actor_restarts": self.state.counters["actor_restarts"],
            "charts/lost_rollouts": self.state.counters["lost_rollouts"],
            "perf/learner_update_seconds": update_seconds,
            "perf/learner_wait_seconds": self.last["wait"],
            "perf/weight_sync_seconds": self.last["broadcast"],
            "perf/actor_env_steps_per_second": self.actor_speed,
        }

    def summary(self) -> dict:
        """summary.json's fields of the distribution."""
        self.end_update()
        return {
            "learner_updates": self.state.iteration,
            "rollout_timeout_seconds": rollout_timeout(self.args, self.args.num_envs_per_actor),
            "actor_nodes": len(self.actor_nodes),
            "learner_seconds": {k: round(v, 2) for k, v in self.seconds.items()},
        }

    def anchor(self, batch: dict, agent: Agent) -> dict:
        """--stale-correction decoupled (Hilton et al. 2021): the clip is anchored to the learner's current policy (the
        proximal one), and the policy that sampled the data becomes the behaviour policy of gae.ppo_loss's weight
        (capped by --max-is-weight). With none, the clip stays anchored to the policy that sampled."""
        if self.args.stale_correction != "decoupled":
            return batch
        with torch.no_grad():
            batch["behaviour_logprobs"] = batch["logprobs"]
            batch["logprobs"] = agent.evaluate(batch["obs"], batch["actions"])[0]
        return batch

    def close(self) -> None:
        """The in-process actors' envs (--no-ray); actors on Ray end with its shutdown (train)."""
        if self.pool is not None and self.pool.ray is None:
            for actor in self.pool.actors:
                actor.close()


# ---------------------------------------------------------------------------------------------------------------------
# Training: ppo_continuous.py's training loop, with the actors for the sampler
# ---------------------------------------------------------------------------------------------------------------------
def train(args: Args) -> int:
    ckpt = resume_checkpoint(args)
    env = ppo.make_env(args.env_id)  # a bad env id or action space fails here, before Ray starts
    actors = ActorSampler(args, env)
    env.close()
    device = seed_everything(args)
    ray = init_ray(args)
    try:
        run = ppo.start_run(args, ckpt, device, actors)
        say_rounded_timesteps(args)
        with TrainingLoop(run, ppo.save_checkpoint) as loop:
            actors.attach(run, loop, ray)  # one that fails to start stops the run with its checkpoint
            if ckpt is None:
                ppo.warm_up(run, loop)
            ppo.training_loop(run, loop)
        eval_failed = finish_run(loop)
    finally:
        if ray is not None:
            ray.shutdown()
    if loop.error:  # after Ray's shutdown, so that nothing it prints comes after the cause
        print(f"{PROG}: error: {loop.error}", file=sys.stderr, flush=True)
    return loop.exit_status() or eval_failed


if __name__ == "__main__":
    sys.exit(cli(Args, validate_args, train, sys.modules[__name__], MACHINE_FLAGS, REFUSED_FLAGS))
