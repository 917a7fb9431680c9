"""A training run's life around the algorithm, shared by ppo_continuous.py and dppo_ray.py: the command line, the run
folder and its run.json, seeding, Ctrl-C/SIGTERM, the TensorBoard writer, the console (progress bar, the guard's
counters, health warnings), summary.json and the closing line.

None of this is the algorithm (that is gae.py and ppo_continuous.py); it is what makes a run safe to interrupt, resume
and compare. Checkpoints and saved policies are checkpoints.py's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import functools
import hashlib
import importlib.util
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
import traceback

import gymnasium as gym
import numpy as np
import torch
import tyro
from tqdm import tqdm

from checkpoints import (
    MACHINE_FLAGS,
    PROG,
    DistributionGap,
    Policy,
    RunState,
    StopRun,
    UsageError,
    evaluate,
    load_checkpoint,
    policy_state,
    resumed_args,
    run_eval_checkpoint,
    save_atomic,
    unwrapped,
)
from command_line import command_flags, optional_switches
from run_record import PROGRESS_FD, file_sha256, first_line, package_version, run_environment, sturdy_console
from stop_signals import STOP_SIGNALS, TwoStageStop, signal_name, take_back_stop_signals


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


class Interrupted(Exception):
    """Ctrl-C or SIGTERM came while the run waited for its data (dppo_ray.py's actors): the iteration under way stops
    there, before its update, so the state is whole."""


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


# ---------------------------------------------------------------------------------------------------------------------
# A run: what it is (run.json), seeding, its folder and writer, Ctrl-C/SIGTERM
# ---------------------------------------------------------------------------------------------------------------------
@functools.cache
def python_roots() -> tuple[str, ...]:
    """The folders of Python's own library and of its installed packages."""
    paths = sysconfig.get_paths()
    return tuple({paths[key] + os.sep for key in ("stdlib", "platstdlib", "purelib", "platlib")})


def installed_file(path: str) -> bool:
    """Whether a module's file belongs to Python or to an installed package (not to the run's own code)."""
    parts = os.path.normpath(path).split(os.sep)
    return "site-packages" in parts or "dist-packages" in parts or path.startswith(python_roots())


def generated_file(path: str) -> bool:
    """Whether a module's file is code torch.compile generated (in inductor's cache), not code a run was given."""
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    parts = os.path.normpath(path).split(os.sep)
    return any(part.startswith("torchinductor_") for part in parts) or bool(cache and path.startswith(cache + os.sep))


def own_modules(env_id: str | None = None) -> dict[str, str]:
    """{module name: its file} of every module this process imported from outside Python and the installed packages
    (the script, which is named by its file, the repository's modules, a custom env's), and the module of a
    `module:EnvId` env id, which the envs import in other processes."""
    modules = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        # a real source file (torch.ops' __file__ is a bare name) that is not generated code (inductor's graphs)
        if not (path and path.endswith(".py") and os.path.isabs(path) and os.path.isfile(path)):
            continue
        if name == "__mp_main__" or installed_file(path) or generated_file(path):
            continue  # __mp_main__: multiprocessing's second name for __main__
        modules[os.path.basename(path) if name == "__main__" else name] = path
    env_module = env_id.partition(":")[0] if env_id and ":" in env_id else None
    if env_module and env_module not in modules:
        with contextlib.suppress(ImportError, ValueError):
            spec = importlib.util.find_spec(env_module)
            origin = spec.origin if spec is not None else None
            if origin and origin.endswith(".py") and not installed_file(os.path.abspath(origin)):
                modules[env_module] = os.path.abspath(origin)
    return modules


def code_version(env_id: str | None = None, only: list[str] | None = None) -> dict:
    """Which code a run trains with: the SHA-256 of each module it imported from outside the installed packages
    (own_modules; `only`: those of these names), under its path (relative to the repository where it lies inside it),
    and one SHA-256 over them all, which decides whether two runs compare; for the reader, the git commit and whether
    the repository's modules among them differ from it (None without a git checkout, as on a Ray node that got an
    upload)."""
    repo = os.path.dirname(os.path.abspath(__file__))
    modules = {}
    for name, path in sorted(own_modules(env_id).items()):
        if only is None or name in only:
            inside = os.path.commonpath([repo, path]) == repo
            modules[name] = {"path": os.path.relpath(path, repo) if inside else path, "sha256": file_sha256(path)}
    digest = hashlib.sha256()
    for name, module in modules.items():
        digest.update(f"{name}\0{module['sha256']}\0".encode())
    version = {"scripts_sha256": digest.hexdigest(), "modules": modules, "commit": None, "scripts_clean": None}
    tracked = [module["path"] for module in modules.values() if not os.path.isabs(module["path"])]
    git = {"cwd": repo, "capture_output": True, "text": True, "timeout": 10}
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], **git)
        changed = subprocess.run(["git", "status", "--porcelain", "--", *tracked], **git)
    except (OSError, subprocess.TimeoutExpired):
        return version
    if commit.returncode == 0 and changed.returncode == 0:
        version.update(commit=commit.stdout.strip(), scripts_clean=not changed.stdout.strip())
    return version


def record_run(run_dir: str, command: list[str], extra: dict, resumed_at: int | None, env_id=None, only=None) -> None:
    """run.json: what the run is, written when it starts, so that a crashed run says it too. A new run records its
    command line, its code (code_version) and what it ran on (run_environment); each resume adds its own under
    "resumes", so a run continued by other code, other versions or other flags says so."""
    path = os.path.join(run_dir, "run.json")
    entry = {"command": command, "code": code_version(env_id, only), "environment": run_environment()}
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


def tensorboard_writer(args, run_dir: str, resumed_at: int | None):
    """The run's TensorBoard SummaryWriter in its folder (with wandb mirroring it under --track), once run.json is
    written. `resumed_at`: the step a resumed run continues from (None for a new run)."""
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
    fields = {"hyperparameters": dataclasses.asdict(args)}
    record_run(run_dir, [PROG, *sys.argv[1:]], fields, resumed_at, env_id=args.env_id)
    # purge_step drops any points a crashed run wrote after the checkpoint, so a resumed curve continues cleanly.
    writer = SummaryWriter(run_dir, purge_step=None if resumed_at is None else resumed_at + 1)
    if resumed_at is None:
        table = "\n".join([f"|{key}|{value}|" for key, value in vars(args).items()])
        writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + table)
        hparam_values = {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in vars(args).items()}
        for summary in hparams(hparam_values, {"charts/episodic_return": 0.0, "losses/explained_variance": 0.0}):
            writer.file_writer.add_summary(summary)
    return writer


def rollout_timeout(args, num_envs: int) -> float:
    """--rollout-timeout, or by default 60 s plus 20 ms per env step of a rollout of `num_envs` envs (or of the
    warm-up, if longer): a simulator as slow as 50 steps/s still makes it."""
    return args.rollout_timeout or 60.0 + 0.02 * num_envs * max(args.num_steps, args.obs_warmup_steps)


# How long after its timeout a process whose main thread holds Python's lock (C code stuck without releasing it, so
# that the watchdog thread cannot run) is ended by faulthandler instead, its threads' stacks printed
LAST_RESORT_SECONDS = 60.0


def stuck_where(frame, env_id: str, first_step: int) -> tuple[str, str]:
    """Which env the main thread waits for (`frame`, its innermost), as ppo_continuous.step_envs was stepping it, and
    where: the step of the rollout (Sampler.sample) and the innermost line of Python."""
    env = step = None
    inner = frame
    while frame is not None:
        names = frame.f_locals
        if frame.f_code.co_name == "step_envs" and "i" in names and "envs" in names:
            env = (names["i"], len(names["envs"]))
        elif frame.f_code.co_name == "sample" and "step" in names and "num_steps" in names:
            step = (names["step"], names["num_steps"], names.get("num_envs", 1))
        frame = frame.f_back
    which = f"env {env[0] + 1} of {env[1]} ({env_id})" if env else f"the envs ({env_id})"
    where = []
    if step:
        at = first_step + step[0] * step[2] + (env[0] + 1 if env else 0)
        where.append(f"at step {step[0] + 1} of {step[1]} of the rollout (step {at:,} of the run)")
    if inner is not None:
        where.append(f"in {os.path.basename(inner.f_code.co_filename)}:{inner.f_lineno} ({inner.f_code.co_name})")
    return which, ", ".join(where)


class TrainingLoop(TwoStageStop):
    """The context the training loop runs in, and how it ended (`status`, `exit_status()`).

    Ctrl-C (SIGINT) or a cluster's preemption (SIGTERM) sets `signum`: the loop finishes its iteration and stops, a
    checkpoint is saved, the exit status is 130 or 143. SIGHUP (a terminal closed, or a launcher that died: Linux may
    say that more than once, as it hands the run from one of the launcher's dying threads to the next) does the same,
    once, with exit status 129, and is ignored from then on, and after the loop, while the run writes its last files;
    a run started with SIGHUP ignored (nohup) keeps it ignored.
    A second SIGINT or SIGTERM quits at once (`hard`: the state may be
    mid-iteration, so the last checkpoint written at an iteration boundary is kept). The guard's BadBatchError ends
    the run with one line ("stopped_by_guard", exit status 1). A StopRun ends it as "failed" (exit status 1) with a
    checkpoint; its message is kept in `error` for the script to print last. Interrupted (a signal that came while the
    run waited for its data) ends the iteration under way before its update, as "interrupted" with a checkpoint.
    A rollout that runs past --rollout-timeout (`watch`) ends the run as "failed", exit status 124 (give_up).
    `run` and the script's `save_checkpoint` are what finish_run ends the run with."""

    def __init__(self, run: Run, save_checkpoint):
        super().__init__(self.stop_after_iteration)  # a second SIGINT or SIGTERM raises KeyboardInterrupt
        self.run, self.save_checkpoint = run, save_checkpoint
        self.status = "running"
        self.hard = False
        self.error: str | None = None
        self.timed_out = False
        self.watched = threading.Condition()  # guards `deadline` between the main thread and the watchdog
        self.deadline: tuple[float, float, int] | None = None  # (when, its seconds, the run's step) while watched
        self.watchdog: threading.Thread | None = None

    def __enter__(self):
        # nohup's SIGHUP stays ignored (take_back_stop_signals leaves it so)
        self.signals = [signum for signum in STOP_SIGNALS if signal.getsignal(signum) is not signal.SIG_IGN]
        return super().__enter__()

    def stop_after_iteration(self, signum: int) -> None:
        if hasattr(signal, "SIGHUP"):  # from now on, to the end of the process: stopping already
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
        name = signal_name(signum)
        if name == "SIGHUP":
            name += " (its terminal or launcher went)"
        tqdm.write(
            f"{PROG}: {name}: saving a checkpoint after this iteration (signal again to quit now)", file=sys.stderr
        )

    def __exit__(self, exc_type, exc, traceback) -> bool:
        super().__exit__(exc_type, exc, traceback)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if hasattr(signal, "SIGHUP"):  # the run's last files are written whatever its terminal or launcher does
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
        if exc_type is None:
            self.status = "completed" if self.signum is None else "interrupted"
        elif issubclass(exc_type, Interrupted):
            self.status = "interrupted"
        elif issubclass(exc_type, KeyboardInterrupt):
            self.status = "interrupted"
            self.hard = True
            self.signum = self.signum or signal.SIGINT
        elif issubclass(exc_type, BadBatchError):
            self.status = "stopped_by_guard"
            tqdm.write(f"{PROG}: error: {exc}; the last good checkpoint stays in {self.run.run_dir}", file=sys.stderr)
        elif issubclass(exc_type, StopRun):
            self.status = "failed"
            self.error = str(exc)  # printed by the script as its very last line, once everything is shut down
        return exc_type is None or issubclass(exc_type, (Interrupted, KeyboardInterrupt, BadBatchError, StopRun))

    @property
    def keeps_state(self) -> bool:
        """Whether the state is whole and worth a checkpoint: not after a second signal, nor when the guard stopped
        the run (the last good checkpoint then stays). A StopRun comes between updates: that state is whole."""
        return self.status in ("completed", "interrupted", "failed") and not self.hard

    def exit_status(self) -> int:
        if self.timed_out:
            return 124  # as coreutils' timeout says a command ran out of time
        return {"completed": 0, "stopped_by_guard": 1, "failed": 1}.get(
            self.status, 128 + (self.signum or signal.SIGINT)
        )

    @contextlib.contextmanager
    def watch(self, seconds: float | None):
        """--rollout-timeout around the envs' steps (`seconds`; None: not watched, as dppo_ray.py's actors on Ray,
        whose pool times each one). A watchdog thread waits for the deadline; past it, the run ends from that thread
        (give_up), whatever the main thread is stuck in: a Python call, or C code that no signal interrupts, which
        releases Python's lock while it waits. The main thread is then inside the rollout, which leaves the learner
        alone, so the state is the last update's. C code that holds that lock stops every thread of the process:
        faulthandler then ends it LAST_RESORT_SECONDS later, printing where each thread is."""
        if not seconds:
            yield
            return
        with self.watched:
            if self.watchdog is None:
                self.watchdog = threading.Thread(target=self.watch_rollouts, name="rollout-watchdog", daemon=True)
                self.watchdog.start()
            self.deadline = (time.monotonic() + seconds, seconds, self.run.state.global_step)
            self.watched.notify()
        faulthandler.dump_traceback_later(seconds + LAST_RESORT_SECONDS, exit=True)
        try:
            yield
        finally:
            faulthandler.cancel_dump_traceback_later()
            with self.watched:
                self.deadline = None
                given_up = self.timed_out
            while given_up:  # the watchdog is ending the run: this thread must not touch its state meanwhile
                time.sleep(60)

    def watch_rollouts(self) -> None:
        """The watchdog thread: gives up the run (give_up) when a watched call runs past its deadline."""
        with self.watched:
            while True:
                if self.deadline is None:
                    self.watched.wait()
                    continue
                left = self.deadline[0] - time.monotonic()
                if left <= 0:
                    break
                self.watched.wait(left)
            self.timed_out = True
            _, seconds, first_step = self.deadline
        self.give_up(seconds, first_step)

    def give_up(self, seconds: float, first_step: int) -> None:
        """End the run from the watchdog thread: the checkpoint of the last update, summary.json, the closing line
        and one line naming the env that did not answer; then the process exits with 124, its stuck thread with it."""
        faulthandler.cancel_dump_traceback_later()
        frame = sys._current_frames().get(threading.main_thread().ident)
        which, where = stuck_where(frame, self.run.args.env_id, first_step)
        self.status = "failed"
        self.error = f"--rollout-timeout: {which} did not answer within {seconds:g} s" + (f", {where}" if where else "")
        finish_run(self)
        print(f"{PROG}: error: {self.error}", file=sys.stderr, flush=True)
        os._exit(self.exit_status())


# ---------------------------------------------------------------------------------------------------------------------
# Health diagnostics: the signs of a failing PPO run that Huang et al. 2022 ("The 37 implementation details of PPO")
# and Andrychowicz et al. 2021 ("What matters in on-policy RL") describe: entropy collapsing, approx_kl staying high,
# a critic worse than a constant
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


def progress_channel():
    """The pipe a launcher of several seeds (launcher.py) reads this run's progress from, named by $PPO_PROGRESS_FD;
    None when there is none. Taken out of the environment, so that a process this run starts does not write to it.
    Such a run's console is a pipe to the launcher: made sturdy, so that a launcher killed mid-run does not stop the
    run before its checkpoint (its SIGTERM comes, and its lines then go nowhere)."""
    fd = os.environ.pop(PROGRESS_FD, None)
    if fd:
        sturdy_console()
    try:
        return os.fdopen(int(fd), "w", buffering=1) if fd else None
    except (OSError, ValueError):
        return None


def report_progress(channel, step: int, total: int, recent_return: float | None) -> None:
    """A line of a run's progress to its launcher (the pipe of progress_channel), as launcher.SeedProcess reads it:
    the steps taken, the run's budget and the mean return of its last episodes ("nan" before the first ends)."""
    recent = "nan" if recent_return is None else f"{recent_return:.1f}"
    with contextlib.suppress(OSError):  # a launcher that has gone does not stop the run
        channel.write(f"{step} {total} {recent}\n")


class Monitor:
    """The console of a run and the guard's bookkeeping: the progress bar, warnings (at most one of a kind per 50
    iterations), the guard's counters and its patience, the health warnings. It reads the step and iteration from the
    run's state, counts into its counters, and writes what it counts to the run's TensorBoard writer."""

    def __init__(self, args, writer, state: RunState, act_dim: int, fast):
        self.args = args
        self.writer = writer
        self.run_dir = writer.log_dir
        self.state = state
        self.act_dim = act_dim
        self.fast = fast  # the fast paths (fast_paths.FastPaths): their table goes to TensorBoard's text tab
        self.writer.add_text("fast_paths", fast.table())
        self.switches_written = 0
        for key in ("bad_batches", "dropped_samples", "discarded_rollouts"):
            state.counters.setdefault(key, 0)
        self.history: dict[str, list[float]] = {"entropy": [], "approx_kl": [], "explained_variance": []}
        self.last_warned: dict[str, int] = {}
        self.bad_in_a_row = 0
        self.start_time = time.time()
        self.start_step = state.global_step
        total = args.num_iterations * args.batch_size
        self.launcher = progress_channel()  # a launcher of several seeds shows the progress; this run's bar is off
        self.progress = tqdm(
            total=total,
            initial=min(state.global_step, total),
            disable=args.quiet or self.launcher is not None,
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

    def guard(self, batch: dict, problem: str | None) -> bool:
        """Count and report the samples the guard dropped from this batch, and a bad batch (`problem`: the update was
        skipped). Returns whether the update happened; raises BadBatchError after --guard-patience bad batches in a
        row."""
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
        if problem is None:
            self.bad_in_a_row = 0
            return True
        self.bad_in_a_row += 1
        counters["bad_batches"] += 1
        self.writer.add_scalar("guard/bad_batches", counters["bad_batches"], global_step)
        tqdm.write(f"{PROG}: warning: skipped a bad batch at step {global_step}: {problem}", file=sys.stderr)
        if self.bad_in_a_row >= self.args.guard_patience:
            raise BadBatchError(f"stopping: {self.bad_in_a_row} bad batches in a row (last: {problem})")
        return False

    def steps_per_second(self) -> int:
        return int((self.state.global_step - self.start_step) / (time.time() - self.start_time))

    def diagnose(self, stats: dict) -> None:
        """After an update's scalars are written: the health warnings, the fast paths' table when a part stepped aside,
        the histogram of recent returns, the progress bar."""
        global_step, iteration, counters = self.state.global_step, self.state.iteration, self.state.counters
        if len(self.fast.switches) > self.switches_written:  # a part stepped aside: the table says since when
            self.switches_written = len(self.fast.switches)
            self.writer.add_text("fast_paths", self.fast.table(), global_step)
        if self.state.recent_returns:
            self.writer.add_histogram("charts/episodic_return_hist", np.array(self.state.recent_returns), global_step)
        for key in self.history:
            self.history[key].append(stats[f"losses/{key}"])
        warmed_up = iteration > max(5, self.args.num_iterations // 10)
        for name, message in health_warnings(self.history, warmed_up, self.act_dim):
            counters[name] = counters.get(name, 0) + 1
            self.writer.add_scalar(f"health/{name}", counters[name], global_step)
            self.warn(name, message, iteration)
        self.progress.update(global_step - self.progress.n)
        recent = f"{self.mean_return():.1f}" if self.state.recent_returns else "n/a"
        self.progress.set_postfix_str(f"return={recent}", refresh=False)
        if self.launcher is not None:
            report_progress(self.launcher, global_step, self.progress.total, self.mean_return())

    def wall_time(self) -> float:
        """Seconds of training, earlier sessions of a resumed run included."""
        return self.state.wall_time_before + time.time() - self.start_time

    def mean_return(self) -> float | None:
        return float(np.mean(self.state.recent_returns)) if self.state.recent_returns else None


def say_rounded_timesteps(args) -> None:
    """One line on stderr when --total-timesteps is not a whole number of batches: a run trains whole batches only, so
    it takes fewer steps than asked."""
    steps = args.num_iterations * args.batch_size
    if steps != args.total_timesteps:
        tqdm.write(
            f"{PROG}: --total-timesteps {args.total_timesteps} is rounded down to whole batches of {args.batch_size} "
            f"steps: {steps} steps in {args.num_iterations} iterations",
            file=sys.stderr,
        )


def check_run_flags(args) -> None:
    """Each flag's range, and the flags of a run's files, videos and resuming and of --num-seeds' processes: one
    UsageError each."""
    positive = ["total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs", "eval_episodes"]
    positive += ["guard_patience", "torch_threads", "learning_rate", "clip_coef", "obs_clip", "reward_clip"]
    require_positive(args, [*positive, "guard_max_abs", "num_seeds"])
    if not 0 < args.gamma <= 1 or not 0 <= args.gae_lambda <= 1:
        raise UsageError(f"--gamma must be in (0, 1] and --gae-lambda in [0, 1], got {args.gamma}, {args.gae_lambda}")
    if args.target_kl is not None and not args.target_kl > 0:
        raise UsageError(f"--target-kl must be positive (or None), got {args.target_kl}")
    if args.seed < 0:
        raise UsageError(f"--seed must be >= 0 (numpy's and gymnasium's seeds are), got {args.seed}")
    if args.obs_warmup_steps < 0:
        raise UsageError(f"--obs-warmup-steps must be >= 0, got {args.obs_warmup_steps}")
    if not 0 <= args.rollout_timeout < float("inf"):
        raise UsageError(
            f"--rollout-timeout must be a number of seconds >= 0 (0: scaled to the rollout), got {args.rollout_timeout}"
        )
    if args.upload_model:
        raise UsageError(
            "--upload-model (CleanRL's upload to the Hugging Face Hub) is not supported here: save the model with "
            "--save-model and upload runs/<run-name>/<exp-name>.model with `huggingface-cli upload`"
        )
    if args.capture_video:
        require_moviepy()
    if args.checkpoint_every < 0 or args.seed_processes < 0:
        raise UsageError("--checkpoint-every and --seed-processes must be >= 0")
    if args.resume and args.eval_checkpoint:
        raise UsageError("--resume and --eval-checkpoint do not fit together: evaluate or train, not both")


def box_spaces(env_id: str, env: gym.Env) -> tuple[int, int]:
    """(obs_dim, action_dim) of an env with a flat Box observation and Box actions, or a UsageError."""
    observation_space, action_space = env.observation_space, env.action_space
    if not isinstance(action_space, gym.spaces.Box) or len(action_space.shape) != 1:
        raise UsageError(f"{env_id} has a {action_space} action space; {PROG} needs a continuous (Box) one")
    if not isinstance(observation_space, gym.spaces.Box) or len(observation_space.shape) != 1:
        raise UsageError(f"{env_id} has observation space {observation_space}; a Box, Dict or Tuple is needed")
    return observation_space.shape[0], action_space.shape[0]


def require_moviepy() -> None:
    """--capture-video writes its videos with moviepy (through gymnasium's RecordVideo): without it the first env would
    fail to build, so it is refused before the run starts."""
    try:
        importlib.import_module("moviepy.video.io.ImageSequenceClip")  # what gymnasium's RecordVideo writes with
    except Exception as e:  # noqa: BLE001 (missing, or installed but broken: either way no video can be written)
        reason = first_line(e)
        raise UsageError(f"--capture-video needs moviepy, which does not import ({reason}): pip install moviepy") from e


def require_positive(args, names: list[str]) -> None:
    """Each named flag must be > 0 (a flag left at None, meaning "default", passes)."""
    for name in names:
        if getattr(args, name) is not None and not getattr(args, name) > 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")


# ---------------------------------------------------------------------------------------------------------------------
# The end of a run and the command line
# ---------------------------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Run:
    """A run of either script: its flags, folder, sampler (ppo_continuous.py's envs or dppo_ray.py's actors), learner,
    counters and files (ppo_continuous.start_run)."""

    args: object
    run_dir: str
    sampler: object
    learner: object
    state: RunState
    monitor: Monitor


def finish_run(loop: TrainingLoop) -> int:
    """After training: the last checkpoint (the script's own `save_checkpoint`, when the loop left the state whole),
    the final model and its evaluation (with --save-model, when the run completed), summary.json (with the sampler's
    fields and what stopped the run), the closing line, and the sampler closed (not after a rollout timeout: its env
    does not answer). Returns 1 when the saved model could not be evaluated (the files and the closing line are
    written all the same), else 0."""
    run = loop.run
    if loop.keeps_state:
        loop.save_checkpoint(run)
    status, monitor, learner, state = loop.status, run.monitor, run.learner, run.state
    script = sys.modules[type(unwrapped(learner.agent)).__module__]  # the file whose Agent acts in evaluation
    evaluation = {}
    if status == "completed" and monitor.args.save_model:
        evaluation = save_final_model(monitor, learner, state, script)
    monitor.progress.close()
    stopped_by = {"error": loop.error} if loop.error else {}
    write_summary(monitor, status, learner, state, run.sampler.summary() | stopped_by | evaluation)
    monitor.writer.close()
    print(closing_line(monitor, status, state), flush=True)
    if not loop.timed_out:
        run.sampler.close()
    return 1 if "eval_error" in evaluation else 0


def model_path(args, run_dir: str) -> str:
    return os.path.join(run_dir, f"{args.exp_name}.model")


def save_final_model(monitor: Monitor, learner, state: RunState, script) -> dict:
    """Save the policy to runs/<run-name>/<exp-name>.model and evaluate it with the mean action (eval/episodic_return).
    Returns summary.json's fields of the evaluation: its mean return, their std and its number of episodes, or why it
    failed (`eval_error`)."""
    args = monitor.args
    path = model_path(args, monitor.run_dir)
    save_atomic(policy_state(learner.agent, learner.obs_rms, args, state.global_step), path)
    try:
        policy = Policy(learner.agent, learner.obs_rms, dataclasses.asdict(args), script)
        returns = evaluate(policy, args.eval_episodes, args.seed + 10**6)
    except Exception as e:  # noqa: BLE001 (an edited policy that cannot act: the run's files must still be written)
        gap = distribution_gap(e) if isinstance(e, NotImplementedError) else None
        eval_error = first_line(gap or e)
        print(f"{PROG}: error: model saved to {path}, but evaluating it failed: {eval_error}", file=sys.stderr)
        return {"eval_error": eval_error}
    for idx, episodic_return in enumerate(returns):
        monitor.writer.add_scalar("eval/episodic_return", episodic_return, idx)
    print(f"model saved to {path}; eval return {returns.mean():.2f} ± {returns.std():.2f}")
    return {
        "eval_mean_return": float(returns.mean()),
        "eval_std_return": float(returns.std()),
        "eval_episodes": len(returns),
    }


def write_summary(monitor: Monitor, status: str, learner, state: RunState, extra: dict) -> None:
    """summary.json: how the run ended, its flags, its last statistics, its counters, `extra` (a script's fields and
    the --save-model evaluation's) and the versions of torch, gymnasium and MuJoCo."""
    last_stats = {key: values[-1] for key, values in monitor.history.items() if values}
    summary = {
        "status": status,
        "hyperparameters": dataclasses.asdict(monitor.args),
        "env_steps": state.global_step,
        "wall_time_seconds": round(monitor.wall_time(), 2),
        "final_entropy": last_stats.get("entropy"),
        "final_explained_variance": last_stats.get("explained_variance"),
        "final_approx_kl": last_stats.get("approx_kl"),
        "mean_return_last_episodes": monitor.mean_return(),
        "num_last_episodes": len(state.recent_returns),
        **state.counters,
        "fast_paths": learner.fast.used,
        "fast_path_switches": learner.fast.switches,
        **extra,
        "torch_version": torch.__version__,
        "gymnasium_version": gym.__version__,
        "mujoco_version": package_version("mujoco"),  # None without MuJoCo; read without importing it
    }
    with open(os.path.join(monitor.run_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)


def closing_line(monitor: Monitor, status: str, state: RunState) -> str:
    """One line on stdout (--quiet included): where the run went, how it ended and what to run next."""
    run_dir = monitor.run_dir
    line = f"{PROG}: {status} at step {state.global_step}; run folder {run_dir}"
    if state.recent_returns:
        line += f"; mean return of the last {len(state.recent_returns)} episodes {monitor.mean_return():.2f}"
    line += "; curves: tensorboard --logdir runs"
    checkpoint = os.path.join(run_dir, "checkpoint.pt")
    if status in ("interrupted", "failed") and os.path.isfile(checkpoint):
        line += f"; continue with: python {PROG} --resume {checkpoint}"
    elif status in ("interrupted", "failed"):  # a second signal before the first checkpoint: nothing to resume from
        line += "; no checkpoint was saved: start it afresh with the same command and --overwrite"
    elif status == "completed" and monitor.args.save_model:
        line += f"; evaluate with: python {PROG} --eval-checkpoint {model_path(monitor.args, run_dir)}"
    return line


def cli(args_type: type, validate, train, script, machine_flags: set[str] = MACHINE_FLAGS, refused=None) -> int:
    """Parse the flags, then train or evaluate; bad input is one line on stderr and exit status 2. `script`: the
    module whose Agent a checkpoint to evaluate was trained with. `machine_flags`: the flags of the machine, which a
    resumed run may change (checkpoints.MACHINE_FLAGS and a script's own ways of using the machine). `refused`:
    {flag: why} for flags of a CleanRL command line that the script has no field for, each refused in one line
    rather than by the parser's usage message."""
    take_back_stop_signals()  # else Ctrl-C while the run starts could go unheard (the training loop takes them after)
    for flag in command_flags(sys.argv[1:]):
        if flag in (refused or {}):
            print(f"{PROG}: error: {flag} {refused[flag]}", file=sys.stderr)
            return 2
    argv = optional_switches(sys.argv[1:], args_type)  # --compile, --no-compile; run.json records sys.argv as given
    args = tyro.cli(args_type, args=argv)
    sys.path.insert(0, os.getcwd())  # `--env-id module:EnvId` finds the module in the working directory, as python -m
    try:
        if args.resume and not args.eval_checkpoint:  # both together are refused by validate()
            args = resumed_args(args_type, args, machine_flags, argv)
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
    except KeyboardInterrupt:  # Ctrl-C outside the training loop, which takes its own signals: while the run starts
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except (DistributionGap, NotImplementedError) as e:
        gap = distribution_gap(e) if isinstance(e, NotImplementedError) else e
        if gap is None:
            raise
        print(f"{PROG}: error: {gap}", file=sys.stderr)
        return 1
