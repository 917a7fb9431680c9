"""Run management shared by ppo_continuous.py and dppo_ray.py: errors and flag checks, the command line, checkpoints
and resume, the run folder and its TensorBoard writer, logging with the guard's counters and health warnings,
Ctrl-C/SIGTERM, summary.json, and loading and evaluating a saved policy.

None of this is the algorithm (that is gae.py and ppo_continuous.py); it is what makes a run safe to interrupt, resume
and compare. Where it needs the algorithm (to rebuild an Agent from a checkpoint, or to act), it is handed the training
script's module (`script`), so that an edited copy of ppo_continuous.py loads and evaluates with its own network.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import importlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
import warnings
from collections import deque
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch
import tyro
from tqdm import tqdm

from fast_paths import FastPaths
from gae import RunningMeanStd, normalize_obs

PROG = os.path.basename(sys.argv[0]) if sys.argv[0].endswith(".py") else "ppo_continuous.py"


class UsageError(Exception):
    """Bad input: reported as one line on stderr with exit status 2."""


class DistributionGap(Exception):
    """The policy's distribution lacks something the run needs (an entropy, a mode): one line saying what to do, exit
    status 1."""


def distribution_gap(e: NotImplementedError) -> DistributionGap | None:
    """What torch.distributions left unimplemented, when that is where `e` comes from (its message is empty)."""
    frames = [frame for frame, _ in traceback.walk_tb(e.__traceback__)]
    inside = [f for f in frames if f"torch{os.sep}distributions" in f.f_code.co_filename]
    if not inside:
        return None
    frame = inside[-1]
    owner = frame.f_locals.get("self")
    what = frame.f_code.co_name.strip("_")
    name = f"{type(owner).__name__}.{what}" if owner is not None else what
    advice = {
        "entropy": "make Agent.evaluate return an estimate instead, for example -log_prob(action) (README, Changing "
        "the algorithm: the tanh-squashed Gaussian)",
        "mode": "give the distribution a mode, or return one that has one from Agent.get_distribution",
        "mean": "give the distribution a mean, or return one that has one from Agent.get_distribution",
    }.get(what, "implement it, or return a distribution that has it from Agent.get_distribution")
    return DistributionGap(f"the policy's distribution has no {what} ({name} is not implemented): {advice}")


class BadBatchError(Exception):
    """Raised by the numerical guard when the run must stop."""


class StopRun(Exception):
    """Something outside the learner (an env that keeps crashing or hanging, an actor that will not come back) ends the
    run between two updates: the learner's state is whole, so it is saved, and the message is the run's last line."""


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


def mujoco_warning(message: str) -> None:
    """MuJoCo's warnings, less one: gymnasium's HalfCheetah model (and dm_control's cheetah) sets `settotalmass`, which
    MuJoCo 3.17 and 4.0 deprecate but still apply (the body masses are the same in both), so it says nothing a user can
    act on. Others go to stderr as MuJoCo prints them."""
    if "settotalmass" not in message:
        print(f"WARNING: {message}", file=sys.stderr)


def quiet_mujoco_log() -> None:
    """MuJoCo's warnings through mujoco_warning, which also keeps MuJoCo from writing MUJOCO_LOG.TXT into the working
    directory of every process that builds a model."""
    try:
        import mujoco
    except ImportError:
        return
    mujoco.set_mju_user_warning(mujoco_warning)


def defer_dynamo_import() -> None:
    """torch.optim.Optimizer wraps add_param_group, state_dict, load_state_dict and zero_grad in torch._disable_dynamo,
    which imports torch._dynamo (torch.compile's tracer, with sympy) on their first call, only to keep a compiler out
    of them. Building the Adam of make_learner would pay that import at every start-up, though nothing compiles. While
    torch._dynamo is not imported no frame can be compiling, so these calls go straight to the method; once something
    imports it (torch.compile in an edited copy, or optimizer.step on the plain path), torch's own wrapper takes over.
    A torch without this private hook is left as it is."""
    for name in ("add_param_group", "state_dict", "load_state_dict", "zero_grad"):
        method = getattr(torch.optim.Optimizer, name)
        inner = getattr(method, "__wrapped__", None)
        if inner is None or getattr(inner, "__dynamo_disable", None) is not None or "torch._dynamo" in sys.modules:
            continue
        setattr(inner, "__dynamo_disable", direct_until_dynamo(method, inner))


def direct_until_dynamo(method, inner):
    """Call `inner` as it is until torch._dynamo is imported, then hand back to torch's wrapper `method`."""

    def call(*args, **kwargs):
        if "torch._dynamo" in sys.modules:
            delattr(inner, "__dynamo_disable")  # the wrapper builds its dynamo-disabled call on the next line
            return method(*args, **kwargs)
        return inner(*args, **kwargs)

    return call


# ---------------------------------------------------------------------------------------------------------------------
# A run: resume, seeding, folder and writer, Ctrl-C/SIGTERM, logging, summary
# ---------------------------------------------------------------------------------------------------------------------
# Flags a resumed run may change: how long it runs, where and how it logs and saves, how it uses the machine. All
# others define the run and come from the checkpoint. Those of the machine are never taken from the checkpoint: a run
# may resume elsewhere.
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
    "ray_address",
    "actor_cpus",
    "object_store_memory",
    "no_ray",
    "fast_path",
    "rollout_timeout",
    "max_actor_restarts",
}
RUN_LENGTH_FLAGS = {"total_timesteps", "run_name", "eval_episodes", "checkpoint_every", "save_model", "guard_patience"}
COMPUTED_FLAGS = {"batch_size", "minibatch_size", "num_iterations", "num_envs"}
RESUMABLE_FLAGS = MACHINE_FLAGS | RUN_LENGTH_FLAGS | COMPUTED_FLAGS


def resumed_args(args_type: type, args):
    """--resume: the flags that define the run default to the checkpoint's; a flag given that contradicts one of
    them is refused, naming it."""
    saved = load_checkpoint(args.resume)["args"]
    names = {f.name for f in dataclasses.fields(args_type)}
    # The two scripts' checkpoints differ in what a resumed run needs (the sampler's stream, the actors' state).
    this, writer = ("dppo_ray.py" if "num_actors" in keys else "ppo_continuous.py" for keys in (names, saved))
    if writer != this:
        raise UsageError(
            f"--resume {args.resume} is a checkpoint of {writer}: continue it with python {writer} --resume "
            f"{args.resume}"
        )
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


def code_version(scripts: list[str] | None = None) -> dict:
    """Which code a run trains with: a SHA-256 of its scripts (by default the repository's top-level ones: the trainers
    and the modules they import), which decides whether two runs compare, and for the reader the git commit and
    whether those scripts differ from it (None where there is no git checkout, as on a Ray node that got an upload)."""
    repo = os.path.dirname(os.path.abspath(__file__))
    if scripts is None:
        scripts = sorted(os.path.join(repo, n) for n in os.listdir(repo) if n.endswith(".py"))
    digest = hashlib.sha256()
    for path in scripts:
        with open(path, "rb") as f:
            digest.update(os.path.basename(path).encode() + b"\0" + f.read() + b"\0")
    version = {"scripts_sha256": digest.hexdigest(), "commit": None, "scripts_clean": None}
    folder = os.path.dirname(os.path.abspath(scripts[0])) if scripts else repo
    git = {"cwd": folder, "capture_output": True, "text": True, "timeout": 10}
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], **git)
        changed = subprocess.run(["git", "status", "--porcelain", "--", *scripts], **git)
    except (OSError, subprocess.TimeoutExpired):
        return version
    if commit.returncode == 0 and changed.returncode == 0:
        version.update(commit=commit.stdout.strip(), scripts_clean=not changed.stdout.strip())
    return version


def record_run(run_dir: str, command: list[str], extra: dict, resumed_at: int | None, scripts=None) -> None:
    """run.json: what the run is, written when it starts, so that a crashed run says it too. A new run records its
    command line and its code (code_version); each resume adds its own command and code under "resumes", so a run
    continued by other code says so."""
    path = os.path.join(run_dir, "run.json")
    entry = {"command": command, "code": code_version(scripts)}
    if resumed_at is None or not os.path.isfile(path):
        record = {**entry, **extra, "resumes": []}
        if resumed_at is not None:
            record["resumed_without_record_at_step"] = resumed_at
    else:
        with open(path) as f:
            record = json.load(f)
        record.setdefault("resumes", []).append({**entry, "at_step": resumed_at})
    with open(path + ".tmp", "w") as f:
        json.dump(record, f, indent=1)
    os.replace(path + ".tmp", path)


def ray_address_answers(address: str) -> bool:
    """Whether something listens at a Ray `host:port` (or `ray://host:port`): ray.init retries an address with no Ray
    behind it for minutes, a plain TCP probe answers at once."""
    host, _, port = address.split("://")[-1].rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except (OSError, ValueError):
        return False
    return True


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
    record_run(run_dir, [PROG, *sys.argv[1:]], {"hyperparameters": dataclasses.asdict(args)}, resumed_at)
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
    checkpoint is saved, the exit status is 130 or 143. A second signal quits at once (`hard`: the state may be
    mid-iteration, so the last checkpoint written at an iteration boundary is kept). The guard's BadBatchError ends
    the run with one line ("stopped_by_guard", exit status 1). A StopRun ends it as "failed" (exit status 1) with a
    checkpoint; its message is kept in `error` for the script to print last."""

    def __init__(self, run_dir: str):
        self.run_dir = run_dir
        self.signum = None
        self.status = "running"
        self.hard = False
        self.error: str | None = None

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
            self.status = "interrupted"
            self.hard = True
            self.signum = self.signum or signal.SIGINT
        elif issubclass(exc_type, BadBatchError):
            self.status = "stopped_by_guard"
            tqdm.write(f"{PROG}: error: {exc}; the last good checkpoint stays in {self.run_dir}", file=sys.stderr)
        elif issubclass(exc_type, StopRun):
            self.status = "failed"
            self.error = str(exc)  # printed by the script as its very last line, once everything is shut down
        return exc_type is None or issubclass(exc_type, (KeyboardInterrupt, BadBatchError, StopRun))

    @property
    def keeps_state(self) -> bool:
        """Whether the state is whole and worth a checkpoint: not after a second signal, nor when the guard stopped
        the run (the last good checkpoint then stays). A StopRun comes between updates: that state is whole."""
        return self.status in ("completed", "interrupted", "failed") and not self.hard

    def exit_status(self) -> int:
        return {"completed": 0, "stopped_by_guard": 1, "failed": 1}.get(
            self.status, 128 + (self.signum or signal.SIGINT)
        )


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


@dataclass
class RunState:
    """How far a run got: what a checkpoint restores besides the learner, and what summary.json reports. `counters`
    holds the run's event counts (the guard's, the health warnings', DPPO's dropped rollouts and restarts)."""

    global_step: int = 0
    iteration: int = 0
    wall_time_before: float = 0.0  # seconds of training in earlier sessions of a resumed run
    counters: dict[str, int] = field(default_factory=dict)


class Monitor:
    """What a run reports: TensorBoard scalars (its writer, in the run folder), the progress bar, the guard's counters
    and health warnings. It reads the step and iteration from the run's state and counts into its counters."""

    def __init__(self, args, run_dir: str, state: RunState, act_dim: int, fast: FastPaths):
        self.args = args
        self.run_dir = run_dir
        self.state = state
        self.act_dim = act_dim
        self.writer = start_run(args, run_dir, resumed_at=state.global_step if args.resume else None)
        self.fast = fast
        self.writer.add_text("fast_paths", fast.table())
        self.switches_written = 0
        for key in ("bad_batches", "dropped_samples", "discarded_rollouts"):
            state.counters.setdefault(key, 0)
        self.recent_returns: deque[float] = deque(maxlen=100)
        self.history: dict[str, list[float]] = {"entropy": [], "approx_kl": [], "explained_variance": []}
        self.last_warned: dict[str, int] = {}
        self.bad_in_a_row = 0
        self.last_stats = {}
        self.start_time = time.time()
        self.start_step = state.global_step
        total = args.num_iterations * args.batch_size
        self.progress = tqdm(
            total=total,
            initial=min(state.global_step, total),
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

    def episodes(self, rollout: dict) -> None:
        for episode_return, episode_length in zip(rollout["episode_returns"], rollout["episode_lengths"]):
            self.writer.add_scalar("charts/episodic_return", episode_return, self.state.global_step)
            self.writer.add_scalar("charts/episodic_length", episode_length, self.state.global_step)
            self.recent_returns.append(float(episode_return))

    def update(self, stats: dict, problem: str | None, batch: dict, extra: dict) -> bool:
        """Log one update; count and report what the guard dropped. Returns whether the update happened, and raises
        BadBatchError after --guard-patience bad batches in a row."""
        global_step, iteration, counters = self.state.global_step, self.state.iteration, self.state.counters
        dropped = batch["non_finite"] + batch["outliers"]
        if dropped:
            counters["dropped_samples"] += dropped
            self.writer.add_scalar("guard/dropped_samples", counters["dropped_samples"], global_step)
            self.warn(
                "dropped",
                f"dropped {batch['non_finite']} samples with NaN/inf data and {batch['outliers']} "
                f"outlier advantages at step {global_step} (total {counters['dropped_samples']})",
                iteration,
            )
        if problem is not None:
            self.bad_in_a_row += 1
            counters["bad_batches"] += 1
            self.writer.add_scalar("guard/bad_batches", counters["bad_batches"], global_step)
            tqdm.write(f"{PROG}: warning: skipped a bad batch at step {global_step}: {problem}", file=sys.stderr)
            if self.bad_in_a_row >= self.args.guard_patience:
                raise BadBatchError(f"stopping: {self.bad_in_a_row} bad batches in a row (last: {problem})")
            return False
        self.bad_in_a_row = 0
        sps = int((global_step - self.start_step) / (time.time() - self.start_time))
        for tag, value in (stats | extra | self.fast.scalars() | {"charts/SPS": sps}).items():
            self.writer.add_scalar(tag, value, global_step)
        if len(self.fast.switches) > self.switches_written:  # a part stepped aside: the table says since when
            self.switches_written = len(self.fast.switches)
            self.writer.add_text("fast_paths", self.fast.table(), global_step)
        if self.recent_returns:
            self.writer.add_histogram("charts/episodic_return_hist", np.array(self.recent_returns), global_step)
        for key in self.history:
            self.history[key].append(stats[f"losses/{key}"])
        self.last_stats = {key: values[-1] for key, values in self.history.items()}
        warmed_up = iteration > max(5, self.args.num_iterations // 10)
        for name, message in health_warnings(self.history, warmed_up, self.act_dim):
            counters[name] = counters.get(name, 0) + 1
            self.writer.add_scalar(f"health/{name}", counters[name], global_step)
            self.warn(name, message, iteration)
        self.progress.update(global_step - self.progress.n)
        recent = f"{np.mean(self.recent_returns):.1f}" if self.recent_returns else "n/a"
        self.progress.set_postfix_str(f"return={recent}", refresh=False)
        return True

    def wall_time(self) -> float:
        """Seconds of training, earlier sessions of a resumed run included."""
        return self.state.wall_time_before + time.time() - self.start_time

    def mean_return(self) -> float | None:
        return float(np.mean(self.recent_returns)) if self.recent_returns else None


def require_positive(args, names: list[str]) -> None:
    """Each named flag must be > 0 (a flag left at None, meaning "default", passes)."""
    for name in names:
        if getattr(args, name) is not None and not getattr(args, name) > 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")


# ---------------------------------------------------------------------------------------------------------------------
# Checkpoints, one format for both scripts: tensors and plain values only, loaded with weights_only=True
# ---------------------------------------------------------------------------------------------------------------------
def policy_state(agent, obs_rms: RunningMeanStd, args, global_step: int) -> dict:
    """The saved model: enough to rebuild the Agent and act (its constructor's arguments, weights, normalization
    statistics, the action bounds) and to know how it was trained (the flags)."""
    bounds = getattr(agent, "action_bounds", None)
    return {
        "agent": agent.state_dict(),
        "agent_args": [agent.obs_dim, agent.act_dim, agent.discrete],
        "obs_layout": agent.obs_layout,
        "action_bounds": None if bounds is None else [torch.as_tensor(b) for b in bounds],
        "obs_rms": obs_rms.state_dict(),
        "args": dataclasses.asdict(args),
        "global_step": global_step,
    }


def optimizer_state(learner) -> dict:
    """torch.optim's state_dict, from whichever path ran the steps."""
    if learner.fast.update is None:
        return learner.optimizer.state_dict()
    return learner.fast.update.state_dict()


def training_checkpoint(learner, args, state: RunState, monitor: Monitor) -> dict:
    """A checkpoint.pt: the saved model plus what a resumed run needs to continue exactly."""
    checkpoint = policy_state(learner.agent, learner.obs_rms, args, state.global_step)
    checkpoint["optimizer"] = optimizer_state(learner)
    checkpoint["return_rms"] = learner.return_rms.state_dict()
    checkpoint["iteration"] = state.iteration
    checkpoint["run_name"] = args.run_name
    checkpoint["wall_time"] = monitor.wall_time()
    checkpoint["counters"] = dict(state.counters)
    checkpoint["torch_rng"] = torch.get_rng_state()
    return checkpoint


def restore_training(ckpt: dict, learner, path: str) -> RunState:
    """Load a checkpoint.pt into the learner (before its fast paths are chosen: they take the optimizer's state)."""
    try:
        learner.agent.load_state_dict(ckpt["agent"])
        learner.obs_rms.load_state_dict(ckpt["obs_rms"])
        learner.optimizer.load_state_dict(ckpt["optimizer"])
        for group in learner.optimizer.param_groups:  # checkpoints before torch.optim saved only lr, betas and eps
            for key, value in learner.optimizer.defaults.items():
                group.setdefault(key, value)
        learner.return_rms.load_state_dict(ckpt["return_rms"])
        torch.set_rng_state(ckpt["torch_rng"])
        return RunState(
            global_step=int(ckpt["global_step"]),
            iteration=int(ckpt["iteration"]),
            wall_time_before=float(ckpt["wall_time"]),
            counters=dict(ckpt["counters"]),
        )
    except (RuntimeError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"checkpoint {path} does not fit this env/network: {str(e).splitlines()[0][:160]}") from None


def agent_from_checkpoint(ckpt: dict, path: str, script) -> tuple:
    """The Agent of `script` (the training script's module) built with the saved constructor arguments and weights,
    and the saved observation statistics."""
    state = ckpt["agent"]
    try:
        if "agent_args" in ckpt:
            obs_dim, act_dim, discrete = ckpt["agent_args"]
        else:  # saved before agent_args was: the stock network's first and last layers tell the sizes
            discrete = "actor_logstd" not in state
            obs_dim, act_dim = state["actor_mean.0.weight"].shape[1], state["actor_mean.4.weight"].shape[0]
        agent = script.Agent(int(obs_dim), int(act_dim), bool(discrete))
        obs_rms = RunningMeanStd(shape=(int(obs_dim),))
        agent.load_state_dict(state)
        agent.obs_layout = ckpt.get("obs_layout")
        if ckpt.get("action_bounds") is not None:
            agent.action_bounds = [b.numpy() for b in ckpt["action_bounds"]]
        obs_rms.load_state_dict(ckpt["obs_rms"])
    except (RuntimeError, ValueError, KeyError, IndexError, AttributeError, TypeError) as e:
        raise UsageError(
            f"checkpoint {path} does not hold a policy this network fits: {str(e).splitlines()[0][:160]}"
        ) from None
    return agent, obs_rms


# ---------------------------------------------------------------------------------------------------------------------
# Using a trained policy: load_policy for Python, --eval-checkpoint on the command line
# ---------------------------------------------------------------------------------------------------------------------
class Policy:
    """A trained policy with its frozen normalization statistics.

    policy = load_policy("runs/<run>/ppo_continuous.model")
    action = policy.predict(obs)           # one observation or a batch
    """

    def __init__(self, agent, obs_rms: RunningMeanStd, saved_args: dict, script):
        # The saved network itself, in eval() mode (a random layer gives the same action twice): a policy acts on
        # inputs no start-up check has seen, so no fast path stands in here
        self.agent = copy.deepcopy(agent).cpu().eval()
        self.actor = script.make_actor(self.agent, False)
        self.env_id = saved_args["env_id"]
        self.obs_clip = saved_args["obs_clip"]
        self.obs_mean = obs_rms.mean if saved_args["norm_obs"] else None
        self.obs_std = np.sqrt(obs_rms.var + 1e-8) if saved_args["norm_obs"] else None
        self.obs_layout = agent.obs_layout
        self.bounds = getattr(agent, "action_bounds", None)
        self.make_env = script.make_env

    def predict(self, obs, deterministic: bool = True, rng: np.random.Generator | None = None):
        """The mean (or most likely) action, or a sample when not deterministic; clipped to the env's bounds. `obs` is
        one observation or a batch, as the env returns it (a Dict observation as a dict: it is flattened here)."""
        if self.obs_layout is not None and (isinstance(obs, (dict, tuple)) or self.obs_layout[0][0] == []):
            obs = flatten_observation(obs, self.obs_layout)  # a Dict/Tuple, or a Box of more than one dimension
        obs = np.asarray(obs, dtype=np.float64)
        batch = normalize_obs(np.atleast_2d(obs), self.obs_mean, self.obs_std, self.obs_clip)
        if deterministic:
            actions = self.actor.best_action(batch)
        elif self.agent.discrete:
            actions = self.actor.act(batch, (rng or np.random.default_rng()).random((len(batch), 1)))
        else:
            actions = self.actor.act(
                batch, (rng or np.random.default_rng()).standard_normal((len(batch), self.agent.act_dim))
            )
        if not self.agent.discrete:
            if self.bounds is None:  # a model saved before the bounds were: the env tells them
                env = self.make_env(self.env_id)
                self.bounds = [env.action_space.low, env.action_space.high]
                env.close()
            actions = np.clip(actions, *self.bounds)
        return actions if obs.ndim > 1 else actions[0]


def load_policy(path: str, script=None) -> Policy:
    """A model or checkpoint saved by ppo_continuous.py or dppo_ray.py, ready to act. `script`: the module whose Agent
    it was trained with (default: ppo_continuous; pass your edited copy's module)."""
    script = script or importlib.import_module("ppo_continuous")
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
    quiet_mujoco_log()
    ckpt = load_checkpoint(args.eval_checkpoint)
    agent, obs_rms = agent_from_checkpoint(ckpt, args.eval_checkpoint, script)
    policy = Policy(agent, obs_rms, ckpt["args"], script)
    returns = evaluate(policy, args.eval_episodes, args.seed)
    print(
        f"{policy.env_id}: mean return {returns.mean():.2f} ± {returns.std():.2f} over {len(returns)} episodes "
        f"(mean action, saved normalization statistics, {ckpt.get('global_step', '?')} training steps)"
    )


# ---------------------------------------------------------------------------------------------------------------------
# The end of a run and the command line
# ---------------------------------------------------------------------------------------------------------------------
def end_run(monitor: Monitor, status: str, learner, state: RunState, script, extra: dict) -> int:
    """After training: the model and its evaluation (with --save-model, when the run completed), summary.json, and one
    closing line on stdout (--quiet included): where the run went, how it ended and what to run next. Returns 1 when
    the saved model could not be evaluated (the files and the closing line are written all the same), else 0."""
    args, run_dir = monitor.args, monitor.run_dir
    model_path = os.path.join(run_dir, f"{args.exp_name}.model")
    eval_error = None
    if status == "completed" and args.save_model:
        save_atomic(policy_state(learner.agent, learner.obs_rms, args, state.global_step), model_path)
        try:
            policy = Policy(learner.agent, learner.obs_rms, dataclasses.asdict(args), script)
            returns = evaluate(policy, args.eval_episodes, args.seed + 10**6)
        except Exception as e:  # noqa: BLE001 (an edited policy that cannot act: the run's files must still be written)
            gap = distribution_gap(e) if isinstance(e, NotImplementedError) else None
            eval_error = str(gap or e).splitlines()[0] if str(gap or e).strip() else type(e).__name__
            print(
                f"{PROG}: error: model saved to {model_path}, but evaluating it failed: {eval_error}", file=sys.stderr
            )
        else:
            for idx, episodic_return in enumerate(returns):
                monitor.writer.add_scalar("eval/episodic_return", episodic_return, idx)
            print(f"model saved to {model_path}; eval return {returns.mean():.2f} ± {returns.std():.2f}")
    monitor.progress.close()
    summary = {
        "status": status,
        "hyperparameters": dataclasses.asdict(args),
        "env_steps": state.global_step,
        "wall_time_seconds": round(monitor.wall_time(), 2),
        "final_entropy": monitor.last_stats.get("entropy"),
        "final_explained_variance": monitor.last_stats.get("explained_variance"),
        "final_approx_kl": monitor.last_stats.get("approx_kl"),
        "mean_return_last_episodes": monitor.mean_return(),
        "num_last_episodes": len(monitor.recent_returns),
        **state.counters,
        "fast_paths": learner.fast.used,
        "fast_path_switches": learner.fast.switches,
        **({"eval_error": eval_error} if eval_error else {}),
        **extra,
        "torch_version": torch.__version__,
        "gymnasium_version": gym.__version__,
    }
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    monitor.writer.close()
    line = f"{PROG}: {status} at step {state.global_step}; run folder {run_dir}"
    if monitor.recent_returns:
        line += f"; mean return of the last {len(monitor.recent_returns)} episodes {monitor.mean_return():.2f}"
    line += "; curves: tensorboard --logdir runs"
    if status in ("interrupted", "failed"):
        line += f"; continue with: python {PROG} --resume {os.path.join(run_dir, 'checkpoint.pt')}"
    elif status == "completed" and args.save_model:
        line += f"; evaluate with: python {PROG} --eval-checkpoint {model_path}"
    print(line, flush=True)
    return 1 if eval_error else 0


def cli(args_type: type, validate, train, script) -> int:
    """Parse the flags, then train or evaluate; bad input is one line on stderr and exit status 2. `script`: the
    module whose Agent a checkpoint to evaluate was trained with."""
    args = tyro.cli(args_type)
    defer_dynamo_import()
    sys.path.insert(0, os.getcwd())  # `--env-id module:EnvId` finds the module in the working directory, as python -m
    try:
        if args.resume and not args.eval_checkpoint:  # both together are refused by validate()
            args = resumed_args(args_type, args)
        validate(args)
        if args.eval_checkpoint:
            run_eval_checkpoint(args, script)
            return 0
        done = int(load_checkpoint(args.resume).get("iteration", 0)) if args.resume else 0
        if done and done >= args.num_iterations:  # a finished run: say so and leave its files as they are
            print(
                f"{PROG}: {args.resume} has run {done} of {args.num_iterations} iterations: nothing to do "
                "(raise --total-timesteps to extend it)"
            )
            return 0
        return train(args)
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except (DistributionGap, NotImplementedError) as e:
        gap = distribution_gap(e) if isinstance(e, NotImplementedError) else e
        if gap is None:
            raise
        print(f"{PROG}: error: {gap}", file=sys.stderr)
        return 1
