"""PPO for continuous (Box) action spaces, in one file.

    python ppo_continuous.py --env-id HalfCheetah-v5 --total-timesteps 1000000

Flags and TensorBoard tags follow CleanRL's ppo_continuous_action.py, so a CleanRL command line pastes as is and the
curves overlay. Differences that matter: time-limit truncations bootstrap from V(final observation), normalization
statistics are saved with the policy and frozen at evaluation, and runs can be checkpointed, interrupted and resumed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import sys
import time
import warnings
from collections import deque
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import tyro
from torch import nn
from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams
from tqdm import tqdm

from gae import RewardScaler, RunningMeanStd, compute_gae, explained_variance, ppo_loss

PROG = os.path.basename(__file__)


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
    """whether to capture videos of the agent (saved under runs/<run-name>/videos; needs moviepy)"""
    save_model: bool = False
    """whether to save the final policy (with its normalization statistics) to runs/<run-name>/<exp-name>.model"""

    # Algorithm-specific arguments (CleanRL's names and defaults)
    env_id: str = "HalfCheetah-v5"
    """the id of the environment; `module:EnvId-v0` imports `module` first"""
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
    norm_reward: bool = True
    """scale rewards by the running std of the discounted return (then clip to +-reward-clip)"""
    reward_clip: float = 10.0
    """clip of the scaled rewards"""
    checkpoint_every: int = 25
    """save runs/<run-name>/checkpoint.pt every this many iterations (0: only at the end and on Ctrl-C)"""
    resume: str | None = None
    """path of a checkpoint.pt to continue from: the step count, optimizer, statistics and curves carry on"""
    eval_checkpoint: str | None = None
    """path of a checkpoint or saved model: evaluate it with the mean action for --eval-episodes, without training"""
    eval_episodes: int = 10
    """the number of episodes for --eval-checkpoint and for the evaluation after --save-model"""
    quiet: bool = False
    """no progress bar (warnings and errors are still printed)"""
    torch_threads: int = 1
    """torch CPU threads; one is fastest for 64-unit MLPs"""
    guard_max_abs: float = 1e6
    """numerical guard: a batch whose advantages, returns or loss are NaN, inf or above this magnitude is skipped"""
    guard_patience: int = 3
    """numerical guard: stop the run after this many bad batches in a row"""

    # to be filled in runtime
    batch_size: int = 0
    """the batch size (computed in runtime)"""
    minibatch_size: int = 0
    """the mini-batch size (computed in runtime)"""
    num_iterations: int = 0
    """the number of iterations (computed in runtime)"""


class UsageError(Exception):
    """Bad input: reported as one line on stderr with exit status 2."""


class BadBatchError(Exception):
    """Raised by the numerical guard when the run must stop."""


def validate_args(args: Args) -> None:
    positive = ["total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs", "eval_episodes"]
    for name in positive:
        if getattr(args, name) <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    for name in ["learning_rate", "clip_coef", "obs_clip", "reward_clip", "guard_max_abs"]:
        if not getattr(args, name) > 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if not 0 < args.gamma <= 1 or not 0 <= args.gae_lambda <= 1:
        raise UsageError(f"--gamma must be in (0, 1] and --gae-lambda in [0, 1], got {args.gamma}, {args.gae_lambda}")
    if args.target_kl is not None and not args.target_kl > 0:
        raise UsageError(f"--target-kl must be positive (or None), got {args.target_kl}")
    if args.checkpoint_every < 0 or args.guard_patience <= 0 or args.torch_threads <= 0:
        raise UsageError("--checkpoint-every must be >= 0, --guard-patience and --torch-threads positive")
    if args.resume and args.eval_checkpoint:
        raise UsageError("--resume and --eval-checkpoint do not fit together: evaluate or train, not both")
    args.batch_size = args.num_envs * args.num_steps
    if args.batch_size % args.num_minibatches != 0:
        raise UsageError(
            f"--num-minibatches {args.num_minibatches} does not divide the batch "
            f"(--num-envs {args.num_envs} x --num-steps {args.num_steps} = {args.batch_size})"
        )
    args.minibatch_size = args.batch_size // args.num_minibatches
    args.num_iterations = args.total_timesteps // args.batch_size
    if args.num_iterations == 0 and not args.eval_checkpoint:
        raise UsageError(f"--total-timesteps {args.total_timesteps} is less than one batch ({args.batch_size} steps)")


# ---------------------------------------------------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------------------------------------------------
def quiet_mujoco_log(log_dir: str | None) -> None:
    """MuJoCo 4 writes MUJOCO_LOG.TXT into the working directory; send it to the run folder (or nowhere)."""
    try:
        import mujoco
    except ImportError:
        return
    config = mujoco.MjLogConfig.get()
    config.logto_file = log_dir is not None
    if log_dir is not None:
        config.logfile = os.path.join(log_dir, "MUJOCO_LOG.TXT")
    config.set()


def make_env(env_id: str, idx: int, capture_video: bool, video_dir: str) -> gym.Env:
    try:
        if capture_video and idx == 0:
            return gym.wrappers.RecordVideo(gym.make(env_id, render_mode="rgb_array"), video_dir)
        return gym.make(env_id)
    except (gym.error.Error, ModuleNotFoundError, ImportError) as e:
        raise UsageError(f"cannot make env '{env_id}': {str(e).splitlines()[0]}") from None


def make_envs(args: Args, video_dir: str) -> list[gym.Env]:
    """Plain gymnasium envs, stepped in order by `step_envs`. Observation normalization, reward scaling and action
    clipping happen in the training loop rather than in wrappers, so their statistics are data saved with the policy."""
    envs = [make_env(args.env_id, i, args.capture_video, video_dir) for i in range(args.num_envs)]
    check_spaces(args.env_id, envs[0].observation_space, envs[0].action_space)
    return envs


def step_envs(envs: list[gym.Env], actions: np.ndarray):
    """Step every env; an env whose episode ended is reset in the same call.

    This is gymnasium's SAME_STEP autoreset written out: the returned observation of a finished env is the first one
    of its next episode, and `final_obs` maps its index to the last observation of the episode that ended, which the
    truncation bootstrap needs. (gymnasium's vector envs default to NEXT_STEP, where the step after an episode end
    is a fake transition that must not be trained on; stepping a list directly also skips about 80 us of vector-env
    bookkeeping per step.)"""
    observations, rewards = [], np.zeros(len(envs))
    terminations, truncations = np.zeros(len(envs), dtype=bool), np.zeros(len(envs), dtype=bool)
    final_obs: dict[int, np.ndarray] = {}
    for i, (env, action) in enumerate(zip(envs, actions)):
        obs, rewards[i], terminations[i], truncations[i], _ = env.step(action)
        if terminations[i] or truncations[i]:
            final_obs[i] = obs
            obs, _ = env.reset()
        observations.append(obs)
    return np.stack(observations), rewards, terminations, truncations, final_obs


def close_envs(envs: list[gym.Env]) -> None:
    for env in envs:
        env.close()


def check_spaces(env_id: str, observation_space: gym.Space, action_space: gym.Space) -> None:
    if not isinstance(action_space, gym.spaces.Box):
        raise UsageError(
            f"{env_id} has a {action_space} action space; ppo_continuous.py needs a continuous (Box) one "
            "(dppo_ray.py also takes Discrete)"
        )
    if not isinstance(observation_space, gym.spaces.Box) or len(observation_space.shape) != 1:
        raise UsageError(f"{env_id} has observation space {observation_space}; a flat Box is needed")


# ---------------------------------------------------------------------------------------------------------------------
# Agent: separate 64-64 tanh actor and critic, Gaussian policy with a state-independent log-std
# ---------------------------------------------------------------------------------------------------------------------
LOG_SQRT_2PI = 0.5 * np.log(2.0 * np.pi)


def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, obs_dim: int, act_dim: int):
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor_mean = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, act_dim), std=0.01),
        )
        self.actor_logstd = nn.Parameter(torch.zeros(1, act_dim))

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x).squeeze(-1)

    def evaluate(self, x: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probability of `action`, policy entropy and value, written out for the diagonal Gaussian
        (torch.distributions.Normal computes the same, with more overhead per minibatch)."""
        mean = self.actor_mean(x)
        logstd = self.actor_logstd.expand_as(mean)
        logprob = (-0.5 * ((action - mean) / logstd.exp()) ** 2 - logstd - LOG_SQRT_2PI).sum(-1)
        entropy = (0.5 + LOG_SQRT_2PI + logstd).sum(-1)
        return logprob, entropy, self.get_value(x)

    def numpy_actor(self):
        """A numpy copy of the mean network for the rollout. Stepping one env at a time, a 64-64 MLP in numpy takes
        about 15 us against about 150 us for the same forward pass in torch, where per-op overhead dominates.
        The copy is taken once per rollout, while the weights are fixed."""
        layers = [m for m in self.actor_mean if isinstance(m, nn.Linear)]
        weights = [(m.weight.detach().cpu().numpy().T.copy(), m.bias.detach().cpu().numpy().copy()) for m in layers]
        std = np.exp(self.actor_logstd.detach().cpu().numpy().reshape(-1).astype(np.float64))

        def mean_action(obs: np.ndarray) -> np.ndarray:
            h = obs
            for i, (w, b) in enumerate(weights):
                h = h @ w + b
                if i < len(weights) - 1:
                    h = np.tanh(h)
            return h

        return mean_action, std


# ---------------------------------------------------------------------------------------------------------------------
# Checkpoints: tensors and plain Python values only, loaded with weights_only=True so that a shared file cannot run code
# ---------------------------------------------------------------------------------------------------------------------
def save_atomic(obj: dict, path: str) -> None:
    tmp = f"{path}.tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str) -> dict:
    if not os.path.isfile(path):
        raise UsageError(f"checkpoint not found: {path}")
    try:
        with warnings.catch_warnings():  # torch warns about the pickle protocol before refusing a foreign pickle
            warnings.simplefilter("ignore")
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # corrupt, truncated, or a pickle that tries to run code
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(f"cannot load checkpoint {path}: not a valid checkpoint ({reason[:160]})") from None
    if not isinstance(ckpt, dict) or "agent" not in ckpt or "obs_rms" not in ckpt or "args" not in ckpt:
        raise UsageError(f"cannot load checkpoint {path}: it does not hold a {PROG} policy")
    return ckpt


def policy_state(agent: Agent, obs_rms: RunningMeanStd, args: Args) -> dict:
    return {"agent": agent.state_dict(), "obs_rms": obs_rms.state_dict(), "args": dataclasses.asdict(args)}


def restore_policy(ckpt: dict, agent: Agent, obs_rms: RunningMeanStd, path: str) -> None:
    try:
        agent.load_state_dict(ckpt["agent"])
        obs_rms.load_state_dict(ckpt["obs_rms"])
    except (RuntimeError, ValueError, KeyError) as e:
        raise UsageError(f"checkpoint {path} does not fit this env/network: {str(e).splitlines()[0][:160]}") from None


# ---------------------------------------------------------------------------------------------------------------------
# Evaluation with the mean action and frozen normalization statistics
# ---------------------------------------------------------------------------------------------------------------------
def evaluate(agent: Agent, obs_rms: RunningMeanStd, env_id: str, episodes: int, seed: int, args: Args) -> np.ndarray:
    try:
        env = gym.make(env_id)
    except (gym.error.Error, ModuleNotFoundError, ImportError) as e:
        raise UsageError(f"cannot make env '{env_id}': {str(e).splitlines()[0]}") from None
    check_spaces(env_id, env.observation_space, env.action_space)
    mean_action, _ = agent.numpy_actor()
    low, high = env.action_space.low, env.action_space.high
    returns = []
    obs, _ = env.reset(seed=seed)
    while len(returns) < episodes:
        done, episode_return = False, 0.0
        while not done:
            x = obs_rms.normalize(obs, args.obs_clip) if args.norm_obs else obs
            action = mean_action(x.astype(np.float32)[None])[0]
            obs, reward, terminated, truncated, _ = env.step(np.clip(action, low, high))
            episode_return += float(reward)
            done = terminated or truncated
        returns.append(episode_return)
        obs, _ = env.reset()
    env.close()
    return np.array(returns)


def run_eval_checkpoint(args: Args) -> None:
    quiet_mujoco_log(None)
    ckpt = load_checkpoint(args.eval_checkpoint)
    saved = Args(**{k: v for k, v in ckpt["args"].items() if k in {f.name for f in dataclasses.fields(Args)}})
    try:
        obs_dim = ckpt["agent"]["actor_mean.0.weight"].shape[1]
        act_dim = ckpt["agent"]["actor_logstd"].shape[1]
    except (KeyError, IndexError, AttributeError):
        raise UsageError(f"cannot load checkpoint {args.eval_checkpoint}: it does not hold a {PROG} policy") from None
    agent, obs_rms = Agent(obs_dim, act_dim), RunningMeanStd(shape=(obs_dim,))
    restore_policy(ckpt, agent, obs_rms, args.eval_checkpoint)
    returns = evaluate(agent, obs_rms, saved.env_id, args.eval_episodes, args.seed, saved)
    print(
        f"{saved.env_id}: mean return {returns.mean():.2f} ± {returns.std():.2f} over {len(returns)} episodes "
        f"(mean action, saved normalization statistics, {ckpt.get('global_step', '?')} training steps)"
    )


# ---------------------------------------------------------------------------------------------------------------------
# Health diagnostics (the PPO notes: entropy falls slowly, explained variance >= ~0.85, approx_kl around 0.01)
# ---------------------------------------------------------------------------------------------------------------------
def health_warnings(history: dict[str, list[float]], iteration: int, args: Args, act_dim: int) -> list[tuple[str, str]]:
    found = []
    entropy, kl, ev = history["entropy"], history["approx_kl"], history["explained_variance"]
    if len(entropy) > 10 and (entropy[-11] - entropy[-1]) / act_dim > 0.5:
        drop = (entropy[-11] - entropy[-1]) / act_dim
        found.append(
            (
                "entropy_collapse",
                f"entropy is collapsing ({drop:.2f} nats per action dim in 10 iterations): "
                "raise --ent-coef (e.g. 0.005) or lower --update-epochs / --learning-rate",
            )
        )
    if len(kl) >= 5 and min(kl[-5:]) > 0.02:
        found.append(
            (
                "high_kl",
                f"approx_kl has stayed above 0.02 for 5 iterations (now {kl[-1]:.3f}): "
                "lower --learning-rate or set --target-kl 0.02",
            )
        )
    warmed_up = iteration > max(5, args.num_iterations // 10)
    if warmed_up and ev and ev[-1] < 0:
        found.append(
            (
                "low_explained_variance",
                f"explained_variance is {ev[-1]:.2f} < 0 after warm-up, the critic is worse than a constant: "
                "check the reward scale (--norm-reward) or raise --vf-coef",
            )
        )
    return found


# ---------------------------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------------------------
def train(args: Args) -> int:
    ckpt = load_checkpoint(args.resume) if args.resume else None
    if ckpt is not None:
        saved_env = ckpt["args"].get("env_id")
        if saved_env != args.env_id:
            raise UsageError(f"--resume {args.resume} was trained on {saved_env}, not --env-id {args.env_id}")
        if "optimizer" not in ckpt:
            raise UsageError(f"--resume {args.resume} is a saved model, not a training checkpoint.pt")
        args.run_name = args.run_name or ckpt["run_name"]
    run_name = args.run_name or f"{args.env_id.replace(':', '_')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    args.run_name = run_name
    run_dir = os.path.join("runs", run_name)
    checkpoint_path = os.path.join(run_dir, "checkpoint.pt")

    # Seeding
    random.seed(args.seed)
    np.random.seed(args.seed)  # noqa: NPY002 (seeds third-party code; our own sampling uses action_rng)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_num_threads(args.torch_threads)
    action_rng = np.random.default_rng(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    quiet_mujoco_log(None)
    envs = make_envs(args, os.path.join(run_dir, "videos"))  # before the run folder: a bad env id leaves nothing
    os.makedirs(run_dir, exist_ok=True)
    quiet_mujoco_log(run_dir)
    obs_dim, act_dim = envs[0].observation_space.shape[0], envs[0].action_space.shape[0]
    action_low, action_high = envs[0].action_space.low, envs[0].action_space.high

    agent = Agent(obs_dim, act_dim).to(device)
    # fused: one kernel updates all parameters, instead of a Python loop over them (the CPU default).
    parameters = list(agent.parameters())  # built once; the optimizer and the gradient clip reuse it every minibatch
    optimizer = torch.optim.Adam(parameters, lr=args.learning_rate, eps=1e-5, fused=True)
    obs_rms = RunningMeanStd(shape=(obs_dim,))
    reward_scaler = RewardScaler(args.num_envs, args.gamma, clip=args.reward_clip)
    global_step, start_iteration, wall_time_before = 0, 1, 0.0
    health_counts: dict[str, int] = {}
    if ckpt is not None:
        restore_policy(ckpt, agent, obs_rms, args.resume)
        optimizer.load_state_dict(ckpt["optimizer"])
        reward_scaler.return_rms.load_state_dict(ckpt["return_rms"])
        global_step, start_iteration = int(ckpt["global_step"]), int(ckpt["iteration"]) + 1
        wall_time_before = float(ckpt["wall_time"])
        health_counts = dict(ckpt["health_counts"])
        action_rng.bit_generator.state = ckpt["action_rng"]
        torch.set_rng_state(ckpt["torch_rng"])

    if args.track:
        try:
            import wandb
        except ImportError:
            raise UsageError("--track needs Weights and Biases: pip install wandb") from None
        wandb.init(
            project=args.wandb_project_name,
            entity=args.wandb_entity,
            sync_tensorboard=True,
            config=vars(args),
            name=run_name,
            save_code=True,
        )
    # purge_step drops any points a crashed run wrote after the checkpoint, so a resumed curve continues cleanly.
    writer = SummaryWriter(run_dir, purge_step=global_step + 1 if ckpt is not None else None)
    if ckpt is None:
        writer.add_text(
            "hyperparameters",
            "|param|value|\n|-|-|\n" + "\n".join([f"|{key}|{value}|" for key, value in vars(args).items()]),
        )
        hparam_values = {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in vars(args).items()}
        for summary in hparams(hparam_values, {"charts/episodic_return": 0.0, "losses/explained_variance": 0.0}):
            writer.file_writer.add_summary(summary)

    def save_checkpoint(iteration: int) -> None:
        state = policy_state(agent, obs_rms, args)
        state.update(
            optimizer=optimizer.state_dict(),
            return_rms=reward_scaler.return_rms.state_dict(),
            global_step=global_step,
            iteration=iteration,
            run_name=run_name,
            wall_time=wall_time_before + time.time() - start_time,
            health_counts=health_counts,
            action_rng=action_rng.bit_generator.state,
            torch_rng=torch.get_rng_state(),
        )
        save_atomic(state, checkpoint_path)

    # Ctrl-C: finish the current iteration, save a checkpoint, exit. A second Ctrl-C quits at once.
    interrupted = False

    def on_sigint(signum, frame):
        nonlocal interrupted
        interrupted = True
        signal.signal(signal.SIGINT, signal.default_int_handler)
        tqdm.write(
            f"{PROG}: Ctrl-C: saving a checkpoint after this iteration (press again to quit now)", file=sys.stderr
        )

    signal.signal(signal.SIGINT, on_sigint)

    # Rollout storage (raw observations and rewards; normalized once per rollout), filled in place each iteration
    raw_obs_buf = np.zeros((args.num_steps, args.num_envs, obs_dim))
    actions_buf = np.zeros((args.num_steps, args.num_envs, act_dim), dtype=np.float32)
    raw_rewards_buf = np.zeros((args.num_steps, args.num_envs))
    terminations_buf = np.zeros((args.num_steps, args.num_envs), dtype=bool)
    truncations_buf = np.zeros((args.num_steps, args.num_envs), dtype=bool)

    def normalize_obs(raw: np.ndarray) -> np.ndarray:
        return (obs_rms.normalize(raw, args.obs_clip) if args.norm_obs else raw).astype(np.float32)

    start_time = time.time()
    start_step = global_step
    raw_obs = np.stack([env.reset(seed=args.seed + global_step + i)[0] for i, env in enumerate(envs)])
    episode_returns, episode_lengths = np.zeros(args.num_envs), np.zeros(args.num_envs, dtype=np.int64)
    recent_returns: deque[float] = deque(maxlen=100)
    history: dict[str, list[float]] = {"entropy": [], "approx_kl": [], "explained_variance": []}
    last_warned: dict[str, int] = {}
    bad_batches_in_a_row = 0
    status, last_stats, hard_interrupt = "completed", {}, False
    iteration = start_iteration - 1

    progress = tqdm(
        total=args.num_iterations * args.batch_size,
        initial=min(global_step, args.num_iterations * args.batch_size),
        disable=args.quiet,
        unit="step",
        unit_scale=True,
        dynamic_ncols=True,
        mininterval=1.0,
    )
    try:
        for iteration in range(start_iteration, args.num_iterations + 1):
            frac = 1.0 - (iteration - 1.0) / args.num_iterations
            if args.anneal_lr:
                optimizer.param_groups[0]["lr"] = frac * args.learning_rate
            ent_coef = args.ent_coef
            if args.ent_coef_final is not None:
                ent_coef = args.ent_coef_final + frac * (args.ent_coef - args.ent_coef_final)

            # ---- Rollout: act with a numpy copy of the current policy and the current normalization statistics,
            # which both stay fixed until the rollout ends. Actions are stored unclipped, and clipped for the env.
            mean_action, action_std = agent.numpy_actor()
            truncated_final_obs: list[tuple[int, int, np.ndarray]] = []
            for step in range(args.num_steps):
                global_step += args.num_envs
                raw_obs_buf[step] = raw_obs
                noise = action_rng.standard_normal((args.num_envs, act_dim))
                action = mean_action(normalize_obs(raw_obs)) + action_std * noise
                actions_buf[step] = action
                raw_obs, reward, terminated, truncated, final_obs = step_envs(
                    envs, np.clip(action, action_low, action_high)
                )
                raw_rewards_buf[step], terminations_buf[step], truncations_buf[step] = reward, terminated, truncated
                episode_returns += reward
                episode_lengths += 1
                for i, final in final_obs.items():
                    if truncated[i] and not terminated[i]:
                        truncated_final_obs.append((step, i, final))
                    writer.add_scalar("charts/episodic_return", episode_returns[i], global_step)
                    writer.add_scalar("charts/episodic_length", episode_lengths[i], global_step)
                    recent_returns.append(float(episode_returns[i]))
                    episode_returns[i], episode_lengths[i] = 0.0, 0

            # ---- Normalize the batch with the statistics the policy acted on, then let the statistics learn from it
            obs_buf = normalize_obs(raw_obs_buf)
            next_obs = normalize_obs(raw_obs)
            if truncated_final_obs:
                steps_idx, envs_idx, finals = zip(*truncated_final_obs)
                final_obs_buf = normalize_obs(np.stack(finals))
            if args.norm_obs:
                obs_rms.update(raw_obs_buf.reshape(-1, obs_dim))
            rewards_np = raw_rewards_buf
            if args.norm_reward:
                rewards_np = reward_scaler(raw_rewards_buf, terminations_buf | truncations_buf)

            # ---- Evaluate the batch once with the policy that collected it: values, log-probs, bootstraps ----
            with torch.no_grad():
                b_obs = torch.from_numpy(obs_buf.reshape(-1, obs_dim)).to(device)
                b_actions = torch.from_numpy(actions_buf.reshape(-1, act_dim)).to(device)
                b_logprobs, _, b_values = agent.evaluate(b_obs, b_actions)
                values = b_values.view(args.num_steps, args.num_envs)
                # next_values[t] = V(successor of step t): the next stored obs, the obs after the rollout for the
                # last step, and V(final obs) where a time limit cut the episode (a reset obs is not a successor).
                next_values = torch.cat([values[1:], agent.get_value(torch.from_numpy(next_obs).to(device))[None]])
                if truncated_final_obs:
                    final_values = agent.get_value(torch.from_numpy(final_obs_buf).to(device))
                    next_values[list(steps_idx), list(envs_idx)] = final_values
                rewards = torch.from_numpy(rewards_np.astype(np.float32)).to(device)
                advantages, returns = compute_gae(
                    rewards,
                    values,
                    next_values,
                    torch.from_numpy(terminations_buf).to(device),
                    torch.from_numpy(truncations_buf).to(device),
                    args.gamma,
                    args.gae_lambda,
                )
            b_advantages, b_returns = advantages.reshape(-1), returns.reshape(-1)

            # ---- Numerical guard: never train on NaN/inf or absurd magnitudes ----
            problem = None
            for name, tensor in (("observations", b_obs), ("rewards", rewards), ("advantages", b_advantages)):
                if not torch.isfinite(tensor).all():
                    problem = f"non-finite {name}"
                    break
            if problem is None and max(b_advantages.abs().max(), b_returns.abs().max()) > args.guard_max_abs:
                problem = f"advantages or returns above --guard-max-abs {args.guard_max_abs:g}"

            # ---- PPO update: update_epochs passes over shuffled minibatches ----
            clipfracs = []
            stats = None
            if problem is None:
                for epoch in range(args.update_epochs):
                    permutation = torch.randperm(args.batch_size, device=device)
                    for start in range(0, args.batch_size, args.minibatch_size):
                        mb = permutation[start : start + args.minibatch_size]
                        new_logprob, entropy, new_value = agent.evaluate(b_obs[mb], b_actions[mb])
                        stats = ppo_loss(
                            new_logprob,
                            b_logprobs[mb],
                            b_advantages[mb],
                            new_value,
                            b_values[mb],
                            b_returns[mb],
                            entropy,
                            clip_coef=args.clip_coef,
                            clip_vloss=args.clip_vloss,
                            ent_coef=ent_coef,
                            vf_coef=args.vf_coef,
                            norm_adv=args.norm_adv,
                        )
                        if not torch.isfinite(stats.loss) or stats.loss.abs() > args.guard_max_abs:
                            problem = f"loss {stats.loss.item():.3g} in epoch {epoch + 1}"
                            break
                        optimizer.zero_grad(set_to_none=True)
                        stats.loss.backward()
                        grad_norm = nn.utils.clip_grad_norm_(parameters, args.max_grad_norm)
                        if not torch.isfinite(grad_norm):
                            problem = f"non-finite gradient in epoch {epoch + 1}"
                            break
                        optimizer.step()
                        clipfracs.append(stats.clipfrac)
                    if problem is not None:
                        break
                    if args.target_kl is not None and stats.approx_kl > args.target_kl:
                        break

            if problem is not None:
                bad_batches_in_a_row += 1
                health_counts["bad_batches"] = health_counts.get("bad_batches", 0) + 1
                writer.add_scalar("guard/bad_batches", health_counts["bad_batches"], global_step)
                tqdm.write(f"{PROG}: warning: skipped a bad batch at step {global_step}: {problem}", file=sys.stderr)
                if bad_batches_in_a_row >= args.guard_patience:
                    raise BadBatchError(
                        f"stopping: {bad_batches_in_a_row} bad batches in a row (last: {problem}); "
                        f"the last good checkpoint is {checkpoint_path if os.path.exists(checkpoint_path) else 'none'}"
                    )
                continue
            bad_batches_in_a_row = 0

            # ---- Logging ----
            y_pred, y_true = b_values.cpu().numpy(), b_returns.cpu().numpy()
            ev = explained_variance(y_pred, y_true)
            sps = int((global_step - start_step) / (time.time() - start_time))
            last_stats = {
                "entropy": stats.entropy.item(),
                "approx_kl": stats.approx_kl.item(),
                "explained_variance": ev,
            }
            writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
            writer.add_scalar("charts/ent_coef", ent_coef, global_step)
            writer.add_scalar("losses/value_loss", stats.value_loss.item(), global_step)
            writer.add_scalar("losses/policy_loss", stats.policy_loss.item(), global_step)
            writer.add_scalar("losses/entropy", last_stats["entropy"], global_step)
            writer.add_scalar("losses/old_approx_kl", stats.old_approx_kl.item(), global_step)
            writer.add_scalar("losses/approx_kl", last_stats["approx_kl"], global_step)
            writer.add_scalar("losses/clipfrac", torch.stack(clipfracs).mean().item(), global_step)
            writer.add_scalar("losses/explained_variance", ev, global_step)
            writer.add_scalar("charts/SPS", sps, global_step)
            if recent_returns:
                writer.add_histogram("charts/episodic_return_hist", np.array(recent_returns), global_step)

            for key in history:
                history[key].append(last_stats[key])
            for name, message in health_warnings(history, iteration, args, act_dim):
                health_counts[name] = health_counts.get(name, 0) + 1
                writer.add_scalar(f"health/{name}", health_counts[name], global_step)
                if iteration - last_warned.get(name, -(10**9)) >= 50:
                    last_warned[name] = iteration
                    tqdm.write(f"{PROG}: warning: {message}", file=sys.stderr)

            progress.update(global_step - progress.n)
            recent = f"{np.mean(recent_returns):.1f}" if recent_returns else "n/a"
            progress.set_postfix_str(f"SPS={sps} return={recent}", refresh=False)
            if args.checkpoint_every and iteration % args.checkpoint_every == 0:
                save_checkpoint(iteration)
            if interrupted:
                status = "interrupted"
                break
    except KeyboardInterrupt:
        # A second Ctrl-C quits at once: the state may be mid-iteration, so the last checkpoint written at an
        # iteration boundary is kept rather than overwritten.
        status, hard_interrupt = "interrupted", True
    except BadBatchError as e:
        progress.close()
        print(f"{PROG}: error: {e}", file=sys.stderr)
        status = "stopped_by_guard"
        write_summary(run_dir, args, status, last_stats, recent_returns, global_step, wall_time_before, start_time)
        writer.close()
        close_envs(envs)
        return 1
    progress.close()
    signal.signal(signal.SIGINT, signal.default_int_handler)

    if status == "completed" or not hard_interrupt:
        save_checkpoint(iteration)
    if args.save_model and status == "completed":
        model_path = os.path.join(run_dir, f"{args.exp_name}.model")
        save_atomic(policy_state(agent, obs_rms, args) | {"global_step": global_step}, model_path)
        eval_returns = evaluate(agent, obs_rms, args.env_id, args.eval_episodes, args.seed + 10**6, args)
        for idx, episodic_return in enumerate(eval_returns):
            writer.add_scalar("eval/episodic_return", episodic_return, idx)
        print(f"model saved to {model_path}; eval return {eval_returns.mean():.2f} ± {eval_returns.std():.2f}")
    write_summary(run_dir, args, status, last_stats, recent_returns, global_step, wall_time_before, start_time)
    writer.close()
    close_envs(envs)
    if status == "interrupted":
        print(f"{PROG}: interrupted at step {global_step}; resume with --resume {checkpoint_path}", file=sys.stderr)
        return 130
    return 0


def write_summary(run_dir, args, status, last_stats, recent_returns, global_step, wall_time_before, start_time):
    """summary.json: everything needed to reproduce the run and judge it at a glance."""
    summary = {
        "status": status,
        "hyperparameters": dataclasses.asdict(args),
        "env_steps": global_step,
        "wall_time_seconds": round(wall_time_before + time.time() - start_time, 2),
        "final_entropy": last_stats.get("entropy"),
        "final_explained_variance": last_stats.get("explained_variance"),
        "final_approx_kl": last_stats.get("approx_kl"),
        "mean_return_last_episodes": float(np.mean(recent_returns)) if recent_returns else None,
        "num_last_episodes": len(recent_returns),
        "torch_version": torch.__version__,
        "gymnasium_version": gym.__version__,
    }
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)


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
