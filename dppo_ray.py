"""Distributed PPO on Ray: rollout actors sample environments in parallel, one learner trains.

    python dppo_ray.py --env-id HalfCheetah-v5 --num-actors 2 --mode async
    python dppo_ray.py --env-id CartPole-v1 --num-actors 2 --no-ray      # in-process, for a debugger

Each `RolloutActor` runs `--num-envs-per-actor` envs with a numpy copy of the policy and returns its rollout as one dict
of numpy arrays, tagged with the version of the policy that produced it. The learner assembles
batch = num_actors x num_envs_per_actor x num_steps env steps (CleanRL's num_envs x num_steps), runs the PPO epochs
(on a GPU with --cuda when one is present), and broadcasts the weights with one `ray.put` every --sync-every updates.

--mode sync waits for every actor each iteration (a barrier), so with --sync-every 1 all data comes from the current
policy. --mode async consumes rollouts as they arrive while the actors keep sampling; --max-policy-lag bounds how stale
a rollout may be, and older ones are dropped and counted. The same script runs on a laptop's local Ray and, with
--ray-address auto, on a multi-node cluster. GAE and the PPO loss come from gae.py.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import signal
import socket
import sys
import time
import warnings
from collections import deque
from dataclasses import dataclass
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
import tyro
from torch import nn
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from gae import RewardScaler, RunningMeanStd, compute_gae, explained_variance, ppo_loss

PROG = os.path.basename(__file__)


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment (actor i seeds its envs from seed + 1000 * (i + 1))"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, the learner uses CUDA when a GPU is present (the CPU otherwise)"""

    # Algorithm-specific arguments (CleanRL's names and defaults, with the batch split over actors)
    env_id: str = "HalfCheetah-v5"
    """the id of the environment (Box or Discrete actions); `module:EnvId-v0` imports `module` in every actor"""
    total_timesteps: int = 1000000
    """total timesteps of the experiment"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer"""
    num_actors: int = 2
    """the number of Ray rollout actors"""
    num_envs_per_actor: int = 1
    """the number of environments each actor steps"""
    num_steps: int = 1024
    """the number of steps each actor runs in each environment per rollout"""
    anneal_lr: bool = True
    """toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 32
    """the number of mini-batches"""
    update_epochs: int = 10
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """toggles advantages normalization"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """toggles whether or not to use a clipped loss for the value function, as per the paper"""
    ent_coef: float = 0.0
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """the target KL divergence threshold: stop the epochs of an update once approx_kl exceeds it"""
    norm_obs: bool = True
    """normalize observations with one set of running statistics owned by the learner (then clip to +-obs-clip)"""
    obs_clip: float = 10.0
    """clip of the normalized observations"""
    norm_reward: bool = True
    """scale rewards by the running std of the discounted return (then clip to +-reward-clip)"""
    reward_clip: float = 10.0
    """clip of the scaled rewards"""

    # Distribution
    mode: Literal["sync", "async"] = "sync"
    """sync: a barrier every iteration; async: the learner takes rollouts as they arrive while actors keep sampling"""
    sync_every: int = 1
    """broadcast the weights after every K learner updates"""
    max_policy_lag: int = 2
    """async: drop rollouts produced by a policy more than this many updates older than the learner's"""
    stale_correction: Literal["none", "decoupled"] = "none"
    """none: plain PPO on whatever policy sampled; decoupled: decoupled PPO (Hilton et al. 2021), see README"""
    max_is_weight: float = 1.0
    """decoupled: truncation of the behaviour-to-proximal importance weight (V-trace's rho-bar)"""
    ray_address: str | None = None
    """Ray cluster to join (`auto` for the one `ray start` set up on this node); default: start a local Ray"""
    actor_cpus: float = 1.0
    """CPUs reserved for each rollout actor (fractions allowed)"""
    object_store_memory: int | None = None
    """bytes for the object store of a local Ray (default: Ray's choice)"""
    no_ray: bool = False
    """run the actors in this process, one after the other, so that a plain debugger can step through everything"""

    # Run management
    run_name: str | None = None
    """the run's folder under runs/ (default: <env-id>__<exp-name>__<seed>__<unix time>)"""
    checkpoint_every: int = 25
    """save runs/<run-name>/checkpoint.pt every this many updates (0: only at the end and on Ctrl-C)"""
    resume: str | None = None
    """path of a checkpoint.pt to continue from"""
    eval_checkpoint: str | None = None
    """path of a checkpoint: evaluate its policy (mean or most likely action) for --eval-episodes, without training"""
    eval_episodes: int = 10
    """the number of episodes for --eval-checkpoint"""
    save_model: bool = False
    """whether to save the final policy (with its normalization statistics) to runs/<run-name>/<exp-name>.model"""
    quiet: bool = False
    """no progress bar (warnings and errors are still printed)"""
    torch_threads: int = 1
    """torch CPU threads of the learner"""

    # to be filled in runtime
    batch_size: int = 0
    """the batch size: num_actors x num_envs_per_actor x num_steps (computed in runtime)"""
    minibatch_size: int = 0
    """the mini-batch size (computed in runtime)"""
    num_iterations: int = 0
    """the number of learner updates (computed in runtime)"""


class UsageError(Exception):
    """Bad input: reported as one line on stderr with exit status 2."""


def validate_args(args: Args) -> None:
    positive = ["total_timesteps", "num_actors", "num_envs_per_actor", "num_steps", "num_minibatches"]
    positive += ["update_epochs", "eval_episodes", "sync_every", "torch_threads"]
    for name in positive:
        if getattr(args, name) <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    for name in ["learning_rate", "clip_coef", "obs_clip", "reward_clip", "actor_cpus", "max_is_weight"]:
        if not getattr(args, name) > 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if not 0 < args.gamma <= 1 or not 0 <= args.gae_lambda <= 1:
        raise UsageError(f"--gamma must be in (0, 1] and --gae-lambda in [0, 1], got {args.gamma}, {args.gae_lambda}")
    if args.max_policy_lag < 0 or args.checkpoint_every < 0:
        raise UsageError("--max-policy-lag and --checkpoint-every must be >= 0")
    if args.target_kl is not None and not args.target_kl > 0:
        raise UsageError(f"--target-kl must be positive (or None), got {args.target_kl}")
    if args.resume and args.eval_checkpoint:
        raise UsageError("--resume and --eval-checkpoint do not fit together: evaluate or train, not both")
    if args.no_ray and args.ray_address:
        raise UsageError("--no-ray and --ray-address do not fit together")
    if args.mode == "sync" and args.stale_correction != "none" and args.sync_every == 1:
        raise UsageError("--stale-correction needs stale data: use --mode async or --sync-every > 1")
    args.batch_size = args.num_actors * args.num_envs_per_actor * args.num_steps
    if args.batch_size % args.num_minibatches != 0:
        raise UsageError(
            f"--num-minibatches {args.num_minibatches} does not divide the batch (--num-actors {args.num_actors} x "
            f"--num-envs-per-actor {args.num_envs_per_actor} x --num-steps {args.num_steps} = {args.batch_size})"
        )
    args.minibatch_size = args.batch_size // args.num_minibatches
    args.num_iterations = args.total_timesteps // args.batch_size
    if args.num_iterations == 0 and not args.eval_checkpoint:
        raise UsageError(f"--total-timesteps {args.total_timesteps} is less than one batch ({args.batch_size} steps)")


# ---------------------------------------------------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------------------------------------------------
def quiet_mujoco_log() -> None:
    """MuJoCo 4 writes MUJOCO_LOG.TXT into the working directory of every process that builds a model."""
    try:
        import mujoco
    except ImportError:
        return
    config = mujoco.MjLogConfig.get()
    config.logto_file = False
    config.set()


def make_env(env_id: str) -> gym.Env:
    try:
        return gym.make(env_id)
    except (gym.error.Error, ModuleNotFoundError, ImportError) as e:
        raise UsageError(f"cannot make env '{env_id}': {str(e).splitlines()[0]}") from None


def check_spaces(env_id: str, observation_space: gym.Space, action_space: gym.Space) -> None:
    if not isinstance(action_space, (gym.spaces.Box, gym.spaces.Discrete)):
        raise UsageError(f"{env_id} has a {action_space} action space; dppo_ray.py takes Box or Discrete")
    if isinstance(action_space, gym.spaces.Box) and len(action_space.shape) != 1:
        raise UsageError(f"{env_id} has action space {action_space}; a flat Box is needed")
    if not isinstance(observation_space, gym.spaces.Box) or len(observation_space.shape) != 1:
        raise UsageError(f"{env_id} has observation space {observation_space}; a flat Box is needed")


def space_dims(env_id: str) -> tuple[int, int, bool]:
    """(obs_dim, action_dim or number of actions, discrete) of an env id, checked."""
    env = make_env(env_id)
    check_spaces(env_id, env.observation_space, env.action_space)
    discrete = isinstance(env.action_space, gym.spaces.Discrete)
    dims = env.observation_space.shape[0], int(env.action_space.n) if discrete else env.action_space.shape[0], discrete
    env.close()
    return dims


# ---------------------------------------------------------------------------------------------------------------------
# Agent (learner side, torch) and its numpy copy (actor side)
# ---------------------------------------------------------------------------------------------------------------------
LOG_SQRT_2PI = 0.5 * np.log(2.0 * np.pi)


def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Separate 64-64 tanh actor and critic. Box actions: a Gaussian with a state-independent log-std.
    Discrete actions: a categorical over the actor's logits."""

    def __init__(self, obs_dim: int, action_dim: int, discrete: bool):
        super().__init__()
        self.discrete = discrete
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, action_dim), std=0.01),
        )
        if not discrete:
            self.actor_logstd = nn.Parameter(torch.zeros(1, action_dim))

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x).squeeze(-1)

    def evaluate(self, x: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probability of `action`, entropy and value."""
        out = self.actor(x)
        if self.discrete:
            dist = torch.distributions.Categorical(logits=out)
            return dist.log_prob(action.long()), dist.entropy(), self.get_value(x)
        logstd = self.actor_logstd.expand_as(out)
        logprob = (-0.5 * ((action - out) / logstd.exp()) ** 2 - logstd - LOG_SQRT_2PI).sum(-1)
        entropy = (0.5 + LOG_SQRT_2PI + logstd).sum(-1)
        return logprob, entropy, self.get_value(x)

    def numpy_weights(self) -> dict[str, np.ndarray]:
        """What the actors receive: plain numpy arrays, cheap to ray.put and to unpickle."""
        return {k: v.detach().cpu().numpy() for k, v in self.state_dict().items()}


def numpy_mlp(weights: dict[str, np.ndarray], prefix: str):
    """The forward pass of a Linear-Tanh-Linear-Tanh-Linear torch.nn.Sequential, from its state dict, in numpy."""
    layers = [(weights[f"{prefix}.{i}.weight"].T.copy(), weights[f"{prefix}.{i}.bias"].copy()) for i in (0, 2, 4)]

    def forward(x: np.ndarray) -> np.ndarray:
        for i, (w, b) in enumerate(layers):
            x = x @ w + b
            if i < 2:
                x = np.tanh(x)
        return x

    return forward


class NumpyPolicy:
    """The actors' copy of the agent: sampling, log-probabilities and values without torch (a 64-64 MLP on a few
    observations is several times faster in numpy, where per-call overhead is small)."""

    def __init__(self, weights: dict[str, np.ndarray], discrete: bool):
        self.actor, self.critic, self.discrete = numpy_mlp(weights, "actor"), numpy_mlp(weights, "critic"), discrete
        if not discrete:
            self.logstd = weights["actor_logstd"].reshape(-1).astype(np.float64)
            self.std = np.exp(self.logstd)

    def value(self, obs: np.ndarray) -> np.ndarray:
        return self.critic(obs)[:, 0]

    def act(self, obs: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Sample actions for a batch of observations; return (actions, log-probabilities)."""
        out = self.actor(obs).astype(np.float64)
        if self.discrete:
            logits = out - out.max(axis=1, keepdims=True)
            log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
            cumulative = np.exp(log_probs).cumsum(axis=1)
            u = rng.random((len(obs), 1)) * cumulative[:, -1:]
            actions = np.minimum((cumulative < u).sum(axis=1), out.shape[1] - 1)
            return actions, log_probs[np.arange(len(obs)), actions]
        noise = rng.standard_normal(out.shape)
        actions = out + self.std * noise
        return actions, (-0.5 * noise**2 - self.logstd - LOG_SQRT_2PI).sum(axis=1)

    def best_action(self, obs: np.ndarray) -> np.ndarray:
        out = self.actor(obs)
        return out.argmax(axis=1) if self.discrete else out


# ---------------------------------------------------------------------------------------------------------------------
# Rollout actor
# ---------------------------------------------------------------------------------------------------------------------
class RolloutActor:
    """Steps `num_envs` envs with the latest policy it was sent and returns rollouts as dicts of numpy arrays.

    Runs as a Ray actor (`ray.remote(RolloutActor)`) or, with --no-ray, as a plain object in the learner's process.
    Episodes continue across rollouts; a finished env is reset in the same step and the last observation of its
    episode is used for the truncation bootstrap."""

    def __init__(self, env_id: str, num_envs: int, seed: int, obs_clip: float, norm_obs: bool):
        quiet_mujoco_log()
        self.envs = [gym.make(env_id) for _ in range(num_envs)]
        self.discrete = isinstance(self.envs[0].action_space, gym.spaces.Discrete)
        if not self.discrete:
            self.low, self.high = self.envs[0].action_space.low, self.envs[0].action_space.high
        self.obs_clip, self.norm_obs = obs_clip, norm_obs
        self.rng = np.random.default_rng(seed)
        self.raw_obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(self.envs)])
        self.episode_returns, self.episode_lengths = np.zeros(num_envs), np.zeros(num_envs, dtype=np.int64)
        self.policy, self.version = None, -1
        ray_module = sys.modules.get("ray")
        in_ray = ray_module is not None and ray_module.is_initialized()
        self.node_id = ray_module.get_runtime_context().get_node_id() if in_ray else "local"

    def set_weights(self, weights: dict, version: int) -> int:
        """`weights`: the agent's numpy state dict plus the learner's observation statistics."""
        self.policy = NumpyPolicy(weights, self.discrete)
        self.obs_mean, self.obs_std = weights["obs_mean"], np.sqrt(weights["obs_var"] + 1e-8)
        self.version = version
        return version

    def normalize(self, raw: np.ndarray) -> np.ndarray:
        if not self.norm_obs:
            return raw.astype(np.float32)
        return np.clip((raw - self.obs_mean) / self.obs_std, -self.obs_clip, self.obs_clip).astype(np.float32)

    def rollout(self, num_steps: int) -> dict[str, np.ndarray]:
        if self.policy is None:
            return {"needs_weights": np.array(True)}
        start = time.perf_counter()
        num_envs = len(self.envs)
        obs = np.zeros((num_steps, num_envs, self.raw_obs.shape[1]), dtype=np.float32)
        raw_obs = np.zeros((num_steps, num_envs, self.raw_obs.shape[1]))
        actions = np.zeros((num_steps, num_envs, *(() if self.discrete else self.low.shape)), dtype=np.float32)
        logprobs, values = np.zeros((num_steps, num_envs), np.float32), np.zeros((num_steps, num_envs), np.float32)
        next_values = np.zeros((num_steps, num_envs), np.float32)
        rewards = np.zeros((num_steps, num_envs))
        terminations, truncations = np.zeros((num_steps, num_envs), bool), np.zeros((num_steps, num_envs), bool)
        episode_returns, episode_lengths = [], []
        for step in range(num_steps):
            raw_obs[step] = self.raw_obs
            obs[step] = self.normalize(self.raw_obs)
            values[step] = self.policy.value(obs[step])
            action, logprobs[step] = self.policy.act(obs[step], self.rng)
            actions[step] = action
            for i, env in enumerate(self.envs):
                env_action = action[i] if self.discrete else np.clip(action[i], self.low, self.high)
                next_obs, rewards[step, i], terminations[step, i], truncations[step, i], _ = env.step(env_action)
                self.episode_returns[i] += rewards[step, i]
                self.episode_lengths[i] += 1
                if terminations[step, i] or truncations[step, i]:
                    if truncations[step, i] and not terminations[step, i]:
                        next_values[step, i] = self.policy.value(self.normalize(next_obs[None]))[0]
                    episode_returns.append(self.episode_returns[i])
                    episode_lengths.append(self.episode_lengths[i])
                    self.episode_returns[i], self.episode_lengths[i] = 0.0, 0
                    next_obs, _ = env.reset()
                self.raw_obs[i] = next_obs
            if step > 0:  # the successor of step-1 is this step's observation, unless step-1 ended an episode
                continuing = ~(terminations[step - 1] | truncations[step - 1])
                next_values[step - 1, continuing] = values[step, continuing]
        continuing = ~(terminations[-1] | truncations[-1])
        next_values[-1, continuing] = self.policy.value(self.normalize(self.raw_obs))[continuing]
        flat_raw = raw_obs.reshape(-1, raw_obs.shape[-1])
        return {
            "obs": obs,
            "actions": actions,
            "logprobs": logprobs,
            "values": values,
            "rewards": rewards,
            "terminations": terminations,
            "truncations": truncations,
            "next_values": next_values,
            "policy_version": np.array(self.version),
            # moments of the raw observations, merged into the learner's statistics (Chan et al.)
            "obs_count": np.array(len(flat_raw)),
            "obs_mean": flat_raw.mean(axis=0),
            "obs_var": flat_raw.var(axis=0),
            "episode_returns": np.array(episode_returns),
            "episode_lengths": np.array(episode_lengths),
            "sample_seconds": np.array(time.perf_counter() - start),
            "node_id": np.array(self.node_id),
        }


# ---------------------------------------------------------------------------------------------------------------------
# Ray plumbing: the same learner code drives Ray actors or, with --no-ray, plain objects
# ---------------------------------------------------------------------------------------------------------------------
class Done:
    """A finished call in --no-ray mode, standing in for a Ray ObjectRef."""

    def __init__(self, value=None, error: Exception | None = None):
        self.value, self.error = value, error


class ActorPool:
    """The rollout actors. Ray restarts a dead actor (max_restarts=-1) with the same constructor arguments; the
    learner then re-sends it the weights, since a restarted actor has lost them."""

    def __init__(self, args: Args, ray_module):
        self.ray = ray_module
        actor_cls = RolloutActor
        if ray_module is not None:
            actor_cls = ray_module.remote(RolloutActor).options(num_cpus=args.actor_cpus, max_restarts=-1)
        self.actors = []
        for index in range(args.num_actors):
            init = (args.env_id, args.num_envs_per_actor, args.seed + 1000 * (index + 1), args.obs_clip, args.norm_obs)
            self.actors.append(RolloutActor(*init) if ray_module is None else actor_cls.remote(*init))

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

    def wait(self, refs: list):
        """The refs that are ready (at least one)."""
        if self.ray is None:
            return refs
        ready, _ = self.ray.wait(refs, num_returns=1)
        return ready

    def put(self, value):
        return value if self.ray is None else self.ray.put(value)

    def actor_error_types(self) -> tuple[type[BaseException], ...]:
        if self.ray is None:
            return ()
        return (self.ray.exceptions.RayActorError,)


def init_ray(args: Args):
    """Start or join Ray quietly; bad addresses and too few CPUs are usage errors."""
    if args.no_ray:
        return None
    import ray

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    # Workers inherit the driver's import path, so `module:EnvId` env ids and gae.py resolve inside the actors.
    here = os.path.dirname(os.path.abspath(__file__))
    pythonpath = os.pathsep.join(p for p in [here, os.getcwd(), os.environ.get("PYTHONPATH", "")] if p)
    kwargs = dict(
        include_dashboard=False,
        logging_level=logging.ERROR,
        log_to_driver=True,
        runtime_env={"env_vars": {"PYTHONPATH": pythonpath, "RAY_DEDUP_LOGS": "0"}},
    )
    if args.ray_address is None:
        kwargs["object_store_memory"] = args.object_store_memory
    elif args.object_store_memory is not None:
        raise UsageError("--object-store-memory applies to a local Ray; set it with `ray start` on a cluster")
    if args.ray_address not in (None, "auto", "local"):
        # ray.init retries an address with no Ray behind it for minutes; a plain TCP probe answers at once.
        host_port = args.ray_address.split("://")[-1]
        host, _, port = host_port.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
        except (OSError, ValueError):
            raise UsageError(f"cannot reach Ray at --ray-address {args.ray_address}: nothing answers there") from None
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
    needed = args.num_actors * args.actor_cpus
    if needed > free_cpus:
        ray.shutdown()
        raise UsageError(
            f"--num-actors {args.num_actors} x --actor-cpus {args.actor_cpus} needs {needed:g} CPUs; the cluster has "
            f"{free_cpus:g} free of {total_cpus:g} (use fractional --actor-cpus to share cores)"
        )
    return ray


# ---------------------------------------------------------------------------------------------------------------------
# Checkpoints (data only: loaded with weights_only=True) and evaluation
# ---------------------------------------------------------------------------------------------------------------------
def save_atomic(obj: dict, path: str) -> None:
    tmp = f"{path}.tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str) -> dict:
    if not os.path.isfile(path):
        raise UsageError(f"checkpoint not found: {path}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 (corrupt, truncated, or a pickle that tries to run code)
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(f"cannot load checkpoint {path}: not a valid checkpoint ({reason[:160]})") from None
    if not isinstance(ckpt, dict) or not {"agent", "obs_rms", "args"} <= set(ckpt):
        raise UsageError(f"cannot load checkpoint {path}: it does not hold a {PROG} policy")
    return ckpt


def run_eval_checkpoint(args: Args) -> None:
    quiet_mujoco_log()
    ckpt = load_checkpoint(args.eval_checkpoint)
    saved = ckpt["args"]
    obs_dim, action_dim, discrete = space_dims(saved["env_id"])
    agent, obs_rms = Agent(obs_dim, action_dim, discrete), RunningMeanStd(shape=(obs_dim,))
    try:
        agent.load_state_dict(ckpt["agent"])
        obs_rms.load_state_dict(ckpt["obs_rms"])
    except (RuntimeError, ValueError, KeyError) as e:
        raise UsageError(f"checkpoint {args.eval_checkpoint} does not fit {saved['env_id']}: {str(e)[:160]}") from None
    returns = evaluate(agent, obs_rms, saved, args.eval_episodes, args.seed)
    print(
        f"{saved['env_id']}: mean return {returns.mean():.2f} ± {returns.std():.2f} over {len(returns)} episodes "
        f"(best action, saved normalization statistics, {ckpt.get('global_step', '?')} training steps)"
    )


def evaluate(agent: Agent, obs_rms: RunningMeanStd, saved: dict, episodes: int, seed: int) -> np.ndarray:
    policy = NumpyPolicy(agent.numpy_weights(), agent.discrete)
    env = make_env(saved["env_id"])
    returns = []
    obs, _ = env.reset(seed=seed)
    while len(returns) < episodes:
        done, episode_return = False, 0.0
        while not done:
            x = obs_rms.normalize(obs, saved["obs_clip"]) if saved["norm_obs"] else obs
            action = policy.best_action(x.astype(np.float32)[None])[0]
            if not agent.discrete:
                action = np.clip(action, env.action_space.low, env.action_space.high)
            obs, reward, terminated, truncated, _ = env.step(action)
            episode_return += float(reward)
            done = terminated or truncated
        returns.append(episode_return)
        obs, _ = env.reset()
    env.close()
    return np.array(returns)


# ---------------------------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------------------------
def train(args: Args) -> int:
    ckpt = load_checkpoint(args.resume) if args.resume else None
    if ckpt is not None:
        if ckpt["args"].get("env_id") != args.env_id:
            raise UsageError(f"--resume {args.resume} was trained on {ckpt['args'].get('env_id')}, not {args.env_id}")
        if "optimizer" not in ckpt:
            raise UsageError(f"--resume {args.resume} is a saved model, not a training checkpoint.pt")
        args.run_name = args.run_name or ckpt["run_name"]
    quiet_mujoco_log()
    obs_dim, action_dim, discrete = space_dims(args.env_id)  # a bad env id fails here, before Ray starts
    run_name = args.run_name or f"{args.env_id.replace(':', '_')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    args.run_name = run_name
    run_dir = os.path.join("runs", run_name)

    random.seed(args.seed)
    np.random.seed(args.seed)  # noqa: NPY002 (seeds third-party code)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_num_threads(args.torch_threads)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    ray = init_ray(args)
    try:
        return learn(args, ray, ckpt, (obs_dim, action_dim, discrete), run_dir, device)
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


def learn(args: Args, ray, ckpt: dict | None, spaces: tuple[int, int, bool], run_dir: str, device) -> int:
    """The learner: agent, optimizer and statistics (restored from `ckpt` on --resume), the actors, the loop."""
    obs_dim, action_dim, discrete = spaces
    checkpoint_path = os.path.join(run_dir, "checkpoint.pt")
    agent = Agent(obs_dim, action_dim, discrete).to(device)
    parameters = list(agent.parameters())
    optimizer = torch.optim.Adam(parameters, lr=args.learning_rate, eps=1e-5, fused=True)
    obs_rms = RunningMeanStd(shape=(obs_dim,))
    # One reward scaler per actor (each keeps its envs' discounted returns), all sharing one set of statistics.
    reward_scalers = [
        RewardScaler(args.num_envs_per_actor, args.gamma, args.reward_clip) for _ in range(args.num_actors)
    ]
    for scaler in reward_scalers[1:]:
        scaler.return_rms = reward_scalers[0].return_rms
    global_step, version, wall_time_before = 0, 0, 0.0
    counters = {"dropped_rollouts": 0, "actor_restarts": 0, "lost_rollouts": 0}
    if ckpt is not None:
        agent.load_state_dict(ckpt["agent"])
        obs_rms.load_state_dict(ckpt["obs_rms"])
        optimizer.load_state_dict(ckpt["optimizer"])
        reward_scalers[0].return_rms.load_state_dict(ckpt["return_rms"])
        global_step, version = int(ckpt["global_step"]), int(ckpt["version"])
        wall_time_before = float(ckpt["wall_time"])
        counters.update(ckpt["counters"])
        torch.set_rng_state(ckpt["torch_rng"])

    pool = ActorPool(args, ray)
    os.makedirs(run_dir, exist_ok=True)
    resumed = ckpt is not None
    writer = SummaryWriter(run_dir, purge_step=global_step + 1 if resumed else None)
    if not resumed:
        writer.add_text(
            "hyperparameters",
            "|param|value|\n|-|-|\n" + "\n".join([f"|{key}|{value}|" for key, value in vars(args).items()]),
        )
    start_time, start_step = time.time(), global_step

    def save_checkpoint() -> None:
        save_atomic(
            {
                "agent": agent.state_dict(),
                "obs_rms": obs_rms.state_dict(),
                "args": dataclasses.asdict(args),
                "optimizer": optimizer.state_dict(),
                "return_rms": reward_scalers[0].return_rms.state_dict(),
                "global_step": global_step,
                "version": version,
                "run_name": args.run_name,
                "wall_time": wall_time_before + time.time() - start_time,
                "counters": counters,
                "torch_rng": torch.get_rng_state(),
            },
            checkpoint_path,
        )

    interrupted = False

    def on_sigint(signum, frame):
        nonlocal interrupted
        interrupted = True
        signal.signal(signal.SIGINT, signal.default_int_handler)
        tqdm.write(f"{PROG}: Ctrl-C: saving a checkpoint after this update (press again to quit now)", file=sys.stderr)

    signal.signal(signal.SIGINT, on_sigint)

    # ---- Weight broadcast: one ray.put of numpy weights + observation statistics, then a cheap call per actor ----
    def put_weights():
        return pool.put(agent.numpy_weights() | {"obs_mean": obs_rms.mean.copy(), "obs_var": obs_rms.var.copy()})

    def broadcast() -> float:
        """One ray.put of the numpy weights and observation statistics, then one small call per actor. Sync mode
        waits for the acknowledgements, so that the next rollouts surely use the new weights."""
        t0 = time.perf_counter()
        ref = put_weights()
        acks = [pool.call(i, "set_weights", ref, version) for i in range(len(pool.actors))]
        if args.mode == "sync":
            for ack in acks:
                try:
                    pool.get(ack)
                except pool.actor_error_types():
                    pass  # the actor's next rollout call reports the failure, and it is re-synced then
        return time.perf_counter() - t0

    def resync(index: int) -> None:
        """A restarted actor has lost its weights and statistics: send them again, waiting out the restart."""
        ref, deadline = put_weights(), time.time() + 300
        while True:
            try:
                pool.get(pool.call(index, "set_weights", ref, version))
                return
            except pool.actor_error_types():
                if time.time() > deadline:
                    raise
                time.sleep(1.0)

    sync_seconds = broadcast()
    in_flight: dict = {}  # ref -> actor index

    def submit(index: int) -> None:
        in_flight[pool.call(index, "rollout", args.num_steps)] = index

    def on_actor_failure(index: int, error: BaseException) -> None:
        counters["actor_restarts"] += 1
        counters["lost_rollouts"] += 1
        tqdm.write(
            f"{PROG}: warning: actor {index} failed ({type(error).__name__}); Ray restarts it, "
            "its in-flight rollout is discarded and it is re-synced",
            file=sys.stderr,
        )
        resync(index)

    recent_returns: deque[float] = deque(maxlen=100)
    actor_nodes: set[str] = set()
    status, last_stats = "completed", {}
    progress = tqdm(
        total=args.num_iterations * args.batch_size,
        initial=min(global_step, args.num_iterations * args.batch_size),
        disable=args.quiet,
        unit="step",
        unit_scale=True,
        dynamic_ncols=True,
        mininterval=1.0,
    )
    hard_interrupt = False
    try:
        if args.mode == "async":
            for i in range(args.num_actors):
                submit(i)
        while version < args.num_iterations:
            # ---- Gather one batch of rollouts ----
            wait_start = time.perf_counter()
            batch, lags = [], []
            if args.mode == "sync":
                for i in range(args.num_actors):
                    submit(i)
            while len(batch) < args.num_actors:
                for ref in pool.wait(list(in_flight)):
                    index = in_flight.pop(ref)
                    try:
                        rollout = pool.get(ref)
                    except pool.actor_error_types() as e:
                        on_actor_failure(index, e)
                        submit(index)
                        continue
                    if "needs_weights" in rollout:  # restarted before a broadcast reached it
                        resync(index)
                        submit(index)
                        continue
                    if args.mode == "async":
                        submit(index)  # keep this actor sampling while the learner works
                    lag = version - int(rollout["policy_version"])
                    if args.mode == "async" and lag > args.max_policy_lag:
                        counters["dropped_rollouts"] += 1
                        continue
                    lags.append(lag)
                    batch.append((index, rollout))
                    if len(batch) == args.num_actors:
                        break
            wait_seconds = time.perf_counter() - wait_start
            if args.mode == "sync":
                batch.sort(key=lambda item: item[0])  # arrival order varies; actor order keeps runs reproducible
            actor_nodes.update(str(r["node_id"]) for _, r in batch)

            # ---- Episode statistics, normalization statistics, reward scaling ----
            for index, rollout in batch:
                global_step += rollout["rewards"].size
                for episode_return, episode_length in zip(rollout["episode_returns"], rollout["episode_lengths"]):
                    writer.add_scalar("charts/episodic_return", episode_return, global_step)
                    writer.add_scalar("charts/episodic_length", episode_length, global_step)
                    recent_returns.append(float(episode_return))
                writer.add_scalar(
                    f"actors/env_steps_per_second_{index}",
                    rollout["rewards"].size / float(rollout["sample_seconds"]),
                    global_step,
                )
            rewards = [
                reward_scalers[i](r["rewards"], r["terminations"] | r["truncations"])
                if args.norm_reward
                else r["rewards"]
                for i, r in batch
            ]
            if args.norm_obs:
                for _, r in batch:
                    obs_rms.update_from_moments(r["obs_mean"], r["obs_var"], int(r["obs_count"]))

            # ---- GAE per rollout, then one flat batch (each rollout's envs are separate columns) ----
            def stack(key: str, rollouts=tuple(r for _, r in batch)) -> np.ndarray:
                return np.concatenate([r[key] for r in rollouts], axis=1)

            values = torch.from_numpy(stack("values")).to(device)
            advantages, returns = compute_gae(
                torch.from_numpy(np.concatenate(rewards, axis=1).astype(np.float32)).to(device),
                values,
                torch.from_numpy(stack("next_values")).to(device),
                torch.from_numpy(stack("terminations")).to(device),
                torch.from_numpy(stack("truncations")).to(device),
                args.gamma,
                args.gae_lambda,
            )
            b_obs = torch.from_numpy(stack("obs").reshape(args.batch_size, -1)).to(device)
            b_actions = torch.from_numpy(stack("actions").reshape(args.batch_size, *batch[0][1]["actions"].shape[2:]))
            b_actions = b_actions.to(device)
            b_behaviour_logprobs = torch.from_numpy(stack("logprobs").reshape(-1)).to(device)
            b_values, b_advantages, b_returns = values.reshape(-1), advantages.reshape(-1), returns.reshape(-1)
            b_old_logprobs, b_behaviour = b_behaviour_logprobs, None
            if args.stale_correction == "decoupled":
                with torch.no_grad():  # the proximal policy: the learner's own, before this update
                    b_old_logprobs, b_behaviour = agent.evaluate(b_obs, b_actions)[0], b_behaviour_logprobs
            if not (torch.isfinite(b_advantages).all() and torch.isfinite(b_obs).all()):
                tqdm.write(
                    f"{PROG}: warning: skipped a batch with non-finite data at step {global_step}", file=sys.stderr
                )
                continue

            # ---- PPO update ----
            update_start = time.perf_counter()
            frac = 1.0 - version / args.num_iterations
            if args.anneal_lr:
                optimizer.param_groups[0]["lr"] = frac * args.learning_rate
            clipfracs = []
            for _epoch in range(args.update_epochs):
                permutation = torch.randperm(args.batch_size, device=device)
                for start in range(0, args.batch_size, args.minibatch_size):
                    mb = permutation[start : start + args.minibatch_size]
                    new_logprob, entropy, new_value = agent.evaluate(b_obs[mb], b_actions[mb])
                    stats = ppo_loss(
                        new_logprob,
                        b_old_logprobs[mb],
                        b_advantages[mb],
                        new_value,
                        b_values[mb],
                        b_returns[mb],
                        entropy,
                        clip_coef=args.clip_coef,
                        clip_vloss=args.clip_vloss,
                        ent_coef=args.ent_coef,
                        vf_coef=args.vf_coef,
                        norm_adv=args.norm_adv,
                        behaviour_logprob=None if b_behaviour is None else b_behaviour[mb],
                        max_is_weight=args.max_is_weight,
                    )
                    optimizer.zero_grad(set_to_none=True)
                    stats.loss.backward()
                    nn.utils.clip_grad_norm_(parameters, args.max_grad_norm)
                    optimizer.step()
                    clipfracs.append(stats.clipfrac)
                if args.target_kl is not None and stats.approx_kl > args.target_kl:
                    break
            version += 1
            update_seconds = time.perf_counter() - update_start
            if version % args.sync_every == 0:
                sync_seconds = broadcast()

            # ---- Logging ----
            ev = explained_variance(b_values.cpu().numpy(), b_returns.cpu().numpy())
            sps = int((global_step - start_step) / (time.time() - start_time))
            last_stats = {
                "entropy": stats.entropy.item(),
                "approx_kl": stats.approx_kl.item(),
                "explained_variance": ev,
            }
            writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
            writer.add_scalar("losses/value_loss", stats.value_loss.item(), global_step)
            writer.add_scalar("losses/policy_loss", stats.policy_loss.item(), global_step)
            writer.add_scalar("losses/entropy", last_stats["entropy"], global_step)
            writer.add_scalar("losses/old_approx_kl", stats.old_approx_kl.item(), global_step)
            writer.add_scalar("losses/approx_kl", last_stats["approx_kl"], global_step)
            writer.add_scalar("losses/clipfrac", torch.stack(clipfracs).mean().item(), global_step)
            writer.add_scalar("losses/explained_variance", ev, global_step)
            writer.add_scalar("charts/SPS", sps, global_step)
            writer.add_scalar("charts/policy_lag_min", min(lags), global_step)
            writer.add_scalar("charts/policy_lag_mean", float(np.mean(lags)), global_step)
            writer.add_scalar("charts/policy_lag_max", max(lags), global_step)
            for name, value in counters.items():
                writer.add_scalar(f"charts/{name}", value, global_step)
            writer.add_scalar("perf/learner_update_seconds", update_seconds, global_step)
            writer.add_scalar("perf/learner_wait_seconds", wait_seconds, global_step)
            writer.add_scalar("perf/weight_sync_seconds", sync_seconds, global_step)
            progress.update(global_step - progress.n)
            recent = f"{np.mean(recent_returns):.1f}" if recent_returns else "n/a"
            progress.set_postfix_str(f"SPS={sps} return={recent} lag={max(lags)}", refresh=False)
            if args.checkpoint_every and version % args.checkpoint_every == 0:
                save_checkpoint()
            if interrupted:
                status = "interrupted"
                break
    except KeyboardInterrupt:
        status, hard_interrupt = "interrupted", True
    progress.close()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if not hard_interrupt:
        save_checkpoint()
    if args.save_model and status == "completed":
        model_path = os.path.join(run_dir, f"{args.exp_name}.model")
        save_atomic(
            {
                "agent": agent.state_dict(),
                "obs_rms": obs_rms.state_dict(),
                "args": dataclasses.asdict(args),
                "global_step": global_step,
            },
            model_path,
        )
    summary = {
        "status": status,
        "hyperparameters": dataclasses.asdict(args),
        "env_steps": global_step,
        "learner_updates": version,
        "wall_time_seconds": round(wall_time_before + time.time() - start_time, 2),
        "final_entropy": last_stats.get("entropy"),
        "final_explained_variance": last_stats.get("explained_variance"),
        "final_approx_kl": last_stats.get("approx_kl"),
        "mean_return_last_episodes": float(np.mean(recent_returns)) if recent_returns else None,
        "num_last_episodes": len(recent_returns),
        "actor_nodes": len(actor_nodes),
        **counters,
    }
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    writer.close()
    if status == "interrupted":
        print(f"{PROG}: interrupted at step {global_step}; resume with --resume {checkpoint_path}", file=sys.stderr)
        return 130
    return 0


def main() -> int:
    args = tyro.cli(Args)
    try:
        validate_args(args)
        if args.eval_checkpoint:
            run_eval_checkpoint(args)
            return 0
        return train(args)
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
