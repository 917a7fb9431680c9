"""Run bookkeeping shared by ppo_continuous.py and dppo_ray.py: errors and flag checks, checkpoint files, the run folder
and its TensorBoard writer, logging with the guard's counters and health warnings, Ctrl-C/SIGTERM, summary.json, and
stepping a list of envs.

None of this is the algorithm (that is gae.py and ppo_continuous.py); it is what makes a run safe to interrupt,
resume and compare.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import signal
import sys
import time
import warnings
from collections import deque

import gymnasium as gym
import numpy as np
import torch
import tyro
from tqdm import tqdm

PROG = os.path.basename(sys.argv[0]) if sys.argv[0].endswith(".py") else "ppo_continuous.py"


class UsageError(Exception):
    """Bad input: reported as one line on stderr with exit status 2."""


class BadBatchError(Exception):
    """Raised by the numerical guard when the run must stop."""


# ---------------------------------------------------------------------------------------------------------------------
# Checkpoint files: written atomically, read with weights_only=True so that a shared file cannot run code
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
    if not isinstance(ckpt, dict) or not {"agent", "obs_rms", "args"} <= set(ckpt):
        raise UsageError(f"cannot load checkpoint {path}: it holds no policy of ppo_continuous.py or dppo_ray.py")
    return ckpt


def quiet_mujoco_log() -> None:
    """MuJoCo 4 writes MUJOCO_LOG.TXT into the working directory of every process that builds a model."""
    try:
        import mujoco
    except ImportError:
        return
    config = mujoco.MjLogConfig.get()
    config.logto_file = False
    config.set()


# ---------------------------------------------------------------------------------------------------------------------
# A run: resume, seeding, folder and writer, Ctrl-C/SIGTERM, logging, summary
# ---------------------------------------------------------------------------------------------------------------------
# Flags a resumed run may change: how long it runs, where and how it logs and saves, how it uses the machine. All
# others define the run and come from the checkpoint. Those of the machine are never taken from the checkpoint: a run
# may resume elsewhere.
MACHINE_FLAGS = {"resume", "eval_checkpoint", "overwrite", "quiet", "track", "wandb_project_name", "wandb_entity"}
MACHINE_FLAGS |= {
    "capture_video",
    "torch_threads",
    "cuda",
    "ray_address",
    "actor_cpus",
    "object_store_memory",
    "no_ray",
    "fast_path",
}
RESUMABLE_FLAGS = MACHINE_FLAGS | {"total_timesteps", "run_name", "eval_episodes", "checkpoint_every", "save_model"}
RESUMABLE_FLAGS |= {"guard_patience", "batch_size", "minibatch_size", "num_iterations", "num_envs"}


def resumed_args(args_type: type, args):
    """--resume: the flags that define the run default to the checkpoint's; a flag given that contradicts one of
    them is refused, naming it."""
    saved = load_checkpoint(args.resume)["args"]
    names = {f.name for f in dataclasses.fields(args_type)}
    args = tyro.cli(args_type, default=args_type(**{k: v for k, v in saved.items() if k in names - MACHINE_FLAGS}))
    for name in sorted(names & set(saved) - RESUMABLE_FLAGS):
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


def seed_everything(args) -> torch.device:
    random.seed(args.seed)
    np.random.seed(args.seed)  # noqa: NPY002 (seeds third-party code; our own sampling uses the samplers' generators)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_num_threads(args.torch_threads)
    return torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")


def run_folder(args) -> str:
    """runs/<run-name>. An existing folder is never mixed with a new run: refused unless --resume or --overwrite."""
    args.run_name = (
        args.run_name or f"{args.env_id.replace(':', '_')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    )
    run_dir = os.path.join("runs", args.run_name)
    if os.path.exists(run_dir) and not args.resume:
        if not args.overwrite:
            raise UsageError(
                f"{run_dir} already exists: continue it with --resume {os.path.join(run_dir, 'checkpoint.pt')}, "
                "or start it afresh with --overwrite"
            )
        shutil.rmtree(run_dir)
    return run_dir


def start_run(args, run_dir: str, resumed_at: int | None):
    """The run folder and its TensorBoard writer (with wandb mirroring it under --track). `resumed_at`: the step a
    resumed run continues from (None for a new run)."""
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
            name=args.run_name,
            save_code=True,
        )
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import hparams

    os.makedirs(run_dir, exist_ok=True)
    # purge_step drops any points a crashed run wrote after the checkpoint, so a resumed curve continues cleanly.
    writer = SummaryWriter(run_dir, purge_step=None if resumed_at is None else resumed_at + 1)
    if resumed_at is None:
        table = "\n".join([f"|{key}|{value}|" for key, value in vars(args).items()])
        writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + table)
        hparam_values = {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in vars(args).items()}
        for summary in hparams(hparam_values, {"charts/episodic_return": 0.0, "losses/explained_variance": 0.0}):
            writer.file_writer.add_summary(summary)
    return writer


class TrainingLoop:
    """The context the training loop runs in, and how it ended (`status`, `exit_status()`).

    Ctrl-C (SIGINT) or a cluster's preemption (SIGTERM) sets `signum`: the loop finishes its iteration and stops, a
    checkpoint is saved, the exit status is 130 or 143. A second signal quits at once ("interrupted_hard": the state may
    be mid-iteration, so the last checkpoint written at an iteration boundary is kept). The guard's BadBatchError
    ends the run with one line ("stopped_by_guard", exit status 1)."""

    def __init__(self, run_dir: str):
        self.run_dir, self.signum, self.status = run_dir, None, "running"

    def __enter__(self):
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self.first)
        return self

    def first(self, signum, frame):
        self.signum = signum
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, self.second)
        name = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
        tqdm.write(
            f"{PROG}: {name}: saving a checkpoint after this iteration (signal again to quit now)", file=sys.stderr
        )

    def second(self, signum, frame):
        self.signum = signum
        raise KeyboardInterrupt

    def __exit__(self, exc_type, exc, traceback) -> bool:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if exc_type is None:
            self.status = "completed" if self.signum is None else "interrupted"
        elif issubclass(exc_type, KeyboardInterrupt):
            self.status, self.signum = "interrupted_hard", self.signum or signal.SIGINT
        elif issubclass(exc_type, BadBatchError):
            self.status = "stopped_by_guard"
            tqdm.write(f"{PROG}: error: {exc}; the last good checkpoint stays in {self.run_dir}", file=sys.stderr)
        return exc_type is None or issubclass(exc_type, (KeyboardInterrupt, BadBatchError))

    def exit_status(self) -> int:
        return {"completed": 0, "stopped_by_guard": 1}.get(self.status, 128 + (self.signum or signal.SIGINT))


# ---------------------------------------------------------------------------------------------------------------------
# Health diagnostics (the PPO notes: entropy falls slowly, explained variance >= ~0.85, approx_kl around 0.01)
# ---------------------------------------------------------------------------------------------------------------------
def health_warnings(history: dict[str, list[float]], warmed_up: bool, act_dim: int) -> list[tuple[str, str]]:
    """(name, advice) for each problem the recent update statistics show."""
    found = []
    entropy, kl, ev = history["entropy"], history["approx_kl"], history["explained_variance"]
    if len(entropy) > 10 and (entropy[-11] - entropy[-1]) / act_dim > 0.5:
        drop = (entropy[-11] - entropy[-1]) / act_dim
        advice = "raise --ent-coef (e.g. 0.005) or lower --update-epochs / --learning-rate"
        found.append(
            ("entropy_collapse", f"entropy is collapsing ({drop:.2f} nats per action dim in 10 updates): {advice}")
        )
    if len(kl) >= 5 and min(kl[-5:]) > 0.02:
        advice = "lower --learning-rate or set --target-kl 0.02"
        found.append(("high_kl", f"approx_kl has stayed above 0.02 for 5 updates (now {kl[-1]:.3f}): {advice}"))
    if warmed_up and ev and ev[-1] < 0:
        advice = "check the reward scale (--norm-reward) or raise --vf-coef"
        found.append(
            (
                "low_explained_variance",
                f"explained_variance is {ev[-1]:.2f} < 0 after warm-up, the critic is worse than a constant: {advice}",
            )
        )
    return found


class Monitor:
    """What a run reports: TensorBoard scalars, the progress bar, the guard's counters and health warnings."""

    def __init__(self, args, writer, global_step: int, counters: dict, act_dim: int, wall_time_before: float = 0.0):
        self.args, self.writer, self.act_dim = args, writer, act_dim
        self.counters = counters  # shared with the caller, which may count events of its own in it
        for key in ("bad_batches", "dropped_samples"):
            counters.setdefault(key, 0)
        self.recent_returns: deque[float] = deque(maxlen=100)
        self.history: dict[str, list[float]] = {"entropy": [], "approx_kl": [], "explained_variance": []}
        self.last_warned: dict[str, int] = {}
        self.bad_in_a_row, self.last_stats = 0, {}
        self.start_time, self.start_step, self.wall_time_before = time.time(), global_step, wall_time_before
        total = args.num_iterations * args.batch_size
        self.progress = tqdm(
            total=total,
            initial=min(global_step, total),
            disable=args.quiet,
            unit="step",
            unit_scale=True,
            dynamic_ncols=True,
            mininterval=1.0,
        )

    def warn(self, name: str, message: str, iteration: int) -> None:
        """At most one warning of a kind per 50 iterations."""
        if iteration - self.last_warned.get(name, -(10**9)) >= 50:
            self.last_warned[name] = iteration
            tqdm.write(f"{PROG}: warning: {message}", file=sys.stderr)

    def episodes(self, rollout: dict, global_step: int) -> None:
        for episode_return, episode_length in zip(rollout["episode_returns"], rollout["episode_lengths"]):
            self.writer.add_scalar("charts/episodic_return", episode_return, global_step)
            self.writer.add_scalar("charts/episodic_length", episode_length, global_step)
            self.recent_returns.append(float(episode_return))

    def update(
        self, stats: dict, problem: str | None, batch: dict, global_step: int, iteration: int, extra: dict
    ) -> bool:
        """Log one update; count and report what the guard dropped. Returns whether the update happened, and raises
        BadBatchError after --guard-patience bad batches in a row."""
        dropped = batch["non_finite"] + batch["outliers"]
        if dropped:
            self.counters["dropped_samples"] += dropped
            self.writer.add_scalar("guard/dropped_samples", self.counters["dropped_samples"], global_step)
            self.warn(
                "dropped",
                f"dropped {batch['non_finite']} samples with NaN/inf data and {batch['outliers']} "
                f"outlier advantages at step {global_step} (total {self.counters['dropped_samples']})",
                iteration,
            )
        if problem is not None:
            self.bad_in_a_row += 1
            self.counters["bad_batches"] += 1
            self.writer.add_scalar("guard/bad_batches", self.counters["bad_batches"], global_step)
            tqdm.write(f"{PROG}: warning: skipped a bad batch at step {global_step}: {problem}", file=sys.stderr)
            if self.bad_in_a_row >= self.args.guard_patience:
                raise BadBatchError(f"stopping: {self.bad_in_a_row} bad batches in a row (last: {problem})")
            return False
        self.bad_in_a_row = 0
        sps = int((global_step - self.start_step) / (time.time() - self.start_time))
        for tag, value in (stats | extra | {"charts/SPS": sps}).items():
            self.writer.add_scalar(tag, value, global_step)
        if self.recent_returns:
            self.writer.add_histogram("charts/episodic_return_hist", np.array(self.recent_returns), global_step)
        for key in self.history:
            self.history[key].append(stats[f"losses/{key}"])
        self.last_stats = {key: values[-1] for key, values in self.history.items()}
        warmed_up = iteration > max(5, self.args.num_iterations // 10)
        for name, message in health_warnings(self.history, warmed_up, self.act_dim):
            self.counters[name] = self.counters.get(name, 0) + 1
            self.writer.add_scalar(f"health/{name}", self.counters[name], global_step)
            self.warn(name, message, iteration)
        self.progress.update(global_step - self.progress.n)
        recent = f"{np.mean(self.recent_returns):.1f}" if self.recent_returns else "n/a"
        self.progress.set_postfix_str(f"return={recent}", refresh=False)
        return True

    def wall_time(self) -> float:
        """Seconds of training, earlier sessions of a resumed run included."""
        return self.wall_time_before + time.time() - self.start_time

    def mean_return(self) -> float | None:
        return float(np.mean(self.recent_returns)) if self.recent_returns else None


def finish_run(args, run_dir: str, monitor: Monitor, status: str, global_step: int, extra: dict) -> None:
    """Write summary.json and print one closing line on stdout (--quiet included): where the run went, how it ended
    and what to run next."""
    monitor.progress.close()
    summary = dict(status=status, hyperparameters=dataclasses.asdict(args), env_steps=global_step)
    summary |= dict(wall_time_seconds=round(monitor.wall_time(), 2), final_entropy=monitor.last_stats.get("entropy"))
    summary |= dict(final_explained_variance=monitor.last_stats.get("explained_variance"))
    summary |= dict(
        final_approx_kl=monitor.last_stats.get("approx_kl"), mean_return_last_episodes=monitor.mean_return()
    )
    summary |= dict(num_last_episodes=len(monitor.recent_returns), **monitor.counters, **extra)
    summary |= dict(torch_version=torch.__version__, gymnasium_version=gym.__version__)
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    monitor.writer.close()
    line = f"{PROG}: {status} at step {global_step}; run folder {run_dir}"
    if monitor.recent_returns:
        line += f"; mean return of the last {len(monitor.recent_returns)} episodes {monitor.mean_return():.2f}"
    line += "; curves: tensorboard --logdir runs"
    model_path = os.path.join(run_dir, f"{args.exp_name}.model")
    if status == "interrupted":
        line += f"; continue with: python {PROG} --resume {os.path.join(run_dir, 'checkpoint.pt')}"
    elif status == "completed" and args.save_model:
        line += f"; evaluate with: python {PROG} --eval-checkpoint {model_path}"
    print(line, flush=True)


def require_positive(args, names: list[str]) -> None:
    """Each named flag must be > 0 (a flag left at None, meaning "default", passes)."""
    for name in names:
        if getattr(args, name) is not None and not getattr(args, name) > 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")


def step_envs(envs: list[gym.Env], actions: np.ndarray, out: tuple[np.ndarray, ...] | None = None):
    """Step every env; an env whose episode ended is reset in the same call. `out`: the (observations, rewards,
    terminations, truncations) rows to fill, as the rollout passes its own arrays' rows, instead of new arrays.

    This is gymnasium's SAME_STEP autoreset written out: the returned observation of a finished env is the first one
    of its next episode, and `final_obs` maps its index to the last observation of the episode that ended, which the
    truncation bootstrap needs. (gymnasium's vector envs default to NEXT_STEP, where the step after an episode end
    is a fake transition that must not be trained on; stepping a list directly also skips about 80 us of vector-env
    bookkeeping per step.)"""
    n = len(envs)
    observations, rewards, terminations, truncations = out or (None, np.zeros(n), np.zeros(n, bool), np.zeros(n, bool))
    final_obs: dict[int, np.ndarray] = {}
    for i, (env, action) in enumerate(zip(envs, actions)):
        obs, reward, terminated, truncated, _ = env.step(action)
        rewards[i], terminations[i], truncations[i] = reward, terminated, truncated
        if terminated or truncated:
            final_obs[i] = obs
            obs, _ = env.reset()
        if observations is None:
            observations = np.empty((n, *np.shape(obs)))
        observations[i] = obs
    return observations, rewards, terminations, truncations, final_obs
