"""PPO for continuous (Box) action spaces, in one file.

    python ppo_continuous.py --env-id HalfCheetah-v5 --total-timesteps 1000000

Flags and TensorBoard tags follow CleanRL's ppo_continuous_action.py, so a CleanRL command line pastes as is and the
curves overlay. Differences that matter: time-limit truncations bootstrap from V(final observation), normalization
statistics are saved with the policy and frozen at evaluation, a numerical guard drops bad samples, and runs can be
checkpointed, interrupted (Ctrl-C or SIGTERM) and resumed.

The file reads top to bottom as the algorithm: flags, env, agent, rollout, advantages with the numerical guard, the
update, the training loop. The math it calls lives in gae.py; fast_paths.py holds the accelerators that stand in for
acting and for the update where they prove equal, at start-up and on every iteration's own data; run_utils.py holds
what makes a run safe to interrupt, resume and compare (checkpoints, the run folder and logging, loading and
evaluating a saved policy, the command line).
dppo_ray.py imports this file and adds only what distribution needs.
"""

from __future__ import annotations

import importlib
import math
import os
import sys
import time
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch
from torch import nn, optim
from torch.distributions import Categorical, Distribution, Independent, Normal, TransformedDistribution

import run_utils
from fast_paths import FastPaths, NumpyActor, audit_acting, categorical_draw, choose_fast_paths
from gae import (
    DiscountedReturn,
    PPOLoss,
    RunningMeanStd,
    advantage_outliers,
    compute_gae,
    explained_variance,
    finite_moments,
    finite_samples,
    mean_clipfrac,
    normalize_obs,
    ppo_loss,
    scale_rewards,
)
from run_utils import (
    PROG,
    DistributionGap,
    Monitor,
    Policy,
    RunState,
    TrainingLoop,
    UsageError,
    cli,
    end_run,
    observation_layout,
    quiet_mujoco_log,
    require_positive,
    restore_training,
    resume_checkpoint,
    run_folder,
    save_atomic,
    seed_everything,
    training_checkpoint,
)


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, the learner uses CUDA when a GPU is present (the CPU otherwise)"""
    track: bool = False
    """if toggled, the run is tracked with Weights and Biases (needs `pip install wandb`)"""
    wandb_project_name: str = "cleanRL"
    """the wandb project name"""
    wandb_entity: str | None = None
    """the entity (team) of the wandb project"""
    capture_video: bool = False
    """whether to capture videos of the agent's first env (saved under runs/<run-name>/videos; needs moviepy)"""
    save_model: bool = False
    """whether to save the final policy (with its normalization statistics) to runs/<run-name>/<exp-name>.model"""

    # Algorithm-specific arguments (CleanRL's names and defaults)
    env_id: str = "HalfCheetah-v5"
    """the id of the environment; `module:EnvId-v0` imports `module` first (from the working directory too)"""
    total_timesteps: int = 1000000
    """total timesteps of the experiment"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel game environments"""
    num_steps: int = 2048
    """the number of steps to run in each environment per policy rollout"""
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

    # Additions for research use
    run_name: str | None = None
    """the run's folder under runs/ (default: <env-id>__<exp-name>__<seed>__<unix time>)"""
    ent_coef_final: float | None = None
    """if set, the entropy coefficient is annealed linearly from --ent-coef to this value over the run"""
    norm_obs: bool = True
    """normalize observations by their running mean and std (then clip to +-obs-clip)"""
    obs_clip: float = 10.0
    """clip of the normalized observations"""
    obs_warmup_steps: int = 256
    """random-action steps per env that warm the observation statistics before the first rollout (not counted in
    --total-timesteps; 0: the first rollout sees mean 0, std 1)"""
    norm_reward: bool = True
    """scale rewards by the running std of the discounted return (then clip to +-reward-clip)"""
    reward_clip: float = 10.0
    """clip of the scaled rewards"""
    overwrite: bool = False
    """start afresh in an existing --run-name folder, deleting what it holds (without it, such a folder is refused)"""
    checkpoint_every: int = 25
    """save runs/<run-name>/checkpoint.pt every this many iterations (0: only at the end and on Ctrl-C)"""
    resume: str | None = None
    """path of a checkpoint.pt to continue from: the step count, optimizer, statistics and curves carry on, and the
    flags that define the run come from it (raise --total-timesteps to extend it; the schedules then span the new
    total)"""
    eval_checkpoint: str | None = None
    """path of a checkpoint or saved model of either script: evaluate it with the mean (or most likely) action for
    --eval-episodes, without training"""
    eval_episodes: int = 10
    """the number of episodes for --eval-checkpoint and for the evaluation after --save-model"""
    quiet: bool = False
    """no progress bar (warnings, errors and the closing line are still printed)"""
    torch_threads: int = 1
    """torch CPU threads; one is fastest for 64-unit MLPs"""
    guard_max_abs: float = 1e6
    """numerical guard: samples whose advantage or return is above this magnitude are dropped, as are samples with
    NaN/inf data and advantages over 1000 median absolute deviations from the median"""
    guard_patience: int = 3
    """numerical guard: stop the run after this many bad batches in a row (a non-finite loss or gradient, or a
    batch of which under half is usable)"""
    fast_path: bool = True
    """use the fast paths (numpy acting, the stacked update) where they prove equal to Agent and gae.ppo_loss, at
    start-up and on every iteration's own data (see fast_paths.py); --no-fast-path runs everything the plain way"""

    # to be filled in runtime
    batch_size: int = 0
    """the batch size (computed in runtime)"""
    minibatch_size: int = 0
    """the mini-batch size (computed in runtime)"""
    num_iterations: int = 0
    """the number of iterations (computed in runtime)"""


def validate_args(args: Args, batch_shape: str | None = None) -> None:
    positive = ["total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs", "eval_episodes"]
    positive += ["guard_patience", "torch_threads", "learning_rate", "clip_coef", "obs_clip", "reward_clip"]
    require_positive(args, [*positive, "guard_max_abs"])
    if not 0 < args.gamma <= 1 or not 0 <= args.gae_lambda <= 1:
        raise UsageError(f"--gamma must be in (0, 1] and --gae-lambda in [0, 1], got {args.gamma}, {args.gae_lambda}")
    if args.target_kl is not None and not args.target_kl > 0:
        raise UsageError(f"--target-kl must be positive (or None), got {args.target_kl}")
    if args.checkpoint_every < 0 or args.obs_warmup_steps < 0:
        raise UsageError("--checkpoint-every and --obs-warmup-steps must be >= 0")
    if args.resume and args.eval_checkpoint:
        raise UsageError("--resume and --eval-checkpoint do not fit together: evaluate or train, not both")
    args.batch_size = args.num_envs * args.num_steps
    if args.batch_size % args.num_minibatches != 0:
        shape = batch_shape or f"--num-envs {args.num_envs} x --num-steps {args.num_steps}"
        raise UsageError(
            f"--num-minibatches {args.num_minibatches} does not divide the batch ({shape} = {args.batch_size})"
        )
    args.minibatch_size = args.batch_size // args.num_minibatches
    args.num_iterations = args.total_timesteps // args.batch_size
    if args.num_iterations == 0 and not args.eval_checkpoint:
        raise UsageError(f"--total-timesteps {args.total_timesteps} is less than one batch ({args.batch_size} steps)")


# ---------------------------------------------------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------------------------------------------------
def make_env(env_id: str, capture_video: bool = False, video_dir: str = "") -> gym.Env:
    """gym.make, with a Dict or Tuple observation (dm_control's, say) flattened into one vector; `env.obs_layout`
    records how (see observation_layout), and is saved with the policy."""
    try:
        if env_id.startswith("dm_control/"):  # gymnasium 1.x loads no plugins: Shimmy registers these ids on import
            importlib.import_module("shimmy")
        env = gym.make(env_id, render_mode="rgb_array") if capture_video else gym.make(env_id)
    except (gym.error.Error, ModuleNotFoundError, ImportError) as e:
        raise UsageError(f"cannot make env '{env_id}': {str(e).splitlines()[0]}") from None
    layout = observation_layout(env_id, env.observation_space)
    if layout is not None:
        env = gym.wrappers.FlattenObservation(env)
    if capture_video:
        env = gym.wrappers.RecordVideo(env, video_dir)
    env.obs_layout = layout
    return env


def check_spaces(env_id: str, env: gym.Env, allow_discrete: bool = False) -> tuple[int, int, bool]:
    """(obs_dim, action_dim or number of actions, discrete) of an env, or a UsageError."""
    observation_space, action_space = env.observation_space, env.action_space
    discrete = isinstance(action_space, gym.spaces.Discrete)
    if not (isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1) and not (
        discrete and allow_discrete
    ):
        raise UsageError(
            f"{env_id} has a {action_space} action space; ppo_continuous.py needs a continuous (Box) one "
            "(dppo_ray.py also takes Discrete)"
        )
    if not isinstance(observation_space, gym.spaces.Box) or len(observation_space.shape) != 1:
        raise UsageError(f"{env_id} has observation space {observation_space}; a Box, Dict or Tuple is needed")
    return observation_space.shape[0], int(action_space.n) if discrete else action_space.shape[0], discrete


# ---------------------------------------------------------------------------------------------------------------------
# Agent: separate 64-64 tanh actor and critic. Box actions: a Gaussian with a state-independent log-std.
# Discrete actions (dppo_ray.py's CartPole check): a categorical over the same actor's outputs.
# This is the one definition of the network and the policy; fast_paths.py checks its accelerators against it.
# ---------------------------------------------------------------------------------------------------------------------
def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def mlp(in_dim: int, out_dim: int, out_std: float) -> nn.Sequential:
    return nn.Sequential(
        layer_init(nn.Linear(in_dim, 64)),
        nn.Tanh(),
        layer_init(nn.Linear(64, 64)),
        nn.Tanh(),
        layer_init(nn.Linear(64, out_dim), std=out_std),
    )


class Agent(nn.Module):
    obs_layout: list | None = None  # how a Dict/Tuple observation becomes the input vector (observation_layout)

    def __init__(self, obs_dim: int, act_dim: int, discrete: bool = False):
        super().__init__()
        # The constructor's arguments are saved with the policy, to rebuild it
        self.obs_dim = obs_dim
        self.act_dim = act_dim
        self.discrete = discrete
        self.critic = mlp(obs_dim, 1, out_std=1.0)
        self.actor_mean = mlp(obs_dim, act_dim, out_std=0.01)
        if not discrete:
            self.actor_logstd = nn.Parameter(torch.zeros(1, act_dim))

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x).squeeze(-1)

    def get_distribution(self, x: torch.Tensor) -> Distribution:
        """The policy at observations x: one distribution over whole action vectors."""
        if self.discrete:
            return Categorical(logits=self.actor_mean(x), validate_args=False)
        action_mean = self.actor_mean(x)
        action_std = self.actor_logstd.expand_as(action_mean).exp()
        return Independent(Normal(action_mean, action_std, validate_args=False), 1, validate_args=False)

    def evaluate(self, x: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probability of `action`, policy entropy and value: what the loss needs."""
        dist = self.get_distribution(x)
        return dist.log_prob(action.long() if self.discrete else action), dist.entropy(), self.get_value(x)

    def numpy_weights(self) -> dict[str, np.ndarray]:
        """What the sampler receives: plain numpy arrays, cheap to copy and to send to a Ray actor."""
        return {k: v.detach().cpu().numpy().copy() for k, v in self.state_dict().items()}


class TorchActor:
    """Acting the plain way: Agent.get_distribution on a batch of observations. (NumpyActor in fast_paths.py is its
    fast path, used when it matches.) Actions are drawn from the rollout's own noise, so both ways draw the same."""

    def __init__(self, agent: Agent):
        self.agent = agent
        self.discrete = agent.discrete

    def act(self, obs: np.ndarray, noise: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            dist = self.agent.get_distribution(torch.from_numpy(obs))
            if isinstance(dist, Categorical):
                return categorical_draw(dist.logits.double().log_softmax(-1).numpy(), noise)
            gaussian = dist.base_dist if isinstance(dist, Independent) else dist
            if isinstance(gaussian, Normal):
                return (gaussian.loc + gaussian.scale * torch.from_numpy(noise).to(gaussian.loc.dtype)).numpy()
            return dist.sample().numpy()  # another distribution: its own sampler, from torch's generator

    def log_prob(self, obs: np.ndarray, actions: np.ndarray, noise: np.ndarray) -> np.ndarray:
        """Log-probabilities of the actions (any leading shape), computed once after the rollout's loop."""
        with torch.no_grad():
            flat_obs = torch.from_numpy(obs.reshape(-1, obs.shape[-1]))
            flat_actions = torch.from_numpy(actions.reshape(len(flat_obs), *actions.shape[obs.ndim - 1 :]))
            logprob = self.agent.evaluate(flat_obs, flat_actions)[0]
        return logprob.numpy().reshape(obs.shape[:-1])

    def best_action(self, obs: np.ndarray) -> np.ndarray:
        """The distribution's mode: the mean, or the most likely action (see distribution_mode)."""
        with torch.no_grad():
            return distribution_mode(self.agent.get_distribution(torch.from_numpy(np.asarray(obs, np.float32)))).numpy()


def distribution_mode(dist: Distribution) -> torch.Tensor:
    """The action that "mean action" evaluation takes: the distribution's mode. A transformed distribution without one
    (a tanh-squashed Gaussian, say) takes its base distribution's mode through the transforms, as SAC's evaluation
    does. Any other distribution without a mode is a DistributionGap."""
    try:
        return dist.mode
    except NotImplementedError:
        if isinstance(dist, Independent):
            return distribution_mode(dist.base_dist)
        if isinstance(dist, TransformedDistribution):
            action = distribution_mode(dist.base_dist)
            for transform in dist.transforms:
                action = transform(action)
            return action
        raise DistributionGap(
            f"the policy's {type(dist).__name__} has no mode, which mean-action evaluation and predict need: give it "
            "one, or return a distribution that has one from Agent.get_distribution"
        ) from None


def make_actor(agent: Agent, fast: bool) -> NumpyActor | TorchActor:
    return NumpyActor(agent) if fast else TorchActor(agent)


# ---------------------------------------------------------------------------------------------------------------------
# Rollout: the Sampler steps the envs with the latest policy; in dppo_ray.py each Ray rollout actor is one
# ---------------------------------------------------------------------------------------------------------------------
def step_envs(envs: list[gym.Env], actions: np.ndarray, out: tuple[np.ndarray, ...] | None = None):
    """Step every env; an env whose episode ended is reset in the same call. `out`: the (observations, rewards,
    terminations, truncations) rows to fill, as the rollout passes its own arrays' rows, instead of new arrays.

    This is gymnasium's SAME_STEP autoreset written out: the returned observation of a finished env is the first one
    of its next episode, and `final_obs` maps its index to the last observation of the episode that ended, which the
    truncation bootstrap needs. (gymnasium's vector envs default to NEXT_STEP, where the step after an episode end
    is a fake transition that must not be trained on; stepping a list directly also skips the vector env's
    bookkeeping.)"""
    n = len(envs)
    if out is None:
        out = (None, np.zeros(n), np.zeros(n, bool), np.zeros(n, bool))
    observations, rewards, terminations, truncations = out
    final_obs: dict[int, np.ndarray] = {}
    for i, (env, action) in enumerate(zip(envs, actions)):
        obs, reward, terminated, truncated, _ = env.step(action)
        rewards[i] = reward
        terminations[i] = terminated
        truncations[i] = truncated
        if terminated or truncated:
            final_obs[i] = obs
            obs, _ = env.reset()
        if observations is None:
            observations = np.empty((n, *np.shape(obs)))
        observations[i] = obs
    return observations, rewards, terminations, truncations, final_obs


class Sampler:
    """Steps `num_envs` envs with the latest policy it was given and returns each rollout as a dict of numpy arrays.
    Episodes continue across rollouts. Observations are stored normalized with the statistics the policy acted on,
    and the raw observations' moments go back to the learner, which owns the statistics."""

    def __init__(self, env_id: str, num_envs: int, seed: int, args: Args, video_dir: str = "", allow_discrete=False):
        quiet_mujoco_log()
        self.envs = [make_env(env_id, args.capture_video and i == 0, video_dir) for i in range(num_envs)]
        self.spaces = check_spaces(env_id, self.envs[0], allow_discrete)  # (obs_dim, act_dim, discrete)
        self.discrete = self.spaces[2]
        space = self.envs[0].action_space
        self.low = None if self.discrete else space.low
        self.high = None if self.discrete else space.high
        self.obs_clip = args.obs_clip
        self.norm_obs = args.norm_obs
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.warmup_rng = np.random.default_rng([seed, 1])
        self.raw_obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(self.envs)])
        self.returns = DiscountedReturn(num_envs, args.gamma)
        self.episode_returns = np.zeros(num_envs)
        self.episode_lengths = np.zeros(num_envs, dtype=np.int64)
        self.agent: Agent | None = None  # the sampler's own copy, built when the first weights arrive
        self.policy: NumpyActor | TorchActor | None = None
        self.version = -1
        self.obs_mean = self.obs_std = None

    def set_policy(self, weights: dict[str, np.ndarray], version: int) -> int:
        """`weights`: policy_weights, the agent's numpy state dict plus the learner's observation statistics and
        whether its numpy fast path matched. The sampler keeps an Agent of its own to act with, or to mirror."""
        if self.agent is None:
            with torch.random.fork_rng(devices=[]):  # the learner's random stream must not depend on where this runs
                self.agent = Agent(*self.spaces)
        self.agent.load_state_dict({key: torch.tensor(weights[key]) for key in self.agent.state_dict()})
        self.policy = make_actor(self.agent, bool(weights["fast_acting"]))
        self.version = version
        if self.norm_obs:
            self.obs_mean = weights["obs_mean"]
            self.obs_std = np.sqrt(weights["obs_var"] + 1e-8)
        return version

    def normalize(self, raw: np.ndarray, out: np.ndarray | None = None, fill: float = np.nan) -> np.ndarray:
        return normalize_obs(raw, self.obs_mean, self.obs_std, self.obs_clip, out, fill)

    def warm_up(self, steps: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Moments of the observations met in `steps` random-action steps per env; then every env starts afresh."""
        seen = [self.raw_obs]
        n = len(self.envs)
        if not self.discrete:
            low, high = np.nan_to_num(self.low, neginf=-1.0), np.nan_to_num(self.high, posinf=1.0)
        for _ in range(steps):
            if self.discrete:
                actions = self.warmup_rng.integers(self.envs[0].action_space.n, size=n)
            else:
                actions = self.warmup_rng.uniform(low, high, size=(n, len(low)))
            seen.append(step_envs(self.envs, actions)[0])
        self.raw_obs = np.stack([env.reset(seed=self.seed + i)[0] for i, env in enumerate(self.envs)])
        return finite_moments(np.concatenate(seen))

    def rollout(self, num_steps: int) -> dict[str, np.ndarray]:
        """The loop does only what the next env step needs; the rest is done on whole arrays after it. (Work done
        right after an env's wait costs several times more CPU than the same work in a tight loop: caches are cold.)"""
        start = time.perf_counter()
        num_envs, obs_dim = len(self.envs), self.raw_obs.shape[1]
        shape = (num_steps, num_envs)
        obs = np.zeros((*shape, obs_dim), np.float32)
        raw_obs = np.zeros((num_steps + 1, num_envs, obs_dim))
        raw_obs[0] = self.raw_obs  # the envs write each step's successor into the next row
        actions = np.zeros((*shape, *(() if self.discrete else self.low.shape)), np.float32)
        rewards = np.zeros(shape)
        terminations = np.zeros(shape, bool)
        truncations = np.zeros(shape, bool)
        final_obs, final_index = [], []
        # The rollout's noise, drawn at once: standard normal for a Gaussian, uniform for a categorical
        noise = self.rng.random((*shape, 1)) if self.discrete else self.rng.standard_normal((*shape, *self.low.shape))
        for step in range(num_steps):
            # A non-finite observation is acted on as zeros; after the loop its stored row becomes NaN, for the guard.
            acting_obs = self.normalize(raw_obs[step], out=obs[step], fill=0.0)
            action = self.policy.act(acting_obs, noise[step])
            actions[step] = action
            env_action = action if self.discrete else np.minimum(np.maximum(action, self.low), self.high)
            *_, final = step_envs(
                self.envs, env_action, (raw_obs[step + 1], rewards[step], terminations[step], truncations[step])
            )
            for i, last_obs in final.items():
                if truncations[step, i] and not terminations[step, i]:
                    final_obs.append(self.normalize(last_obs))
                    final_index.append((step, i))
        logprobs = self.policy.log_prob(obs, actions, noise).astype(np.float32)
        acted_fast = isinstance(self.policy, NumpyActor)
        # The numpy actor is audited on the observations it acted on (as acted: before NaN rows are marked)
        audit, problem = audit_acting(self.policy, self.agent, obs, actions, logprobs) if acted_fast else (np.nan, None)
        obs[~np.isfinite(raw_obs[:num_steps]).all(axis=-1)] = np.nan
        ended = terminations | truncations
        episode_returns, episode_lengths = self.finished_episodes(rewards, ended)
        self.raw_obs = raw_obs[num_steps].copy()
        obs_mean, obs_var, obs_count = finite_moments(raw_obs[:num_steps].reshape(-1, obs_dim))
        return {
            "obs": obs,
            "actions": actions,
            "logprobs": logprobs,
            "rewards": rewards,
            "discounted_returns": self.returns.run(rewards, ended),
            "terminations": terminations,
            "truncations": truncations,
            "final_obs": np.array(final_obs, np.float32).reshape(-1, obs_dim),
            "final_index": np.array(final_index, np.int64).reshape(-1, 2),
            "next_obs": self.normalize(self.raw_obs),
            "obs_mean": obs_mean,
            "obs_var": obs_var,
            "obs_count": np.array(obs_count),
            "episode_returns": np.array(episode_returns),
            "episode_lengths": np.array(episode_lengths),
            "acted_fast": np.array(acted_fast),
            "acting_audit": np.array(audit),
            "acting_problem": np.array(problem or ""),
            "policy_version": np.array(self.version),
            "sample_seconds": np.array(time.perf_counter() - start),
        }

    def finished_episodes(self, rewards: np.ndarray, ended: np.ndarray) -> tuple[list[float], list[int]]:
        """Return and length of every episode that ended in this rollout, in the order they ended; the unfinished
        ones' sums carry over to the next rollout. (Once per rollout rather than two array updates per step.)"""
        returns, lengths = [], []
        start = np.zeros(len(self.envs), np.int64)
        for step, i in zip(*np.nonzero(ended)):
            returns.append(self.episode_returns[i] + rewards[start[i] : step + 1, i].sum())
            lengths.append(self.episode_lengths[i] + step + 1 - start[i])
            self.episode_returns[i] = 0.0
            self.episode_lengths[i] = 0
            start[i] = step + 1
        self.episode_returns += [rewards[first:, i].sum() for i, first in enumerate(start)]
        self.episode_lengths += len(rewards) - start
        return returns, lengths

    def close(self) -> None:
        for env in self.envs:
            env.close()


# ---------------------------------------------------------------------------------------------------------------------
# Learner: the agent, its optimizer and the statistics; advantages with the per-sample guard (shared by both scripts)
# ---------------------------------------------------------------------------------------------------------------------
@dataclass
class Learner:
    """What a run trains and saves: the agent, its optimizer, the fast paths that stand in for parts of the plain path
    (none until start_fast_paths), and the running statistics of the observations and of the discounted return."""

    agent: Agent
    optimizer: optim.Optimizer
    obs_rms: RunningMeanStd
    return_rms: RunningMeanStd
    fast: FastPaths = field(default_factory=FastPaths)


def make_learner(args: Args, obs_dim: int, act_dim: int, discrete: bool, device: torch.device) -> Learner:
    agent = Agent(obs_dim, act_dim, discrete).to(device)
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    return Learner(agent, optimizer, RunningMeanStd(shape=(obs_dim,)), RunningMeanStd(shape=()))


def loss_settings(args: Args, ent_coef: float) -> dict:
    """gae.ppo_loss's keyword arguments for this run (dppo_ray.py's --max-is-weight included when it has one)."""
    settings = dict(clip_coef=args.clip_coef, clip_vloss=args.clip_vloss, ent_coef=ent_coef, vf_coef=args.vf_coef)
    settings["norm_adv"] = args.norm_adv
    if hasattr(args, "max_is_weight"):
        settings["max_is_weight"] = args.max_is_weight
    return settings


def start_fast_paths(learner: Learner, args: Args, decoupled: bool = False) -> None:
    """Check the fast paths against Agent, ppo_loss and the optimizer (fast_paths.py); the run uses those that match,
    and each that steps aside says so in one line."""
    agent = learner.agent
    ent_coefs = {args.ent_coef} if args.ent_coef_final is None else {args.ent_coef, args.ent_coef_final}
    settings = [loss_settings(args, ent_coef) for ent_coef in sorted(ent_coefs)]
    plain = (loss_and_gradients, clip_gradients)
    learner.fast, lines = choose_fast_paths(agent, learner.optimizer, settings, decoupled, args.fast_path, plain)
    for line in lines:
        print(f"{PROG}: {line}", file=sys.stderr)


def policy_weights(learner: Learner) -> dict[str, np.ndarray]:
    """What a sampler acts with: the numpy weights, the observation statistics and which way to act."""
    weights = learner.agent.numpy_weights()
    weights["obs_mean"] = learner.obs_rms.mean.copy()
    weights["obs_var"] = learner.obs_rms.var.copy()
    weights["fast_acting"] = np.array(learner.fast.acting)
    return weights


def anneal(optimizer: optim.Optimizer, args: Args, iteration: int) -> float:
    """Set this iteration's learning rate (CleanRL's linear schedule); return its entropy coefficient."""
    frac = 1.0 - (iteration - 1.0) / args.num_iterations
    if args.anneal_lr:
        for group in optimizer.param_groups:
            group["lr"] = frac * args.learning_rate
    if args.ent_coef_final is None:
        return args.ent_coef
    return args.ent_coef_final + frac * (args.ent_coef - args.ent_coef_final)


def update_statistics(rollout: dict, learner: Learner, args: Args) -> None:
    """The learner owns the statistics: it merges the moments of the raw observations and of the discounted returns
    that a sampler met (both already filtered for NaN and inf)."""
    if args.norm_obs:
        learner.obs_rms.update_from_moments(rollout["obs_mean"], rollout["obs_var"], int(rollout["obs_count"]))
    if args.norm_reward:
        learner.return_rms.update(rollout["discounted_returns"].reshape(-1))


def prepare_batch(learner: Learner, rollout: dict, args: Args) -> dict:
    """Scale the rewards, value the batch and run GAE with the per-sample guard; flat tensors of the samples kept."""
    agent = learner.agent
    device = next(agent.parameters()).device

    def tensor(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(x)).to(device)

    rewards = rollout["rewards"]
    if args.norm_reward:
        rewards = scale_rewards(rewards, learner.return_rms, args.reward_clip)
    valid = finite_samples(rollout["obs"], rollout["actions"], rollout["rewards"])
    num_steps, num_envs = rewards.shape
    b_obs = tensor(rollout["obs"].reshape(num_steps * num_envs, -1))
    b_actions = tensor(rollout["actions"].reshape(num_steps * num_envs, *rollout["actions"].shape[2:]))
    with torch.no_grad():
        b_values = agent.get_value(b_obs)
        values = b_values.view(num_steps, num_envs)
        # next_values[t] = V(successor of step t): the next stored obs, the obs after the rollout for the last step,
        # and V(final obs) where a time limit cut the episode (a reset obs is not a successor).
        next_values = torch.cat([values[1:], agent.get_value(tensor(rollout["next_obs"]))[None]])
        steps, envs = rollout["final_index"].T
        if len(steps):
            next_values[steps, envs] = agent.get_value(tensor(rollout["final_obs"]))
        advantages, returns = compute_gae(
            tensor(rewards.astype(np.float32)),
            values,
            next_values,
            tensor(rollout["terminations"]),
            tensor(rollout["truncations"]),
            args.gamma,
            args.gae_lambda,
            valid=tensor(valid),
        )
    outliers = advantage_outliers(advantages.cpu().numpy(), returns.cpu().numpy(), valid, args.guard_max_abs)
    keep = tensor((valid & ~outliers).reshape(-1)).nonzero().squeeze(1)
    batch = {
        "obs": b_obs,
        "actions": b_actions,
        "logprobs": tensor(rollout["logprobs"].reshape(-1)),
        "values": b_values,
        "advantages": advantages.reshape(-1),
        "returns": returns.reshape(-1),
    }
    batch = {key: column[keep] for key, column in batch.items()}
    batch["size"] = num_steps * num_envs
    batch["non_finite"] = int((~valid).sum())
    batch["outliers"] = int(outliers.sum())
    return batch


# ---------------------------------------------------------------------------------------------------------------------
# The update: the PPO epochs, as CleanRL writes them (fast_paths.StackedUpdate may stand in for two of its functions)
# ---------------------------------------------------------------------------------------------------------------------
def loss_and_gradients(agent: Agent, optimizer: optim.Optimizer, minibatch: dict, **loss_kwargs) -> PPOLoss:
    """One minibatch's loss through Agent.evaluate and gae.ppo_loss, and its gradient by autograd."""
    new_logprob, entropy, new_value = agent.evaluate(minibatch["obs"], minibatch["actions"])
    stats = ppo_loss(
        new_logprob,
        minibatch["logprobs"],
        minibatch["advantages"],
        new_value,
        minibatch["values"],
        minibatch["returns"],
        entropy,
        behaviour_logprob=minibatch.get("behaviour_logprobs"),
        **loss_kwargs,
    )
    optimizer.zero_grad()
    stats.loss.backward()
    return stats


def clip_gradients(gradients: list[torch.Tensor], max_norm: float) -> float:
    """nn.utils.clip_grad_norm_'s clip, in place: scale the gradients so that their global norm is at most max_norm;
    returns the norm before clipping. (The fast update passes its one flat gradient buffer, the plain path each
    parameter's gradient; the start-up check makes sure that this function treats them alike.)"""
    norms = [torch.linalg.vector_norm(g) for g in gradients]
    norm = (norms[0] if len(norms) == 1 else torch.linalg.vector_norm(torch.stack(norms))).item()
    if norm > max_norm:  # a NaN norm falls through to the caller's guard
        for g in gradients:
            g.mul_(max_norm / (norm + 1e-6))
    return norm


def audit_fast_update(learner: Learner, minibatch: dict, loss_kwargs: dict, iteration: int) -> None:
    """Before an update's first step: a minibatch of its batch on the fast path and the plain one
    (fast_paths.StackedUpdate.audit). Where the stacked update differs from autograd through the live Agent and
    ppo_loss, the update moves to the plain path before it steps."""
    fast = learner.fast
    _, difference, reason, loss_reason = fast.update.audit(
        minibatch, loss_kwargs, loss_and_gradients, learner.optimizer
    )
    fast.differences["update"] = difference
    if loss_reason is not None:
        print(f"{PROG}: {fast.step_aside('loss gradient', iteration, loss_reason, learner.optimizer)}", file=sys.stderr)
    if reason is not None:
        print(f"{PROG}: {fast.step_aside('update', iteration, reason, learner.optimizer)}", file=sys.stderr)


def ppo_update(learner: Learner, batch: dict, args: Args, ent_coef: float, iteration: int) -> tuple[dict, str | None]:
    """--update-epochs passes over shuffled minibatches of the samples the guard kept. Returns the statistics of the
    last minibatch (as CleanRL logs them) and a problem string when the loss or a gradient went non-finite.
    `iteration` (1-based) names the update in the audit's line."""
    agent = learner.agent
    audit = learner.fast.update is not None  # before the first step, a minibatch of this batch runs both ways
    kept = len(batch["advantages"])
    if kept < batch["size"] / 2:
        return {}, f"only {kept} of {batch['size']} samples are usable (NaN/inf data or outlier advantages)"
    loss_kwargs = loss_settings(args, ent_coef)
    # The batch's columns side by side in one tensor, so that a minibatch is one gather and views of it: the
    # per-sample vectors (observations, Box actions), then the per-sample numbers stacked
    vectors = [key for key, value in batch.items() if isinstance(value, torch.Tensor) and value.dim() == 2]
    numbers = [key for key, value in batch.items() if isinstance(value, torch.Tensor) and value.dim() == 1]
    packed = torch.cat([batch[key] for key in vectors] + [torch.stack([batch[key] for key in numbers], 1)], 1)
    widths = [batch[key].shape[1] for key in vectors] + [len(numbers)]
    ratios = []
    stats = None
    for epoch in range(args.update_epochs):
        permutation = torch.randperm(kept, device=batch["advantages"].device)
        for indices in torch.tensor_split(permutation, args.num_minibatches):
            if len(indices) == 0:  # more minibatches than samples kept
                continue
            if audit:  # the first minibatch with the batch's extreme observations, where a clamp would bind
                rows = torch.unique(torch.cat([indices, batch["obs"].argmin(0), batch["obs"].argmax(0)]))
                *vector_rows, number_rows = packed.index_select(0, rows).split(widths, 1)
                audited = dict(zip(vectors, vector_rows)) | dict(zip(numbers, number_rows.unbind(1)))
                audit_fast_update(learner, audited, loss_kwargs, iteration)
                audit = False
            *vector_rows, number_rows = packed.index_select(0, indices).split(widths, 1)
            minibatch = dict(zip(vectors, vector_rows)) | dict(zip(numbers, number_rows.unbind(1)))
            fast_update = learner.fast.update
            if fast_update is not None:
                stats = fast_update.loss_and_gradients(minibatch, **loss_kwargs)
            else:
                stats = loss_and_gradients(agent, learner.optimizer, minibatch, **loss_kwargs)
            loss = stats.loss.item()  # the guard must see it before the step
            if not math.isfinite(loss) or abs(loss) > args.guard_max_abs:
                return {}, f"loss {loss:.3g} in epoch {epoch + 1}"
            if fast_update is not None:
                gradients = [fast_update.grads]
            else:
                gradients = [p.grad for p in agent.parameters() if p.grad is not None]
            if not math.isfinite(clip_gradients(gradients, args.max_grad_norm)):
                return {}, f"non-finite gradient in epoch {epoch + 1}"
            if fast_update is not None:
                fast_update.step()
            else:
                learner.optimizer.step()
            ratios.append(stats.ratio.detach())
        if args.target_kl is not None and stats.approx_kl > args.target_kl:
            break
    values, returns = batch["values"].cpu().numpy(), batch["returns"].cpu().numpy()
    return {
        "losses/value_loss": stats.value_loss.item(),
        "losses/policy_loss": stats.policy_loss.item(),
        "losses/entropy": stats.entropy.item(),
        "losses/old_approx_kl": stats.old_approx_kl.item(),
        "losses/approx_kl": stats.approx_kl.item(),
        "losses/clipfrac": mean_clipfrac(ratios, args.clip_coef),
        "losses/explained_variance": explained_variance(values, returns),
    }, None


def discard_wrongly_acted(learner: Learner, rollouts: list[dict], iteration: int, counters: dict) -> bool:
    """Read the samplers' audits of their numpy actors (fast_paths.audit_acting, on each rollout's own observations).
    True when one acted otherwise than Agent: then none of these rollouts is trained on (sampling again keeps PPO's
    ratio anchored to the policy that acted; rescoring the actions with Agent would not), their steps and episodes
    still count, as DPPO's dropped rollouts do, and acting moves to torch for the rest of the run."""
    audits = [float(r["acting_audit"]) for r in rollouts if np.isfinite(r["acting_audit"])]
    if audits:
        learner.fast.differences["acting"] = max(audits)
    problems = [str(r["acting_problem"]) for r in rollouts if str(r["acting_problem"])]
    if not problems:
        return False
    counters["discarded_rollouts"] += len(rollouts)
    if learner.fast.acting:
        reason = f"{problems[0]}; its rollout is discarded and sampled again"
        print(f"{PROG}: {learner.fast.step_aside('acting', iteration, reason, learner.optimizer)}", file=sys.stderr)
    return True


def load_policy(path: str) -> Policy:
    """A model or checkpoint of either script, acting with this file's Agent (run_utils.Policy: predict(obs))."""
    return run_utils.load_policy(path, sys.modules[__name__])


# ---------------------------------------------------------------------------------------------------------------------
# Training: the algorithm box
# ---------------------------------------------------------------------------------------------------------------------
def train(args: Args) -> int:
    ckpt = resume_checkpoint(args)
    device = seed_everything(args)
    run_dir = run_folder(args)
    seed = args.seed + (int(ckpt["global_step"]) if ckpt else 0)
    sampler = Sampler(args.env_id, args.num_envs, seed, args, os.path.join(run_dir, "videos"))  # a bad env fails here
    obs_dim, act_dim, _ = sampler.spaces
    learner = make_learner(args, obs_dim, act_dim, False, device)
    learner.agent.obs_layout = sampler.envs[0].obs_layout
    learner.agent.action_bounds = [sampler.low, sampler.high]
    state = RunState()
    if ckpt is not None:
        state = restore_training(ckpt, learner, args.resume)
        sampler.rng.bit_generator.state = ckpt["sampler_rng"]
    elif args.norm_obs and args.obs_warmup_steps:
        learner.obs_rms.update_from_moments(*sampler.warm_up(args.obs_warmup_steps))
    start_fast_paths(learner, args)
    monitor = Monitor(args, run_dir, state, act_dim, learner.fast)

    def save_checkpoint() -> None:
        checkpoint = training_checkpoint(learner, args, state, monitor)
        checkpoint["sampler_rng"] = sampler.rng.bit_generator.state
        save_atomic(checkpoint, os.path.join(run_dir, "checkpoint.pt"))

    with TrainingLoop(run_dir) as loop:
        while state.iteration < args.num_iterations and loop.signum is None:
            ent_coef = anneal(learner.optimizer, args, state.iteration + 1)
            discarded = True
            while discarded:  # a rollout that a wrong actor acted on is sampled again, acting with torch
                sampler.set_policy(policy_weights(learner), state.iteration)
                rollout = sampler.rollout(args.num_steps)
                state.global_step += rollout["rewards"].size
                monitor.episodes(rollout)
                update_statistics(rollout, learner, args)
                discarded = discard_wrongly_acted(learner, [rollout], state.iteration + 1, state.counters)
            batch = prepare_batch(learner, rollout, args)
            stats, problem = ppo_update(learner, batch, args, ent_coef, state.iteration + 1)
            state.iteration += 1
            schedules = {"charts/learning_rate": learner.optimizer.param_groups[0]["lr"], "charts/ent_coef": ent_coef}
            updated = monitor.update(stats, problem, batch, schedules)
            if updated and args.checkpoint_every and state.iteration % args.checkpoint_every == 0:
                save_checkpoint()
    if loop.keeps_state:
        save_checkpoint()
    eval_failed = end_run(monitor, loop.status, learner, state, sys.modules[__name__], {})
    sampler.close()
    return loop.exit_status() or eval_failed


if __name__ == "__main__":
    sys.exit(cli(Args, validate_args, train, sys.modules[__name__]))
