"""PPO for continuous (Box) action spaces, in one file.

    python ppo_continuous.py --env-id HalfCheetah-v5 --total-timesteps 1000000

Flags and TensorBoard tags follow CleanRL's ppo_continuous_action.py, so a CleanRL command line pastes as is and the
curves overlay. Differences that matter: time-limit truncations bootstrap from V(final observation), normalization
statistics are saved with the policy and frozen at evaluation, a numerical guard drops bad samples, and runs can be
checkpointed, interrupted (Ctrl-C or SIGTERM) and resumed.

The file reads top to bottom as the algorithm: flags, env, agent, acting, the rollout, advantages with the guard, the
update, the training loop. The math is gae.py's; every gradient is autograd's through Agent and gae.ppo_loss (one
function, compiled where it compiles). fast_paths.py holds the audited numpy mirror of acting and when the compiled
gradient steps aside; checkpoints.py and run_management.py make a run safe to interrupt, resume and compare; launcher.py
runs --num-seeds and --grid as single runs of this file; dppo_ray.py runs its training loop on Ray actors.
"""

from __future__ import annotations

import sys

import launcher  # the standard library only

if __name__ == "__main__" and launcher.asked(sys.argv[1:]):  # seeds, a grid: single runs of this file, as processes
    sys.exit(launcher.launch(__file__, sys.argv[1:]))

import importlib
import os
import traceback
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch
from torch import nn, optim
from torch.distributions import Distribution, Independent, Normal

import checkpoints
import gae
import run_management
from checkpoints import RunState, UsageError, restore_training, resume_checkpoint, save_atomic, training_checkpoint
from fast_paths import FastPaths, NumpyActor, audit_acting, choose_paths, failure, sample_again, update_gradient
from run_management import PROG, Interrupted, Monitor, Run, StopRun, TrainingLoop, check_run_flags, cli, finish_run


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
    upload_model: bool = False
    """CleanRL's upload of the saved model to the Hugging Face Hub: not supported here (refused in one line)"""
    hf_entity: str = ""
    """the user or org name of the model repository on the Hugging Face Hub (CleanRL's; only --upload-model uses it)"""

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
    rollout_timeout: float = 0.0
    """seconds a rollout (or the warm-up) may take: past them the run stops with the checkpoint of its last update,
    one line naming the env that did not answer, and exit status 124; 0: 60 s plus 20 ms per env step of a rollout"""
    fast_path: bool = True
    """act with the numpy mirror of the actor where it matches TorchActor (checked at start-up and on every rollout)
    and compile the gradient (--compile); --no-fast-path acts with torch and trains with the eager gradient"""
    compile: bool | None = None
    """torch.compile the loss and gradient (eager where it cannot, with a line); default: where the run's gradient
    steps reach 20,000, which repay a cold build (10 s; 0.6 ms saved a step, 2 cores); --compile/--no-compile force"""
    num_seeds: int = 1
    """train this many seeds (--seed, --seed + 1, ...), each the single run of this command with its own --seed, in a
    process and a folder of its own, runs/<run-name>__<seed> (launcher.py)"""
    grid: list[str] = field(default_factory=list)
    """FLAG=V1,V2 [FLAG=V1,V2 ...]: every combination of these values, --num-seeds seeds each, in
    runs/<run-name>__<FLAG=V>__<seed>, and at the end each combination against the first (launcher.py)"""
    seed_processes: int = 0
    """with --num-seeds or --grid: how many runs go at once (0: one per core this process may use)"""
    ray_address: str | None = None
    """with --num-seeds or --grid: the runs are Ray tasks on this cluster (`auto`: the one `ray start` set up here)"""

    # to be filled in runtime
    batch_size: int = 0
    """the batch size (computed in runtime)"""
    minibatch_size: int = 0
    """the mini-batch size (computed in runtime)"""
    num_iterations: int = 0
    """the number of iterations (computed in runtime)"""


def validate_args(args: Args, batch_shape: str | None = None) -> None:
    check_run_flags(args)  # each flag's range; files, videos, resuming, the seeds' processes
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
    records how (checkpoints.observation_layout), and is saved with the policy."""
    run_management.quiet_mujoco_log()  # before the model is built, in every process and every use (training too)
    try:
        if env_id.startswith("dm_control/"):  # gymnasium 1.x loads no plugins: Shimmy registers these ids on import
            importlib.import_module("shimmy")
        env = gym.make(env_id, render_mode="rgb_array") if capture_video else gym.make(env_id)
    except (gym.error.Error, ModuleNotFoundError, ImportError) as e:
        raise UsageError(f"cannot make env '{env_id}': {checkpoints.first_line(e)}") from None
    layout = checkpoints.observation_layout(env_id, env.observation_space)
    if layout is not None:
        env = gym.wrappers.FlattenObservation(env)
    if capture_video:
        env = gym.wrappers.RecordVideo(env, video_dir)
    env.obs_layout = layout
    return env


# ---------------------------------------------------------------------------------------------------------------------
# Agent: separate 64-64 tanh actor and critic, a Gaussian policy with a state-independent log-std.
# This is the one definition of the network and the policy: the update differentiates it, the numpy actor is checked
# against TorchActor, which acts with it.
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
    obs_layout: list | None = None  # how a Dict/Tuple observation becomes the input vector (saved with the policy)

    def __init__(self, obs_dim: int, act_dim: int):
        super().__init__()
        self.obs_dim = obs_dim  # the constructor's arguments are saved with the policy, to rebuild it
        self.act_dim = act_dim
        self.critic = mlp(obs_dim, 1, out_std=1.0)
        self.actor_mean = mlp(obs_dim, act_dim, out_std=0.01)
        self.actor_logstd = nn.Parameter(torch.zeros(1, act_dim))

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x).squeeze(-1)

    def get_distribution(self, x: torch.Tensor) -> Distribution:
        """The policy at observations x: one distribution over whole action vectors."""
        action_mean = self.actor_mean(x)
        action_std = self.actor_logstd.expand_as(action_mean).exp()
        return Independent(Normal(action_mean, action_std, validate_args=False), 1, validate_args=False)

    def evaluate(self, x: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probability of `action`, policy entropy and value: what the loss needs."""
        dist = self.get_distribution(x)
        return dist.log_prob(action), dist.entropy(), self.get_value(x)

    def numpy_weights(self) -> dict[str, np.ndarray]:
        """What the sampler receives: plain numpy arrays, cheap to copy and to send to another process."""
        return {k: v.detach().cpu().numpy().copy() for k, v in self.state_dict().items()}


class TorchActor:
    """Acting: Agent.get_distribution on a batch of observations, the action drawn from the rollout's own noise.
    (fast_paths.NumpyActor, with the same methods, stands in where it acts as this does, audited on every rollout.)"""

    def __init__(self, agent: Agent):
        self.agent = agent

    def act(self, obs: np.ndarray, noise: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            dist = self.agent.get_distribution(torch.from_numpy(obs))
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


# ---------------------------------------------------------------------------------------------------------------------
# Rollout: the Sampler steps the envs with the latest policy it was given
# ---------------------------------------------------------------------------------------------------------------------
def step_envs(envs: list[gym.Env], actions: np.ndarray, out: tuple[np.ndarray, ...] | None = None):
    """Step every env; an env whose episode ended is reset in the same call. `out`: the (observations, rewards,
    terminations, truncations) rows to fill (the rollout's own arrays' rows) instead of new arrays.

    This is gymnasium's SAME_STEP autoreset written out: a finished env returns the first observation of its next
    episode, and `final_obs` maps its index to the last one of the episode that ended, for the truncation bootstrap.
    (gymnasium's vector envs default to NEXT_STEP, whose step after an episode end is a fake transition that must not
    be trained on; a plain list also skips the vector env's bookkeeping.)"""
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

    def __init__(self, env_id: str, num_envs: int, seed: int, args: Args, video_dir: str = ""):
        self.envs = [make_env(env_id, args.capture_video and i == 0, video_dir) for i in range(num_envs)]
        self.spaces = self.check_spaces(env_id, self.envs[0])  # (obs_dim, act_dim): a bad env fails here
        self.action_space = self.envs[0].action_space
        self.obs_layout = self.envs[0].obs_layout
        self.obs_clip = args.obs_clip
        self.norm_obs = args.norm_obs
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.raw_obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(self.envs)])
        self.returns = gae.DiscountedReturn(num_envs, args.gamma)
        self.episode_returns = np.zeros(num_envs)
        self.episode_lengths = np.zeros(num_envs, dtype=np.int64)
        self.agent: Agent | None = None  # the sampler's own copy, built when the first weights arrive
        self.policy: NumpyActor | TorchActor | None = None
        self.obs_mean = self.obs_std = None
        self.rollout_timeout = run_management.rollout_timeout(args, num_envs)  # TrainingLoop.watch

    def check_spaces(self, env_id: str, env: gym.Env) -> tuple[int, int]:
        return run_management.box_spaces(env_id, env)

    @property
    def rng_state(self) -> dict:
        """The state of the generator of the rollouts' noise (saved in checkpoints)."""
        return self.rng.bit_generator.state

    @rng_state.setter
    def rng_state(self, state: dict | None) -> None:
        if state is not None:  # None: dppo_ray.py's actors keep no stream; this one stays seeded from the step
            self.rng.bit_generator.state = state

    def make_agent(self) -> Agent:
        return Agent(*self.spaces)

    def make_actor(self, fast: bool) -> NumpyActor | TorchActor:
        return NumpyActor(self.agent) if fast else TorchActor(self.agent)

    def draw_noise(self, shape: tuple[int, ...]) -> np.ndarray:
        """The rollout's noise, drawn at once: standard normal, one per action dimension."""
        return self.rng.standard_normal((*shape, *self.action_space.shape))

    def set_policy(self, weights: dict[str, np.ndarray]) -> None:
        """`weights`: policy_weights (the agent's numpy state dict and plain attributes, the observation statistics,
        whether numpy acting matched). The sampler keeps an Agent of its own to act with, or to mirror."""
        if self.agent is None:
            with torch.random.fork_rng(devices=[]):  # the learner's random stream must not depend on where this runs
                self.agent = self.make_agent()
        self.agent.load_state_dict({key: torch.tensor(weights[key]) for key in self.agent.state_dict()})
        for name, value in weights["agent_attributes"].items():  # a flag the learner's Agent was given mid-run, say
            setattr(self.agent, name, value)
        self.policy = self.make_actor(bool(weights["fast_acting"]))
        if self.norm_obs:
            self.obs_mean = weights["obs_mean"]
            self.obs_std = gae.running_std(weights["obs_var"])

    def normalize(self, raw: np.ndarray, out: np.ndarray | None = None, fill: float = np.nan) -> np.ndarray:
        return gae.normalize_obs(raw, self.obs_mean, self.obs_std, self.obs_clip, out, fill)

    def env_action(self, action: np.ndarray) -> np.ndarray:
        """The action as the envs take it: clipped into the Box's bounds. The rollout stores the unclipped action,
        whose log-probability is the policy's."""
        return np.minimum(np.maximum(action, self.action_space.low), self.action_space.high)

    def warm_up(self, steps: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Moments of the observations met in `steps` random-action steps per env; then every env starts afresh."""
        seen = [self.raw_obs]
        space = self.action_space
        space.seed(self.seed + 1)
        for _ in range(steps):
            seen.append(step_envs(self.envs, [space.sample() for _ in self.envs])[0])
        self.raw_obs = np.stack([env.reset(seed=self.seed + i)[0] for i, env in enumerate(self.envs)])
        return gae.finite_moments(np.concatenate(seen))

    def rollout(self, num_steps: int) -> dict[str, np.ndarray]:
        """One rollout with the latest policy. A numpy actor is audited on the observations and noise it acted with
        (audit_acting): where it acted otherwise than TorchActor, the rollout is discarded (its steps and episodes
        count) and sampled again acting with torch: PPO's ratio must be anchored to the policy that acted."""
        rollout = self.sample(num_steps)
        if rollout["acting_problem"]:
            rollout = sample_again(self, rollout, num_steps)
        return rollout

    def sample(self, num_steps: int) -> dict[str, np.ndarray]:
        """One rollout, unaudited. The loop does only what the next env step needs, the rest is done on whole arrays
        after it (finish_sample): work right after an env's step costs several times more CPU (cold caches)."""
        num_envs, obs_dim = self.raw_obs.shape
        obs = np.zeros((num_steps, num_envs, obs_dim), np.float32)
        raw_obs = np.zeros((num_steps + 1, num_envs, obs_dim))
        raw_obs[0] = self.raw_obs  # the envs write each step's successor into the next row
        actions = np.zeros((num_steps, num_envs, *self.action_space.shape), np.float32)
        rewards = np.zeros((num_steps, num_envs))
        terminations = np.zeros((num_steps, num_envs), bool)
        truncations = np.zeros((num_steps, num_envs), bool)
        noise = self.draw_noise((num_steps, num_envs))
        finals = []  # (step, env, last observation) of each episode a time limit cut
        for step in range(num_steps):
            # A non-finite observation is acted on as zeros; after the loop its stored row becomes NaN (the guard)
            acting_obs = self.normalize(raw_obs[step], out=obs[step], fill=0.0)
            action = self.policy.act(acting_obs, noise[step])
            actions[step] = action
            rows = (raw_obs[step + 1], rewards[step], terminations[step], truncations[step])
            *_, final = step_envs(self.envs, self.env_action(action), rows)
            for i, last_obs in final.items():
                if truncations[step, i] and not terminations[step, i]:
                    finals.append((step, i, last_obs))
        return self.finish_sample(obs, raw_obs, actions, rewards, terminations, truncations, noise, finals)

    def finish_sample(self, obs, raw_obs, actions, rewards, terminations, truncations, noise, finals) -> dict:
        """The rollout's arrays as the loop left them (`finals`: each truncated episode's step, env and last
        observation), and on whole arrays what follows: log-probabilities, the acting audit, NaN rows for the guard,
        finished episodes, discounted returns, the observations' moments."""
        num_steps, obs_dim = len(obs), obs.shape[-1]
        logprobs = self.policy.log_prob(obs, actions, noise).astype(np.float32)
        audit, problem = np.nan, None
        if isinstance(self.policy, NumpyActor):  # audited on the observations as acted (before NaN rows are marked)
            audit, problem = audit_acting(self.policy, self.make_actor(False), obs, noise, actions, logprobs)
        obs[~np.isfinite(raw_obs[:num_steps]).all(axis=-1)] = np.nan
        ended = terminations | truncations
        episode_returns, episode_lengths = gae.finished_episodes(
            rewards, ended, self.episode_returns, self.episode_lengths
        )
        self.raw_obs = raw_obs[num_steps].copy()
        obs_mean, obs_var, obs_count = gae.finite_moments(raw_obs[:num_steps].reshape(-1, obs_dim))
        return {
            "obs": obs,
            "actions": actions,
            "logprobs": logprobs,
            "rewards": rewards,
            "discounted_returns": self.returns.run(rewards, ended),
            "terminations": terminations,
            "truncations": truncations,
            "final_obs": np.array([self.normalize(last) for *_, last in finals], np.float32).reshape(-1, obs_dim),
            "final_index": np.array([index for *index, _ in finals], np.int64).reshape(-1, 2),
            "next_obs": self.normalize(self.raw_obs),
            "obs_mean": obs_mean,
            "obs_var": obs_var,
            "obs_count": np.array(obs_count),
            "env_steps": rewards.size,
            "episode_returns": np.array(episode_returns),
            "episode_lengths": np.array(episode_lengths),
            "acting_audit": np.array(audit),
            "acting_problem": np.array(problem or ""),
        }

    def anchor(self, batch: dict, agent: Agent) -> dict:
        """The batch with the policy PPO's ratio is anchored to: the one that acted, here always the learner's latest
        (dppo_ray.py's actors may act with an older one and, decoupled, anchor to the learner's)."""
        return batch

    def scalars(self) -> dict[str, float]:
        """What TensorBoard records of the sampler with each update: nothing here (dppo_ray.py's actors record their
        staleness, restarts and timings); and in summary.json, nothing either (`summary`)."""
        return {}

    summary = scalars

    def close(self) -> None:
        for env in self.envs:
            env.close()


# ---------------------------------------------------------------------------------------------------------------------
# Learner: the agent, its optimizer and the statistics; advantages with the per-sample guard
# ---------------------------------------------------------------------------------------------------------------------
@dataclass
class Learner:
    """What a run trains and saves: the agent, its optimizer, the running statistics of the observations and of the
    discounted return, and which way acting and the gradient run (start_fast_paths)."""

    agent: Agent
    optimizer: optim.Optimizer
    obs_rms: gae.RunningMeanStd
    return_rms: gae.RunningMeanStd
    fast: FastPaths = field(default_factory=FastPaths)


def make_learner(args: Args, agent: Agent, device: torch.device) -> Learner:
    agent = agent.to(device)
    # fused: one kernel steps every parameter (the for-loop default launches several ops per parameter)
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    return Learner(agent, optimizer, gae.RunningMeanStd(shape=(agent.obs_dim,)), gae.RunningMeanStd(shape=()))


def loss_settings(args: Args, ent_coef: float) -> dict:
    """gae.ppo_loss's keyword arguments for this run: the flags of the same names (and dppo_ray.py's --max-is-weight,
    the cap of its decoupled loss's weight, where the script has it)."""
    names = ["clip_coef", "clip_vloss", "vf_coef", "norm_adv", "max_is_weight"]
    return {name: getattr(args, name) for name in names if hasattr(args, name)} | {"ent_coef": ent_coef}


def start_fast_paths(learner: Learner, args: Args, numpy_acting: bool = True) -> None:
    """Which way acting and the gradient run (fast_paths.choose_paths, with this file's TorchActor and
    clipped_gradient), said in one line for each part that cannot run fast."""
    learner.fast = choose_paths(learner, args, TorchActor, clipped_gradient, numpy_acting)


def policy_weights(learner: Learner) -> dict[str, np.ndarray]:
    """What a sampler acts with: the numpy weights, the Agent's plain attributes (a flag set during the run, say), the
    observation statistics and which way to act."""
    weights = checkpoints.unwrapped(learner.agent).numpy_weights()
    weights["agent_attributes"] = checkpoints.agent_attributes(learner.agent)[0]
    weights["obs_mean"] = learner.obs_rms.mean.copy()
    weights["obs_var"] = learner.obs_rms.var.copy()
    weights["fast_acting"] = np.array(learner.fast.acting)
    return weights


def anneal(optimizer: optim.Optimizer, args: Args, iteration: int) -> float:
    """Set this iteration's learning rates (CleanRL's linear schedule, each parameter group from its own first rate);
    return its entropy coefficient."""
    frac = 1.0 - (iteration - 1.0) / args.num_iterations
    if args.anneal_lr:
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])  # the key torch's own schedulers keep it under
            group["lr"] = frac * group["initial_lr"]
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
        rewards = gae.scale_rewards(rewards, learner.return_rms, args.reward_clip)
    valid = gae.finite_samples(rollout["obs"], rollout["actions"], rollout["rewards"])
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
        advantages, returns = gae.compute_gae(
            tensor(rewards.astype(np.float32)),
            values,
            next_values,
            tensor(rollout["terminations"]),
            tensor(rollout["truncations"]),
            args.gamma,
            args.gae_lambda,
            valid=tensor(valid),
        )
    outliers = gae.advantage_outliers(advantages.cpu().numpy(), returns.cpu().numpy(), valid, args.guard_max_abs)
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
# The update: the PPO epochs, as CleanRL writes them
# ---------------------------------------------------------------------------------------------------------------------
def minibatch_loss(agent: Agent, minibatch: dict, loss_kwargs: dict) -> gae.PPOLoss:
    """gae.ppo_loss of one minibatch through Agent.evaluate: what every gradient step minimizes."""
    new_logprob, entropy, new_value = agent.evaluate(minibatch["obs"], minibatch["actions"])
    return gae.ppo_loss(
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


def clip_gradients(grads: list[torch.Tensor], max_norm: float) -> tuple[list[torch.Tensor], torch.Tensor]:
    """nn.utils.clip_grad_norm_'s clip in tensor ops only (so that it compiles into the gradient's graph): the
    gradients scaled so that their global norm is at most max_norm, and the norm before clipping (a NaN norm reaches
    the caller's guard)."""
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    scale = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    return [g * scale for g in grads], norm


def clipped_gradient(agent: Agent, params: list[torch.Tensor], minibatch: dict, loss_kwargs: dict, max_grad_norm):
    """The one gradient function: autograd's gradient of the minibatch's loss with respect to `params` (the trained
    tensors), clipped by its global norm; None for a tensor the loss does not reach, as loss.backward() leaves its
    .grad, so that the optimizer leaves it alone. Run eagerly or compiled (fast_paths.update_gradient picks); returns
    the gradients, the loss's statistics and the norm before clipping."""
    stats = minibatch_loss(agent, minibatch, loss_kwargs)
    grads = torch.autograd.grad(stats.loss, params, allow_unused=True)
    clipped, norm = clip_gradients([g for g in grads if g is not None], max_grad_norm)
    reached = iter(clipped)
    grads = [None if g is None else next(reached) for g in grads]
    return grads, {key: value.detach() for key, value in stats._asdict().items() if torch.is_tensor(value)}, norm


def epoch_minibatches(batch: dict, args: Args) -> list[dict]:
    """One epoch's minibatches: the samples the guard kept, shuffled (torch's generator), cut into --num-minibatches
    slices (CleanRL's minibatches, one gather); none empty."""
    columns = [key for key, value in batch.items() if isinstance(value, torch.Tensor)]
    b_inds = torch.randperm(len(batch["advantages"]), device=batch["advantages"].device)
    slices = {key: torch.tensor_split(batch[key][b_inds], args.num_minibatches) for key in columns}
    minibatches = [{key: parts[i] for key, parts in slices.items()} for i in range(args.num_minibatches)]
    return [minibatch for minibatch in minibatches if len(minibatch["advantages"])]  # more minibatches than samples


def update_scalars(stats: gae.PPOLoss, ratios: list[torch.Tensor], batch: dict, args: Args) -> dict:
    """The update's statistics, as CleanRL logs them: the last minibatch's losses, the clip fraction of all."""
    values, returns = batch["values"].cpu().numpy(), batch["returns"].cpu().numpy()
    return {
        "losses/value_loss": stats.value_loss.item(),
        "losses/policy_loss": stats.policy_loss.item(),
        "losses/entropy": stats.entropy.item(),
        "losses/old_approx_kl": stats.old_approx_kl.item(),
        "losses/approx_kl": stats.approx_kl.item(),
        "losses/clipfrac": gae.mean_clipfrac(ratios, args.clip_coef),
        "losses/explained_variance": gae.explained_variance(values, returns),
    }


def ppo_update(learner: Learner, batch: dict, args: Args, loss_kwargs: dict, iteration: int) -> tuple[dict, str | None]:
    """--update-epochs passes over shuffled minibatches of the samples the guard kept: the gradient of each
    (autograd's, compiled or eager) clipped by its global norm, then the optimizer's own step. Returns the
    statistics of the last minibatch (as CleanRL logs them) and a problem string when the loss or a gradient went
    non-finite."""
    problem = gae.too_few_samples(len(batch["advantages"]), batch["size"])
    if problem:
        return {}, problem
    gradient = update_gradient(learner, clipped_gradient, iteration)
    ratios = []
    for epoch in range(args.update_epochs):
        for minibatch in epoch_minibatches(batch, args):
            stats, grad_norm = gradient(learner, minibatch, loss_kwargs, args.max_grad_norm)
            problem = gae.bad_step(stats.loss.item(), grad_norm.item(), args.guard_max_abs, epoch)
            if problem:
                return {}, problem
            learner.optimizer.step()
            ratios.append(stats.ratio.detach())
        if args.target_kl is not None and stats.approx_kl > args.target_kl:
            break
    return update_scalars(stats, ratios, batch, args), None


def load_policy(path: str) -> checkpoints.Policy:
    """A model or checkpoint of either script, acting with this file's Agent (checkpoints.Policy: predict(obs))."""
    return checkpoints.load_policy(path, sys.modules[__name__])


# ---------------------------------------------------------------------------------------------------------------------
# Training: the algorithm box
# ---------------------------------------------------------------------------------------------------------------------
def start_run(args: Args, ckpt: dict | None, device: torch.device, sampler: Sampler | None = None) -> Run:
    """A run's envs, learner (fresh or from its checkpoint), fast paths, run folder and TensorBoard writer.
    `sampler`: what steps the envs, this process's Sampler unless given (dppo_ray.py gives its rollout actors)."""
    run_dir = run_management.run_folder(args)
    if sampler is None:  # a resumed run's envs are seeded anew, moved on by its steps: they meet new episodes
        seed = args.seed + (int(ckpt["global_step"]) if ckpt else 0)
        sampler = Sampler(args.env_id, args.num_envs, seed, args, os.path.join(run_dir, "videos"))
    learner = make_learner(args, sampler.make_agent(), device)
    learner.agent.obs_layout = sampler.obs_layout
    box = isinstance(sampler.action_space, gym.spaces.Box)  # else dppo_ray.py's Discrete actions
    learner.agent.action_bounds = [sampler.action_space.low, sampler.action_space.high] if box else None
    state = RunState()
    if ckpt is not None:
        state = restore_training(ckpt, learner, args.resume)
        sampler.rng_state = ckpt.get("sampler_rng")
    start_fast_paths(learner, args, numpy_acting=box)  # the numpy mirror computes a Gaussian
    writer = run_management.tensorboard_writer(args, run_dir, state.global_step if args.resume else None)
    monitor = Monitor(args, writer, state, sampler.spaces[1], learner.fast)
    return Run(args, run_dir, sampler, learner, state, monitor)


def warm_up(run: Run, loop: TrainingLoop) -> None:
    """A new run's observation statistics: the moments of --obs-warmup-steps random-action steps per env."""
    if run.args.norm_obs and run.args.obs_warmup_steps:
        with loop.watch(run.sampler.rollout_timeout):
            run.learner.obs_rms.update_from_moments(*run.sampler.warm_up(run.args.obs_warmup_steps))


def save_checkpoint(run: Run) -> None:
    checkpoint = training_checkpoint(run.learner, run.args, run.state, run.monitor.wall_time())
    checkpoint["sampler_rng"] = run.sampler.rng_state
    save_atomic(checkpoint, os.path.join(run.run_dir, "checkpoint.pt"))


def sample_rollout(sampler: Sampler, num_steps: int, loop: TrainingLoop) -> dict:
    """The sampler's rollout, within --rollout-timeout (loop.watch). An env (or edited rollout code) that raises ends
    the run between two updates: a checkpoint, and one line naming the exception and where it was raised (StopRun)."""
    try:
        with loop.watch(sampler.rollout_timeout):
            return sampler.rollout(num_steps)
    except (UsageError, NotImplementedError, StopRun, Interrupted):  # said in words of their own (cli, TrainingLoop)
        raise
    except Exception as e:  # noqa: BLE001 (said in one line; the run stops)
        where = traceback.extract_tb(e.__traceback__)[-1]
        raise StopRun(f"the rollout failed: {failure(e)} ({os.path.basename(where.filename)}:{where.lineno})") from e


def rollout_batch(run: Run, rollout: dict) -> dict:
    """Count a rollout's steps, log its episodes, merge its statistics and return its batch."""
    learner, state, writer = run.learner, run.state, run.monitor.writer
    state.global_step += int(rollout["env_steps"])
    learner.fast.read_acting_audits([rollout], state.iteration + 1, state.counters)
    for episodic_return, episodic_length in zip(rollout["episode_returns"], rollout["episode_lengths"]):
        writer.add_scalar("charts/episodic_return", episodic_return, state.global_step)
        writer.add_scalar("charts/episodic_length", episodic_length, state.global_step)
        state.recent_returns.append(float(episodic_return))
    update_statistics(rollout, learner, run.args)
    return run.sampler.anchor(prepare_batch(learner, rollout, run.args), learner.agent)


def log_update(run: Run, batch: dict, stats: dict, problem: str | None, ent_coef: float) -> None:
    """After an update: the guard (which raises BadBatchError after --guard-patience bad batches), the scalars, the
    health warnings and the periodic checkpoint."""
    run.state.iteration += 1
    if run.monitor.guard(batch, problem):  # counts what the guard dropped; stops after --guard-patience bad batches
        stats["charts/learning_rate"] = run.learner.optimizer.param_groups[0]["lr"]
        stats["charts/ent_coef"] = ent_coef
        stats["charts/SPS"] = run.monitor.steps_per_second()
        for tag, value in (stats | run.learner.fast.scalars() | run.sampler.scalars()).items():
            run.monitor.writer.add_scalar(tag, value, run.state.global_step)
        run.monitor.diagnose(stats)  # health warnings, progress bar
        if run.args.checkpoint_every and run.state.iteration % run.args.checkpoint_every == 0:
            save_checkpoint(run)


def training_loop(run: Run, loop: TrainingLoop) -> None:
    """Iterations until --total-timesteps, or until a signal (`loop.signum`) ends the one under way."""
    args = run.args
    while run.state.iteration < args.num_iterations and loop.signum is None:
        iteration = run.state.iteration + 1
        ent_coef = anneal(run.learner.optimizer, args, iteration)
        run.sampler.set_policy(policy_weights(run.learner))
        batch = rollout_batch(run, sample_rollout(run.sampler, args.num_steps, loop))
        stats, problem = ppo_update(run.learner, batch, args, loss_settings(args, ent_coef), iteration)
        log_update(run, batch, stats, problem, ent_coef)


def train(args: Args) -> int:
    if args.num_seeds > 1 or args.grid or args.ray_address:  # the launcher at the top of this file takes these
        raise UsageError("--num-seeds, --grid and --ray-address launch a process per run: run this file as a script")
    ckpt = resume_checkpoint(args)
    run = start_run(args, ckpt, run_management.seed_everything(args))
    run_management.say_rounded_timesteps(args)
    with TrainingLoop(run, save_checkpoint) as loop:
        if ckpt is None:
            warm_up(run, loop)
        training_loop(run, loop)
    eval_failed = finish_run(loop)
    if loop.error:  # what stopped the run (StopRun), as its last line
        print(f"{PROG}: error: {loop.error}", file=sys.stderr)
    return loop.exit_status() or eval_failed


if __name__ == "__main__":
    sys.exit(cli(Args, validate_args, train, sys.modules[__name__]))
