"""Checkpoints and saved policies: one file format for both scripts, written atomically and read with
weights_only=True (so that a shared file cannot run code); which flags a resumed run keeps; and a saved policy loaded
to act (`load_policy`, `Policy.predict`) or evaluated (`--eval-checkpoint`).

Where it needs the algorithm (to rebuild an Agent), it is handed the training script's module (`script`), so that an
edited copy of ppo_continuous.py loads and evaluates with its own network.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import os
import sys
import typing
import warnings
from collections import deque
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch
import tyro
from torch.distributions import Distribution, Independent, TransformedDistribution

from command_line import COMPUTED_FLAGS
from gae import RunningMeanStd, normalize_obs, running_std
from run_record import first_line


class UsageError(Exception):
    """Bad input: reported as one line on stderr with exit status 2."""


class StopRun(Exception):
    """Something outside the learner (an env that keeps crashing or hanging, an actor that will not come back), or a
    hook the gradient cannot run, ends the run between two updates: the learner's state is whole, so it is saved, and
    the message is the run's last line (run_management.TrainingLoop)."""


# The running script's name, for its one-line messages (ppo_continuous.py when not run as a script)
PROG = os.path.basename(sys.argv[0]) if sys.argv[0].endswith(".py") else "ppo_continuous.py"


def unwrapped(agent):
    """The Agent itself, where a user wrapped it in torch.compile (an OptimizedModule keeps it as _orig_mod)."""
    return getattr(agent, "_orig_mod", agent)


class DistributionGap(Exception):
    """The policy's distribution lacks something the run needs (an entropy, a mode): one line saying what to do, exit
    status 1."""


RECENT_EPISODES = 100  # the episodes of summary.json's mean_return_last_episodes and the closing line


@dataclass
class RunState:
    """How far a run got: what a checkpoint restores besides the learner, and what summary.json reports. `counters`
    holds the run's event counts (the guard's, the health warnings', the samplers' lost and dropped rollouts);
    `recent_returns` the last 100 episodes' returns, over every session of a resumed run."""

    global_step: int = 0
    iteration: int = 0
    wall_time_before: float = 0.0  # seconds of training in earlier sessions of a resumed run
    counters: dict[str, int] = field(default_factory=dict)
    recent_returns: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_EPISODES))


# ---------------------------------------------------------------------------------------------------------------------
# Checkpoint files
# ---------------------------------------------------------------------------------------------------------------------
def save_atomic(obj: dict, path: str) -> None:
    tmp = f"{path}.tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def saved_weights(state_dict: dict) -> dict:
    """The Agent's own parameter names: a torch.compile'd Agent's state_dict (as an earlier version saved it) prefixes
    each with _orig_mod."""
    return {key.removeprefix("_orig_mod."): value for key, value in state_dict.items()}


def load_checkpoint(path: str) -> dict:
    if not os.path.isfile(path):
        raise UsageError(f"checkpoint not found: {path}")
    try:
        with warnings.catch_warnings():  # torch warns about the pickle protocol before refusing a foreign pickle
            warnings.simplefilter("ignore")
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # corrupt, truncated, or a pickle that tries to run code
        raise UsageError(f"cannot load checkpoint {path}: not a valid checkpoint ({first_line(e)[:160]})") from None
    if not isinstance(ckpt, dict) or not {"agent", "obs_rms", "args"} <= set(ckpt):
        raise UsageError(f"cannot load checkpoint {path}: it holds no policy of ppo_continuous.py or dppo_ray.py")
    return ckpt


def policy_state(agent, obs_rms: RunningMeanStd, args, global_step: int) -> dict:
    """The saved model: enough to rebuild the Agent and act (its constructor's arguments, weights, normalization
    statistics, the action bounds) and to know how it was trained (the flags)."""
    bounds = getattr(agent, "action_bounds", None)
    return {
        "agent": unwrapped(agent).state_dict(),
        "agent_args": [agent.obs_dim, agent.act_dim, getattr(agent, "discrete", False)],
        "obs_layout": agent.obs_layout,
        "action_bounds": None if bounds is None else [torch.as_tensor(b) for b in bounds],
        "obs_rms": obs_rms.state_dict(),
        "args": dataclasses.asdict(args),
        "global_step": global_step,
    }


def training_checkpoint(learner, args, state: RunState, wall_time: float) -> dict:
    """A checkpoint.pt: the saved model plus what a resumed run needs to continue exactly."""
    checkpoint = policy_state(learner.agent, learner.obs_rms, args, state.global_step)
    checkpoint["optimizer"] = learner.optimizer.state_dict()
    checkpoint["return_rms"] = learner.return_rms.state_dict()
    checkpoint["iteration"] = state.iteration
    checkpoint["run_name"] = args.run_name
    checkpoint["wall_time"] = wall_time
    checkpoint["counters"] = dict(state.counters)
    checkpoint["recent_returns"] = list(state.recent_returns)
    checkpoint["torch_rng"] = torch.get_rng_state()
    return checkpoint


def restore_training(ckpt: dict, learner, path: str) -> RunState:
    """Load a checkpoint.pt into the learner."""
    try:
        unwrapped(learner.agent).load_state_dict(saved_weights(ckpt["agent"]))
        learner.obs_rms.load_state_dict(ckpt["obs_rms"])
        learner.optimizer.load_state_dict(ckpt["optimizer"])
        for group in learner.optimizer.param_groups:  # a checkpoint from before the schedule kept each group's own
            group.setdefault("initial_lr", float(ckpt["args"]["learning_rate"]))
        learner.return_rms.load_state_dict(ckpt["return_rms"])
        torch.set_rng_state(ckpt["torch_rng"])
        return RunState(
            global_step=int(ckpt["global_step"]),
            iteration=int(ckpt["iteration"]),
            wall_time_before=float(ckpt["wall_time"]),
            counters=dict(ckpt["counters"]),
            recent_returns=deque(map(float, ckpt.get("recent_returns", [])), maxlen=RECENT_EPISODES),
        )
    except (RuntimeError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"checkpoint {path} does not fit this env/network: {first_line(e)[:160]}") from None


def agent_from_checkpoint(ckpt: dict, path: str, script) -> tuple:
    """The Agent of `script` (the training script's module) built with the saved constructor arguments and weights,
    and the saved observation statistics."""
    try:
        obs_dim, act_dim, discrete = ckpt["agent_args"]
        if discrete:  # a policy over Discrete actions: only an Agent that takes `discrete` builds one
            if "discrete" not in inspect.signature(script.Agent).parameters:
                writer = f"{ckpt['args'].get('exp_name', 'the script that trained it')}.py"
                raise UsageError(
                    f"{path} is a policy over Discrete actions, which this script's Agent does not build: "
                    f"use python {writer} --eval-checkpoint {path}"
                )
            agent = script.Agent(int(obs_dim), int(act_dim), discrete=True)
        else:
            agent = script.Agent(int(obs_dim), int(act_dim))
        obs_rms = RunningMeanStd(shape=(int(obs_dim),))
        agent.load_state_dict(saved_weights(ckpt["agent"]))
        agent.obs_layout = ckpt.get("obs_layout")
        if ckpt.get("action_bounds") is not None:
            agent.action_bounds = [b.numpy() for b in ckpt["action_bounds"]]
        obs_rms.load_state_dict(ckpt["obs_rms"])
    except (RuntimeError, ValueError, KeyError, IndexError, AttributeError, TypeError) as e:
        raise UsageError(f"checkpoint {path} does not hold a policy this network fits: {first_line(e)[:160]}") from None
    return agent, obs_rms


# ---------------------------------------------------------------------------------------------------------------------
# Resuming: the flags that define a run come from its checkpoint
# ---------------------------------------------------------------------------------------------------------------------
# Flags a resumed run may change: how long it runs, where and how it logs and saves, how it uses the machine. All
# others define the run and come from the checkpoint. Those of the machine are never taken from the checkpoint: a run
# may resume elsewhere. A script with machine flags of its own adds them (cli's `machine_flags`).
MACHINE_FLAGS = {
    "resume",
    "eval_checkpoint",
    "overwrite",
    "quiet",
    "track",
    "wandb_project_name",
    "wandb_entity",
    "capture_video",
    "torch_threads",
    "cuda",
    "fast_path",
    "compile",
    "seed_processes",
    "ray_address",
    "rollout_timeout",
}
RUN_LENGTH_FLAGS = {
    "total_timesteps",
    "run_name",
    "eval_episodes",
    "checkpoint_every",
    "save_model",
    "upload_model",
    "hf_entity",
    "guard_patience",
    "num_seeds",  # launcher.py: --resume with --num-seeds N carries on N seeds of a launch
}


def computed_flags(args_type: type) -> set[str]:
    """The fields a script computes from its flags: COMPUTED_FLAGS, and those it keeps off its command line
    (tyro.conf.Suppress: dppo_ray's num_envs, its actors times their envs). ppo_continuous.py's num_envs is a flag."""
    hints = typing.get_type_hints(args_type, include_extras=True)
    suppress = typing.get_args(tyro.conf.Suppress[int])[1:]
    hidden = {name for name, hint in hints.items() if any(marker in suppress for marker in typing.get_args(hint)[1:])}
    return COMPUTED_FLAGS | hidden


def resumed_args(args_type: type, args, machine_flags: set[str], argv: list[str] | None = None):
    """--resume: the flags that define the run default to the checkpoint's; a flag given that contradicts one of
    them is refused, naming it. `argv`: the command line as the parser takes it (default: sys.argv's)."""
    saved = load_checkpoint(args.resume)["args"]
    names = {f.name for f in dataclasses.fields(args_type)}
    # The two scripts' checkpoints differ in what a resumed run needs: a checkpoint with flags this script lacks, or
    # (for a script whose Args extends another's) with none of the flags it adds, is the other script's.
    bases = [base for base in args_type.__mro__[1:] if dataclasses.is_dataclass(base)]
    added = names - {f.name for f in dataclasses.fields(bases[0])} if bases else set()
    if set(saved) - names or (added and not added & set(saved)):
        writer = f"{saved.get('exp_name', 'the script that wrote it')}.py"
        raise UsageError(
            f"--resume {args.resume} is a checkpoint of {writer}: continue it with python {writer} --resume "
            f"{args.resume}"
        )
    args = tyro.cli(
        args_type, args=argv, default=args_type(**{k: v for k, v in saved.items() if k not in machine_flags})
    )
    for name in sorted(names & set(saved) - machine_flags - RUN_LENGTH_FLAGS - computed_flags(args_type)):
        if getattr(args, name) != saved[name]:
            if name == "env_id":
                raise UsageError(f"--resume {args.resume} was trained on {saved[name]}, not --env-id {args.env_id}")
            raise UsageError(
                f"--{name.replace('_', '-')} {getattr(args, name)} contradicts --resume {args.resume}, which was "
                f"trained with {saved[name]} (a resumed run keeps the flags that define it)"
            )
    return args


def resume_checkpoint(args) -> dict | None:
    if not args.resume:
        return None
    ckpt = load_checkpoint(args.resume)
    if "optimizer" not in ckpt:
        raise UsageError(f"--resume {args.resume} is a saved model, not a training checkpoint.pt")
    args.run_name = args.run_name or ckpt["run_name"]
    return ckpt


# ---------------------------------------------------------------------------------------------------------------------
# Dict and Tuple observations: the layout of the flat vector the policy sees, saved with it
# ---------------------------------------------------------------------------------------------------------------------
def observation_layout(env_id: str, space: gym.Space) -> list[list] | None:
    """None for a flat Box. For a Dict or Tuple of Boxes, nested to any depth: its entries in the order
    gymnasium.spaces.flatten concatenates them (a Dict's own order, which gymnasium sorts by key when the Dict is built
    from a dict; a Tuple's index order), each as [path of keys and indices, shape]. A Box's values go in C order."""
    if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
        return None
    layout = []

    def walk(node: gym.Space, path: list) -> None:
        if isinstance(node, gym.spaces.Box):
            layout.append([path, list(node.shape)])
        elif isinstance(node, (gym.spaces.Dict, gym.spaces.Tuple)):
            items = node.spaces.items() if isinstance(node, gym.spaces.Dict) else enumerate(node.spaces)
            for key, child in items:
                walk(child, [*path, key])
        else:
            where = "/".join(map(str, path)) or "the observation"
            raise UsageError(f"{env_id}: {where} is {node}; observations must be Boxes (Dict and Tuple of them)")

    walk(space, [])
    return layout


def flatten_observation(obs, layout: list[list]) -> np.ndarray:
    """A Dict/Tuple observation, or a batch of them (arrays with leading batch dimensions), as flat vectors laid out
    as the env's FlattenObservation lays them out."""
    parts = []
    for path, shape in layout:
        value = obs
        for key in path:
            value = value[key]
        value = np.asarray(value, dtype=np.float64)
        parts.append(value.reshape(*value.shape[: value.ndim - len(shape)], -1))
    return np.concatenate(parts, axis=-1)


# ---------------------------------------------------------------------------------------------------------------------
# Using a trained policy: load_policy for Python, --eval-checkpoint on the command line
# ---------------------------------------------------------------------------------------------------------------------
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


class Policy:
    """A trained policy with its frozen normalization statistics.

    policy = ppo_continuous.load_policy("runs/<run>/ppo_continuous.model")
    action = policy.predict(obs)           # one observation or a batch
    """

    def __init__(self, agent, obs_rms: RunningMeanStd, saved_args: dict, script):
        # The saved network itself, in eval() mode (a random layer gives the same action twice): a policy acts on
        # inputs no start-up check has seen, so no fast path stands in here
        self.agent = copy.deepcopy(agent).cpu().eval()
        self.env_id = saved_args["env_id"]
        self.obs_clip = saved_args["obs_clip"]
        self.obs_mean = obs_rms.mean if saved_args["norm_obs"] else None
        self.obs_std = running_std(obs_rms.var) if saved_args["norm_obs"] else None
        self.obs_layout = agent.obs_layout
        self.bounds = getattr(agent, "action_bounds", None)
        self.make_env = script.make_env

    def predict(self, obs, deterministic: bool = True, rng: np.random.Generator | None = None):
        """The mean (or most likely) action, or a sample when not deterministic (drawn from `rng`'s stream); clipped
        to the env's bounds. `obs` is one observation or a batch, as the env returns it (a Dict observation as a dict:
        it is flattened here)."""
        if self.obs_layout is not None and (isinstance(obs, (dict, tuple)) or self.obs_layout[0][0] == []):
            obs = flatten_observation(obs, self.obs_layout)  # a Dict/Tuple, or a Box of more than one dimension
        obs = np.asarray(obs, dtype=np.float64)
        batch = normalize_obs(np.atleast_2d(obs), self.obs_mean, self.obs_std, self.obs_clip)
        with torch.no_grad():
            dist = self.agent.get_distribution(torch.from_numpy(batch.astype(np.float32)))
            if deterministic:
                actions = distribution_mode(dist)
            else:
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(int((rng or np.random.default_rng()).integers(2**63)))
                    actions = dist.sample()
        actions = actions.numpy()
        if self.bounds is not None:
            actions = np.clip(actions, *self.bounds)
        return actions if obs.ndim > 1 else actions[0]


def load_policy(path: str, script) -> Policy:
    """A model or checkpoint saved by ppo_continuous.py or dppo_ray.py, ready to act. `script`: the module whose Agent
    acts (ppo_continuous.load_policy passes its own, so an edited copy's acts with the copy's Agent)."""
    ckpt = load_checkpoint(path)
    agent, obs_rms = agent_from_checkpoint(ckpt, path, script)
    return Policy(agent, obs_rms, ckpt["args"], script)


def evaluate(policy: Policy, episodes: int, seed: int) -> np.ndarray:
    """Returns of `episodes` episodes with the deterministic action; the first reset is seeded."""
    env = policy.make_env(policy.env_id)
    returns = []
    obs, _ = env.reset(seed=seed)
    while len(returns) < episodes:
        done = False
        episode_return = 0.0
        while not done:
            obs, reward, terminated, truncated, _ = env.step(policy.predict(obs))
            episode_return += float(reward)
            done = terminated or truncated
        returns.append(episode_return)
        obs, _ = env.reset()
    env.close()
    return np.array(returns)


def run_eval_checkpoint(args, script) -> None:
    ckpt = load_checkpoint(args.eval_checkpoint)
    agent, obs_rms = agent_from_checkpoint(ckpt, args.eval_checkpoint, script)
    policy = Policy(agent, obs_rms, ckpt["args"], script)
    returns = evaluate(policy, args.eval_episodes, args.seed)
    print(
        f"{policy.env_id}: mean return {returns.mean():.2f} ± {returns.std():.2f} over {len(returns)} episodes "
        f"(mean action, saved normalization statistics, {ckpt.get('global_step', '?')} training steps)"
    )


def plain_value(value) -> bool:
    """Whether an attribute is plain data that a sampler's copy can carry (and Ray can send)."""
    if isinstance(value, (list, tuple)):
        return all(plain_value(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str, np.ndarray))


def agent_attributes(agent) -> tuple[dict, list[str]]:
    """The Agent's own public attributes that are plain data (what the samplers' copies are given; the train/eval mode
    is theirs), and the names of those that are not (which they cannot carry)."""
    public = {k: v for k, v in vars(unwrapped(agent)).items() if not k.startswith("_") and k != "training"}
    carried = {name: value for name, value in public.items() if plain_value(value)}
    return carried, [name for name in public if name not in carried]
