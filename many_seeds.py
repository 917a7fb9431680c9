"""--num-seeds N: N single runs of the training script, each a process of its own.

    python ppo_continuous.py --num-seeds 4                          # seeds 1..4 in runs/<run-name>__1 .. __4
    python my_ppo.py --num-seeds 4                                  # a researcher's copy launches itself
    python ppo_continuous.py --num-seeds 8 --ray-address auto       # over a Ray cluster; the folders come home
    python ppo_continuous.py --resume runs/<run-name>__1/checkpoint.pt --num-seeds 4     # every seed carries on

Seed k is the command `python <script> <the same flags> --seed=k --run-name=<run-name>__k`, which its run.json
records: the script as it was invoked (an edited copy launches itself), in a process of its own, so each seed is its
single run bit for bit, whatever state the code keeps (module globals, caches, random generators, torch's settings).
At most --seed-processes run at once (default: the cores this process may use); the next starts as one ends.

While they run: one progress line for all seeds, each seed's lines on stderr behind "seed k: ", each seed's whole
output in its folder (output.log). At the end: a table of every seed's final return, their mean, std and Student's t
interval, and the TensorBoard command that overlays them. Ctrl-C or SIGTERM is passed on once to every running seed
(each saves a checkpoint after its iteration) and no new seed starts; a second signal is passed on too (they quit at
once). A seed that fails stops alone with its line; the closing lines and the exit status say which.

With --ray-address, each seed is a Ray task on the cluster's nodes (run_on_cluster, the way benchmarks/learning.py
runs its sweeps: one way to launch runs in the repository), its folder packed on the node and unpacked here.

This module imports only the standard library (tqdm and ray where they are used), and the script calls it before its
own imports: the launcher never imports torch.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import glob
import hashlib
import importlib.metadata
import io
import json
import math
import os
import platform
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field

# The launcher's own flags: what makes the seeds differ, and how they are run. Every other flag goes to every seed.
LAUNCHER_FLAGS = ("--num-seeds", "--seed-processes", "--ray-address", "--seed", "--run-name", "--resume")
# The file descriptor a seed writes its progress to (Monitor, in run_management.py), as "<step> <total> <return>".
PROGRESS_FD = "PPO_PROGRESS_FD"


# ---------------------------------------------------------------------------------------------------------------------
# What a run ran on, in run.json: read without torch, by the launcher and by benchmarks/learning.py's sweeps, which
# compare runs by it
# ---------------------------------------------------------------------------------------------------------------------
# The packages whose versions are part of a run's identity: two runs compare only if they trained on the same ones.
IDENTITY_PACKAGES = ("torch", "gymnasium", "mujoco", "numpy", "ray")


def package_version(name: str) -> str | None:
    """The installed version of a package, None where it is not installed (read from its metadata, not imported)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    """The CPU's model name as the OS reports it, for the reader of a result (not part of a run's identity)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def run_environment() -> dict:
    """What a run ran on: the Python and the IDENTITY_PACKAGES' versions (which decide whether two runs compare), and
    the CPU model and core count (for the reader)."""
    return {
        "python": platform.python_version(),
        "packages": {name: package_version(name) for name in IDENTITY_PACKAGES},
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
    }


def file_sha256(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


class LaunchError(Exception):
    """Flags or folders that do not fit: one line, exit status 2."""


class SturdyStream:
    """A text stream whose reader may go away (a pipe closed by `| head`, a launcher that was killed): a write or flush
    that fails sends the rest to os.devnull, so that the process carries on (a seed to its checkpoint)."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except OSError:
            self.stream = open(os.devnull, "w")  # noqa: SIM115 (for the rest of the process)
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except OSError:
            self.stream = open(os.devnull, "w")  # noqa: SIM115

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def sturdy_console() -> None:
    """sys.stdout and sys.stderr as SturdyStreams."""
    if not isinstance(sys.stdout, SturdyStream):
        sys.stdout = SturdyStream(sys.stdout)
    if not isinstance(sys.stderr, SturdyStream):
        sys.stderr = SturdyStream(sys.stderr)


# ---------------------------------------------------------------------------------------------------------------------
# The command line: which seeds, and each one's flags
# ---------------------------------------------------------------------------------------------------------------------
def flag_name(item: str) -> str:
    return item.partition("=")[0].replace("_", "-")


def flag_value(argv: list[str], name: str) -> str | None:
    """The value of the last `name VALUE` or `name=VALUE` in argv (underscores or dashes), else None."""
    value = None
    for i, item in enumerate(argv):
        if flag_name(item) == name:
            if "=" in item:
                value = item.partition("=")[2]
            elif i + 1 < len(argv):
                value = argv[i + 1]
    return value


def without_launcher_flags(argv: list[str]) -> list[str]:
    """argv less the launcher's flags and their values."""
    kept, skip = [], False
    for item in argv:
        if skip:
            skip = False
            continue
        if flag_name(item) in LAUNCHER_FLAGS:
            skip = "=" not in item  # its value is the next item
            continue
        kept.append(item)
    return kept


def asked(argv: list[str]) -> bool:
    """Whether this command line asks for several seeds (and not for --help)."""
    if "-h" in argv or "--help" in argv:
        return False
    try:
        return int(flag_value(argv, "--num-seeds") or 1) > 1
    except ValueError:
        return False  # not a number: the script's own parser says so


def script_defaults(script: str) -> dict:
    """The literal defaults of the script's `Args` fields, read from its source (the launcher imports no torch)."""
    try:
        with open(script) as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError):
        return {}
    defaults = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Args":
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.value is not None:
                    with contextlib.suppress(ValueError):
                        defaults[item.target.id] = ast.literal_eval(item.value)
    return defaults


def whole_number(argv: list[str], name: str, default: int, least: int) -> int:
    value = flag_value(argv, name)
    try:
        number = default if value is None else int(value)
    except ValueError:
        raise LaunchError(f"{name} takes a whole number, got {value!r}") from None
    if number < least:
        raise LaunchError(f"{name} must be >= {least}, got {number}")
    return number


@dataclass
class Seed:
    """One seed's single run: its seed, folder (runs/<run-name>__<seed>) and flags; `fresh`: its folder is removed
    before it starts (--overwrite, or a folder left without a checkpoint)."""

    seed: int
    run_dir: str
    flags: list[str]
    fresh: bool = False
    note: str = ""


def new_seeds(script: str, argv: list[str]) -> list[Seed]:
    """--num-seeds N from --seed: each seed's flags are this command's, with its own --seed and --run-name."""
    defaults = script_defaults(script)
    count = whole_number(argv, "--num-seeds", 1, 1)
    first = whole_number(argv, "--seed", int(defaults.get("seed", 1)), 0)
    flags = without_launcher_flags(argv)
    base = flag_value(argv, "--run-name")
    if not base:
        env_id = flag_value(argv, "--env-id") or str(defaults.get("env_id", "env"))
        exp_name = flag_value(argv, "--exp-name") or defaults.get("exp_name") or os.path.basename(script)[:-3]
        base = f"{env_id.replace(':', '_')}__{exp_name}__{int(time.time())}"
    overwrite = "--overwrite" in flags
    seeds = []
    for seed in range(first, first + count):
        run_dir = os.path.join("runs", f"{base}__{seed}")
        if os.path.exists(run_dir) and not overwrite:
            raise LaunchError(
                f"{run_dir} already exists: continue the seeds with --resume {os.path.join(run_dir, 'checkpoint.pt')} "
                f"--seed {first} --num-seeds {count}, or start them afresh with --overwrite"
            )
        seeds.append(Seed(seed, run_dir, [*flags, f"--seed={seed}", f"--run-name={base}__{seed}"], fresh=overwrite))
    return seeds


def resumed_seeds(argv: list[str]) -> list[Seed]:
    """--resume runs/<run-name>__<k>/checkpoint.pt --num-seeds N: seeds k .. k+N-1 of that launch (from --seed, where
    given), each from its own checkpoint; a seed that has none starts afresh with the command that seed k's run.json
    records."""
    count = whole_number(argv, "--num-seeds", 1, 1)
    path = flag_value(argv, "--resume")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise LaunchError(f"no run folder at {os.path.dirname(path) or '.'} (--resume {path})")
    try:
        with open(os.path.join(folder, "run.json")) as f:
            record = json.load(f)
        first, name = int(record["hyperparameters"]["seed"]), str(record["hyperparameters"]["run_name"])
        recorded = without_launcher_flags(list(record["command"][1:]))
    except (OSError, ValueError, KeyError, TypeError):
        raise LaunchError(
            f"{path} has no readable run.json beside it: resume that run alone, without --num-seeds, or name another "
            "seed's checkpoint (--seed gives the first seed)"
        ) from None
    if not name.endswith(f"__{first}") or not folder.endswith(os.sep + os.path.normpath(name)):
        raise LaunchError(f"{path} is not a seed of a --num-seeds run (its folder is not <run-name>__{first})")
    base, root = name[: -len(f"__{first}")], folder[: -len(os.sep + os.path.normpath(name))]
    first = whole_number(argv, "--seed", first, 0)
    flags = without_launcher_flags(argv)
    seeds = []
    for seed in range(first, first + count):
        run_name = f"{base}__{seed}"
        checkpoint = os.path.join(root, run_name, "checkpoint.pt")
        run_dir = os.path.join("runs", run_name)
        if os.path.isfile(checkpoint):
            seeds.append(Seed(seed, run_dir, [f"--resume={os.path.relpath(checkpoint)}", *flags]))
            continue
        start = [*recorded, *flags, f"--seed={seed}", f"--run-name={run_name}"]
        if os.path.isdir(os.path.join(root, run_name)):
            seeds.append(Seed(seed, run_dir, start, fresh=True, note="starts afresh: its folder has no checkpoint"))
        else:
            seeds.append(Seed(seed, run_dir, start, note="starts: it had not started"))
    return seeds


def plan(script: str, argv: list[str]) -> list[Seed]:
    """Every seed's run, or a LaunchError for flags that do not fit."""
    flags = {flag_name(item) for item in argv}
    if "--eval-checkpoint" in flags:
        raise LaunchError("--eval-checkpoint evaluates one policy: leave out --num-seeds")
    if "--resume" in flags and "--overwrite" in flags:
        raise LaunchError("--resume and --overwrite do not fit together: continue the seeds, or start them afresh")
    whole_number(argv, "--seed-processes", 0, 0)
    return resumed_seeds(argv) if flag_value(argv, "--resume") else new_seeds(script, argv)


# ---------------------------------------------------------------------------------------------------------------------
# Running the seeds on this machine
# ---------------------------------------------------------------------------------------------------------------------
def linux_prctl():
    """libc's prctl on Linux, else None."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    return ctypes.CDLL("libc.so.6", use_errno=True).prctl


def prepare_child(prctl) -> None:
    """(In a started run, before it execs.) Give it back SIGINT, SIGTERM and SIGHUP, which a parent may have blocked
    or ignored (a Ray worker blocks SIGINT; both survive exec), and on Linux ask for SIGHUP when its parent dies, so
    that a killed launcher or worker leaves no run behind: the run saves a checkpoint after its iteration and stops.
    (SIGHUP, which a run takes once however often it comes: Linux sends the signal each time it hands the orphan from
    one of the dying parent's threads to the next, and a second SIGTERM would make it quit without a checkpoint.)"""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)  # a nohup'd launcher's seeds still hear that it died
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
    if prctl is not None:
        prctl(1, signal.SIGHUP)  # 1 = PR_SET_PDEATHSIG


class SeedProcess:
    """A seed's run as a child process: its stdout and stderr read line by line into `events`, kept for its folder's
    output.log, and its progress read from a pipe of its own. In a session of its own, so that a Ctrl-C at the
    terminal reaches only the launcher, which passes it on once."""

    def __init__(self, script: str, seed: Seed, events: queue.Queue, prctl):
        self.seed, self.events = seed, events
        self.lines: list[tuple[str, str]] = []  # (kind, line), kept until the run has made its folder
        self.log = None
        self.step = self.total = 0
        self.recent_return: float | None = None
        self.signal_when_training: int | None = None  # a signal passed on once the run trains (its handler is set)
        self.started = time.time() - 1.0  # file times may be coarser than the clock
        progress_read, progress_write = os.pipe()
        env = dict(os.environ, **{PROGRESS_FD: str(progress_write)})
        self.proc = subprocess.Popen(
            [sys.executable, script, *seed.flags],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(progress_write,),
            env=env,
            text=True,
            bufsize=1,
            start_new_session=True,
            preexec_fn=lambda: prepare_child(prctl),
        )
        os.close(progress_write)
        self.readers = [
            threading.Thread(target=self.read, args=(self.proc.stdout, "out"), daemon=True),
            threading.Thread(target=self.read, args=(self.proc.stderr, "err"), daemon=True),
            threading.Thread(target=self.read, args=(os.fdopen(progress_read), "progress"), daemon=True),
        ]
        for reader in self.readers:
            reader.start()
        threading.Thread(target=self.wait, daemon=True).start()

    def read(self, stream, kind: str) -> None:
        with stream:
            for line in stream:
                self.events.put((self, kind, line.rstrip("\n")))

    def wait(self) -> None:
        self.proc.wait()
        for reader in self.readers:
            reader.join()
        self.events.put((self, "ended", self.proc.returncode))

    def keep(self, kind: str, line: str | None) -> list[tuple[str, str]]:
        """Write a line of its stdout or stderr (`kind` "out" or "err"; None: only those held) to its folder's
        output.log, and return the (kind, line) to say now: none while the run has no folder yet (they are held),
        then the held ones too."""
        if line is not None:
            self.lines.append((kind, line))
        if self.log is None:
            if not os.path.isdir(self.seed.run_dir):
                return []
            self.log = open(os.path.join(self.seed.run_dir, "output.log"), "a")  # noqa: SIM115 (closed in close())
        said, self.lines = self.lines, []
        for _, held in said:
            self.log.write(held + "\n")
        return said

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signum)

    def stop_after_iteration(self, signum: int) -> None:
        """Pass a first signal on: now if it trains (it then saves a checkpoint after its iteration), at its first
        update if it is still starting (a signal before its training loop would only kill it, with a traceback), not
        at all once it has trained its last step (it is writing its files)."""
        if self.total and self.step >= self.total:
            return
        if self.step:
            self.signal(signum)
        else:
            self.signal_when_training = signum

    def close(self) -> None:
        if self.log is not None:
            self.log.close()


@dataclass
class Ended:
    """How a seed's run ended: its exit status, and the lines it printed before it made its folder (a refused run's)."""

    seed: Seed
    returncode: int | None
    early_lines: list[str] = field(default_factory=list)
    started: float = 0.0  # when the launch started it (time.time()): older files in its folder are not its

    @functools.cached_property
    def summary(self) -> dict:
        """The seed's summary.json, read once (its run has ended): the one this launch's run wrote, or for a run that
        had nothing left to do, the one it had; {} when there is none (an earlier run's summary says nothing of a run
        that failed now)."""
        path = os.path.join(self.seed.run_dir, "summary.json")
        try:
            if self.returncode != 0 and os.path.getmtime(path) < self.started:  # 0: done now, or done before
                return {}
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}


class Launch:
    """The seeds' runs on this machine, `parallel` at a time, with one progress display and the signals passed on."""

    def __init__(self, script: str, seeds: list[Seed], parallel: int, quiet: bool):
        self.script, self.prog = script, os.path.basename(script)
        self.waiting = list(seeds)
        self.parallel, self.quiet = parallel, quiet
        self.running: list[SeedProcess] = []
        self.started: dict[int, SeedProcess] = {}
        self.ended: list[Ended] = []
        self.events: queue.Queue = queue.Queue()
        self.signum: int | None = None
        self.refused = False
        self.prctl = linux_prctl()
        self.bar = None

    def say(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)

    def on_signal(self, signum, frame) -> None:
        name = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
        again = self.signum is not None
        self.signum = signum
        for child in self.running:
            if again:
                child.signal(signum)
            else:
                child.stop_after_iteration(signum)
        if again:
            self.say(f"{self.prog}: {name} again: the running seeds quit now (their last checkpoints stay)")
        else:
            self.say(
                f"{self.prog}: {name}: each running seed saves a checkpoint after its iteration, and no new seed "
                "starts (signal again to quit now)"
            )

    def run(self) -> list[Ended]:
        from tqdm import tqdm

        handlers = {signum: signal.signal(signum, self.on_signal) for signum in (signal.SIGINT, signal.SIGTERM)}
        self.bar = tqdm(total=0, disable=self.quiet, unit="step", unit_scale=True, dynamic_ncols=True, mininterval=1)
        try:
            while True:
                while self.waiting and len(self.running) < self.parallel and self.signum is None and not self.refused:
                    seed = self.waiting.pop(0)
                    if seed.note:
                        self.say(f"{self.prog}: seed {seed.seed} {seed.note}")
                    self.running.append(SeedProcess(self.script, seed, self.events, self.prctl))
                    self.started[seed.seed] = self.running[-1]
                    if self.signum is not None:  # the signal came while it was being started
                        self.running[-1].stop_after_iteration(self.signum)
                if not self.running:
                    break
                try:
                    self.handle(*self.events.get(timeout=1.0))
                except queue.Empty:
                    continue
        finally:
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
            self.bar.close()
            self.bar = None
        return self.ended

    def handle(self, child: SeedProcess, kind: str, payload) -> None:
        prefix = f"seed {child.seed.seed}: "
        if kind == "progress":
            with contextlib.suppress(ValueError):
                step, total, recent = payload.split()
                child.step, child.total = int(step), int(total)
                child.recent_return = None if recent == "nan" else float(recent)
                if child.signal_when_training is not None:
                    child.signal(child.signal_when_training)
                    child.signal_when_training = None
                self.show_progress()
        elif kind in ("out", "err"):
            # lines printed before the run made its folder are said when it does, or when it ends
            for held_kind, line in child.keep(kind, payload):
                self.echo(prefix + line, held_kind)
        else:  # ended
            self.running.remove(child)
            early = []
            if payload == 2 and not os.path.isdir(child.seed.run_dir):
                early = [line for _, line in child.lines]  # refused flags are every seed's: said once, none more starts
                self.refused = True
            else:
                for held_kind, line in child.keep("err", None) if os.path.isdir(child.seed.run_dir) else child.lines:
                    self.echo(prefix + line, held_kind)
            child.close()
            self.ended.append(Ended(child.seed, payload, early, child.started))
            self.show_progress()

    def echo(self, line: str, kind: str) -> None:
        if kind == "out":
            if self.bar is not None and not self.bar.disable:
                self.bar.write(line)
            else:
                print(line, flush=True)
        else:
            self.say(line)

    def show_progress(self) -> None:
        """The bar: every seed's steps against every seed's total (each seed's, once it has said it), and the latest
        return of each seed running."""
        if self.bar is None or self.bar.disable:
            return
        children = [*self.started.values()]
        count = len(children) + len(self.waiting)
        self.bar.total = max(c.total for c in children) * count or None
        self.bar.n = sum(c.step for c in children)
        returns = " ".join(
            f"{c.seed.seed}:{'n/a' if c.recent_return is None else f'{c.recent_return:.0f}'}" for c in self.running
        )
        self.bar.set_postfix_str(f"{len(self.ended)} of {count} seeds done; returns {returns}", refresh=False)
        self.bar.refresh()


# ---------------------------------------------------------------------------------------------------------------------
# The end: every seed's final return, with an interval honest for few seeds
# ---------------------------------------------------------------------------------------------------------------------
# Student's t: the 0.975 quantile for 1..30 degrees of freedom (beyond, t_quantile's expansion is within 1e-3)
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131)
T_975 += (2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t with `df` degrees of freedom (the half-width factor of a 95% interval)."""
    if df <= len(T_975):
        return T_975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def mean_std_interval(values: list[float]) -> tuple[float, float | None, tuple[float, float] | None]:
    """The mean, the sample std (n - 1) and the 95% t-interval of the mean; no std or interval for one value."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None, None
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile_975(n - 1) * std / math.sqrt(n)
    return mean, std, (mean - half, mean + half)


def seed_status(ended: Ended) -> str:
    """How the seed's run ended, as its summary.json says (a signal that came as it was closing does not undo a
    completed run); else by its exit status."""
    status = ended.summary.get("status")
    if status:
        return status
    if ended.returncode is None:
        return "lost"
    if ended.returncode < 0 or ended.returncode in (130, 143):
        return "stopped by a signal"
    return "completed" if ended.returncode == 0 else f"exit {ended.returncode}"


def report(prog: str, ended: list[Ended], not_started: list[Seed], first: int) -> list[str]:
    """The closing lines (stdout): a row for each seed, the statistics of the completed seeds' final returns, the
    TensorBoard command and, when a seed did not complete, which, and how to continue them all."""
    rows = sorted(ended, key=lambda e: e.seed.seed)
    count = len(rows) + len(not_started)
    lines = [f"{prog}: {count} seeds", f"{'seed':>6}  {'status':<20}{'steps':>10}  final return"]
    finals = []
    for row in rows:
        summary, status = row.summary, seed_status(row)
        final = summary.get("mean_return_last_episodes")
        if final is not None and status == "completed":
            finals.append(float(final))
        shown = "n/a" if final is None else f"{final:.2f}"
        lines.append(f"{row.seed.seed:>6}  {status:<20}{summary.get('env_steps', 0):>10}  {shown}")
    for seed in not_started:
        lines.append(f"{seed.seed:>6}  {'not started':<20}{0:>10}  n/a")
    if finals:
        mean, std, interval = mean_std_interval(finals)
        line = f"final return (each seed's mean over its last episodes): mean {mean:.2f} over {len(finals)} "
        line += "completed seeds" if len(finals) < len(rows) + len(not_started) else "seeds"
        if std is not None:
            line += f", std {std:.2f}, 95% t-interval [{interval[0]:.2f}, {interval[1]:.2f}]"
        lines.append(line)
    folders = [row.seed for row in rows if os.path.isdir(row.seed.run_dir)]
    if folders:
        spec = ",".join(f"seed{s.seed}:{s.run_dir}" for s in folders)
        lines.append(f"curves: tensorboard --logdir_spec {spec}")
    unfinished = [row.seed.seed for row in rows if seed_status(row) != "completed"] + [s.seed for s in not_started]
    if unfinished:
        which = ", ".join(str(seed) for seed in sorted(unfinished))
        recorded = [row.seed for row in rows if os.path.isfile(os.path.join(row.seed.run_dir, "run.json"))]
        if recorded:
            checkpoint = os.path.join(recorded[0].run_dir, "checkpoint.pt")
            again = f"python {prog} --resume {checkpoint} --seed {first} --num-seeds {count}"
            lines.append(f"not completed: seed {which}; continue every seed with: {again}")
        else:
            lines.append(f"not completed: seed {which}; none of them started training: run the same command again")
    return lines


def exit_status(ended: list[Ended], not_started: list[Seed], signum: int | None) -> int:
    if signum is not None:
        return 128 + signum  # as a single run's: 130 for Ctrl-C, 143 for SIGTERM
    if ended and all(e.returncode == 2 and e.early_lines for e in ended):
        return 2
    return 1 if not_started or any(seed_status(e) != "completed" for e in ended) else 0


def usable_cores() -> int:
    """The cores this process may use (its affinity, where the OS has one)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity else os.cpu_count() or 1


def launch(script: str, argv: list[str]) -> int:
    """--num-seeds N: every seed's single run, here or on a Ray cluster; the closing table; the exit status (0 when
    every seed completed, 1 when one failed, 2 for flags refused, 130 or 143 after Ctrl-C or SIGTERM)."""
    sturdy_console()  # a closed stdout (`| head`) must not stop the seeds
    script = os.path.abspath(script)
    prog = os.path.basename(script)
    try:
        seeds = plan(script, argv)
        address = flag_value(argv, "--ray-address")
        parallel = whole_number(argv, "--seed-processes", 0, 0) or usable_cores()
    except LaunchError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    quiet = "--quiet" in argv
    for seed in seeds:  # --overwrite, or a folder without a checkpoint: nothing of it may mix with the new runs
        if seed.fresh:
            shutil.rmtree(seed.run_dir, ignore_errors=True)
    if address:
        try:
            ended, not_started, signum = seeds_on_cluster(script, seeds, address)
        except LaunchError as e:
            print(f"{prog}: error: {e}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:  # a second signal cancelled the seeds in flight
            print(f"{prog}: cancelled; the seeds that had ended are in runs/", file=sys.stderr)
            return 130
    else:
        run = Launch(script, seeds, parallel, quiet)
        ended, signum = run.run(), run.signum
        not_started = run.waiting
    refusals = [e for e in ended if e.early_lines]
    said = set()
    for refused in refusals:  # the same refusal of every seed is said once
        text = "\n".join(refused.early_lines)
        if text not in said:
            said.add(text)
            print(text, file=sys.stderr)
    if ended and len(refusals) == len(ended):
        return 2
    print("\n".join(report(prog, ended, not_started, seeds[0].seed)), flush=True)
    return exit_status(ended, not_started, signum)


# ---------------------------------------------------------------------------------------------------------------------
# On a Ray cluster: every run a Ray task, its folder packed on the node and unpacked here
# ---------------------------------------------------------------------------------------------------------------------
def seeds_on_cluster(script: str, seeds: list[Seed], address: str) -> tuple[list[Ended], list[Seed], int | None]:
    """Every seed a task of run_on_cluster, from the script's folder (which Ray uploads to the nodes); their folders
    come back into this runs folder. Returns how each seed that ran ended, the seeds that never started (a signal came
    first), and that signal."""
    repo = os.path.dirname(script)
    jobs = []
    for seed in seeds:
        run_name = os.path.relpath(seed.run_dir, "runs")
        resume = [f for f in seed.flags if flag_name(f) == "--resume"]
        folder_tar = None
        flags = list(seed.flags)
        if resume:  # the node resumes from the folder sent with it
            flags = [f"--resume={os.path.join('runs', run_name, 'checkpoint.pt')}"]
            flags += [f for f in seed.flags if flag_name(f) != "--resume"]
            folder_tar = pack_folder(seed.run_dir)
        argv = [os.path.basename(script), *flags]
        jobs.append(
            {
                "label": f"seed {seed.seed}",
                "run_name": run_name,
                "argv": {"resume" if resume else "new": argv, "new" if resume else "resume": None},
                "folder_tar": folder_tar,
                "storage": None,
                "python": None,
                "cpus": 1,
            }
        )
    started = time.time() - 1.0
    statuses, signum = run_on_cluster(jobs, address, os.path.abspath("runs"), repo, describe=final_return)
    ended = [
        Ended(seed, statuses[f"seed {seed.seed}"], started=started) for seed in seeds if f"seed {seed.seed}" in statuses
    ]
    return ended, [seed for seed in seeds if f"seed {seed.seed}" not in statuses], signum


def final_return(folder: str) -> str:
    try:
        with open(os.path.join(folder, "summary.json")) as f:
            final = json.load(f).get("mean_return_last_episodes")
    except (OSError, ValueError):
        final = None
    return "no episode finished" if final is None else f"return {final:.1f}"


# What a job's working_dir leaves behind: Ray uploads the rest of the script's folder to every node.
UPLOAD_EXCLUDES = [".git", "runs", ".venv", "benchmarks/.venv-*", "benchmarks/results", "**/__pycache__", "*.pt"]


def ray_address_answers(address: str) -> bool:
    """Whether something listens at a Ray `host:port` (or `ray://host:port`): ray.init retries an address with no Ray
    behind it for minutes, a plain TCP probe answers at once."""
    host, _, port = address.split("://")[-1].rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except (OSError, ValueError):
        return False
    return True


def run_on_node(job: dict) -> dict:
    """(In a Ray worker.) Train one run on this node and say where it ran, how it ended and, unless its folder is in
    the shared --storage, return that folder as a tar.gz. The run resumes from a checkpoint if its folder has one:
    the half-finished folder the head sent, or, with --storage, what an attempt on a lost node left. A run whose
    head was stopped before it started returns at once, with no exit status."""
    import ray

    node = {
        "node_id": ray.get_runtime_context().get_node_id(),
        "ip": ray.util.get_node_ip_address(),
        "host": socket.gethostname(),
    }
    print(f"{job['label']} running on {node['host']} (node {node['node_id'][:8]})", flush=True)
    take_back_sigint()
    repo = os.getcwd()  # the job's working_dir: this repo, as uploaded
    if job["storage"] and not os.path.isdir(os.path.join(job["storage"], "runs")):
        message = f"--storage {job['storage']} is not there on {node['host']}: mount it on every node"
        return {**node, "returncode": 2, "stderr": message, "seconds": 0.0, "tar": None}
    if job.get("stop") is not None and asked_to_stop(job["stop"]):
        return {**node, "returncode": None, "stderr": "", "seconds": 0.0, "tar": None}  # stopped before it started
    remove_orphaned_work_folders()
    work = job["storage"] or tempfile.mkdtemp(prefix=f"{WORK_PREFIX}{os.getpid()}_")
    folder = os.path.join(work, "runs", job["run_name"])
    lease = Lease(folder + ".lease", node["host"]) if job["storage"] else None
    try:
        if lease is not None:
            lease.take()  # one attempt at a time writes a run folder in the shared storage
        if job["folder_tar"] is not None:
            unpack_folder(job["folder_tar"], folder)
        if os.path.isfile(os.path.join(folder, "checkpoint.pt")) and job["argv"]["resume"]:
            argv = job["argv"]["resume"]
        else:
            shutil.rmtree(folder, ignore_errors=True)  # a folder without a checkpoint: the run starts afresh
            argv = job["argv"]["new"]
        os.makedirs(os.path.join(work, "runs"), exist_ok=True)
        python = job["python"] or sys.executable
        returncode, stderr, seconds = run_trainer(python, repo, argv, work, lease, job.get("stop"), folder)
        if os.path.isdir(folder):  # where it ran, for the head and the tests
            with open(os.path.join(folder, "node.json"), "w") as f:
                json.dump({**node, "seconds": round(seconds, 1)}, f)
        folder_tar = None if job["storage"] or not os.path.isdir(folder) else pack_folder(folder)
        return {**node, "returncode": returncode, "stderr": stderr[-2000:], "seconds": seconds, "tar": folder_tar}
    except LeaseHeld as e:
        return {**node, "returncode": 1, "stderr": str(e), "seconds": 0.0, "tar": None}
    finally:
        if lease is not None:
            lease.drop()
        if not job["storage"]:
            shutil.rmtree(work, ignore_errors=True)


def take_back_sigint() -> None:
    """(In a Ray worker.) A Ray started with SIGINT ignored (`ray start` from a background job or nohup) passes that on
    to its workers, and ray.cancel's KeyboardInterrupt, which arrives as a SIGINT, is then dropped: the trainer would
    never hear of a cancelled sweep. Take the signal back while the task runs (tasks run in the worker's main
    thread)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        with contextlib.suppress(ValueError):  # not the main thread: nothing to take back there
            signal.signal(signal.SIGINT, signal.default_int_handler)


WORK_PREFIX = "learning_run_"  # a run's temporary folder on a node: learning_run_<pid of its Ray worker>_<random>


def remove_orphaned_work_folders() -> None:
    """Delete the temporary run folders of Ray workers that no longer exist on this node: a worker that was killed
    (a cancelled or lost task, an out-of-memory kill) never reached its own clean-up."""
    for path in glob.glob(os.path.join(tempfile.gettempdir(), f"{WORK_PREFIX}*_*")):
        pid = os.path.basename(path)[len(WORK_PREFIX) :].split("_")[0]
        if pid.isdigit() and not process_exists(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


class LeaseHeld(Exception):
    """Another attempt of the same run holds its folder's lease and keeps renewing it."""


class Lease:
    """The right to write one run folder under --storage, held by one attempt at a time: a file beside the folder
    naming its holder and when it last renewed it. Ray runs a task again when it believes its node lost, and the old
    attempt may still be alive (a network partition): the new one waits until the lease is stale (not renewed for
    LEASE_SECONDS), takes it, and waits one more renewal period before writing, so that an old holder that comes back
    finds the lease gone and kills its trainer without letting it write. Staleness compares the holder's clock with
    the taker's: nodes are assumed to keep time (NTP) to well under LEASE_SECONDS."""

    def __init__(self, path: str, host: str):
        self.path = path
        self.owner = f"{host}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        self.renewed = 0.0

    def read(self) -> dict | None:
        try:
            with open(self.path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def write(self) -> None:
        tmp = f"{self.path}.{self.owner.rsplit(':', 1)[-1]}.tmp"
        with open(tmp, "w") as f:
            json.dump({"owner": self.owner, "renewed": time.time()}, f)
        os.replace(tmp, self.path)
        self.renewed = time.monotonic()

    def take(self) -> None:
        seconds = lease_seconds()
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        deadline = time.monotonic() + 3 * seconds
        while True:
            held = self.read()
            if held is None and not os.path.exists(self.path):
                try:  # O_EXCL: of two attempts creating the lease at once, one wins
                    os.close(os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                    self.write()
                    return
                except FileExistsError:
                    continue
            if held is None:  # being written by its creator, or left half-written by one that died
                stale = time.time() - os.path.getmtime(self.path) > seconds if os.path.exists(self.path) else True
            else:
                stale = time.time() - float(held.get("renewed", 0)) > seconds
            if stale:
                self.write()  # stale: its holder stopped renewing it
                time.sleep(seconds / 4 + 1)  # a holder that was only cut off sees this at its next renewal and stops
                if (self.read() or {}).get("owner") == self.owner:
                    self.write()
                    return
                continue
            if time.monotonic() > deadline:
                raise LeaseHeld(f"{os.path.basename(self.path)} is held by {held['owner']}, who keeps renewing it")
            time.sleep(min(5.0, seconds / 4))

    def keep(self) -> bool:
        """Renew the lease when a quarter of its life has passed; False once another attempt has taken it."""
        if time.monotonic() - self.renewed < lease_seconds() / 4:
            return True
        if (self.read() or {}).get("owner") != self.owner:
            return False
        self.write()
        return True

    def drop(self) -> None:
        if (self.read() or {}).get("owner") == self.owner:
            with contextlib.suppress(OSError):
                os.remove(self.path)


def lease_seconds() -> float:
    """How long a lease lives without renewal ($LEARNING_LEASE_SECONDS, for tests that lose a node on purpose)."""
    return float(os.environ.get("LEARNING_LEASE_SECONDS", "60"))


def run_trainer(
    python: str, repo: str, argv: list[str], cwd: str, lease=None, stop=None, folder: str | None = None
) -> tuple[int, str, float]:
    """Run `python repo/argv[0] argv[1:]` in cwd; (exit status, its output, seconds). The trainer gets SIGINT once the
    head sets `stop` (a StopFlag: it saves a checkpoint, and its folder still goes home) or cancels the task, and
    SIGHUP when this worker dies (it saves a checkpoint and stops). With a `lease` (--storage), it is renewed while
    the trainer runs; once another attempt has taken it, the trainer is killed at once, before it writes again. Its
    output (stdout and stderr) is added to `folder`/output.log when it has made that folder."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [repo, os.environ.get("PYTHONPATH")] if p))
    env.setdefault("MPLBACKEND", "Agg")
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as output:  # a file, not a pipe: the wait below never reads it
        parent_death_signal = linux_prctl()  # looked up here: after fork, the child only calls it
        proc = subprocess.Popen(
            [python, os.path.join(repo, argv[0]), *argv[1:]],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=lambda: prepare_child(parent_death_signal),
        )
        stopping = False
        try:
            while True:  # short waits: ray.cancel's KeyboardInterrupt arrives between them, not inside a long one
                try:
                    proc.wait(timeout=1)
                    break
                except subprocess.TimeoutExpired:
                    if stop is not None and not stopping and asked_to_stop(stop):
                        stopping = True
                        proc.send_signal(signal.SIGINT)  # it saves a checkpoint after its iteration
                    if lease is not None and not lease.keep():
                        proc.kill()
                        proc.wait()
                        message = "another attempt of this run took over its folder (this one was cut off too long)"
                        return 1, message, time.perf_counter() - start
        except BaseException:  # the sweep was cancelled: the trainer saves a checkpoint, then stops
            proc.send_signal(signal.SIGINT)
            proc.wait()
            raise
        output.seek(0)
        text = output.read()
        if folder is not None and os.path.isdir(folder):
            with open(os.path.join(folder, "output.log"), "a") as log:
                log.write(text)
        return proc.returncode, text, time.perf_counter() - start


class StopFlag:
    """(A Ray actor of the head's.) Set once the head is asked to stop: each run's task then stops its trainer, which
    saves a checkpoint, and returns its folder as usual."""

    def __init__(self):
        self.stopped = False

    def set(self) -> None:
        self.stopped = True

    def is_set(self) -> bool:
        return self.stopped


def asked_to_stop(stop) -> bool:
    """Whether the head set its StopFlag. (An answer that does not come says no: the flag lives on the head's node,
    and a head that is gone takes its job's tasks with it.)"""
    import ray

    try:
        return bool(ray.get(stop.is_set.remote(), timeout=30))
    except ray.exceptions.RayError:
        return False


def pack_folder(folder: str) -> bytes:
    """The run folder as tar.gz bytes, its contents at the archive's root."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(folder, arcname=".")
    return buffer.getvalue()


def unpack_folder(data: bytes, folder: str) -> None:
    """Replace `folder` with the contents of pack_folder's bytes. They are unpacked beside it first, and the old folder
    goes only once the new one is whole: an archive that fails to unpack leaves the old folder as it was."""
    parent = os.path.dirname(os.path.abspath(folder))
    os.makedirs(parent, exist_ok=True)
    unpacked = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(folder)}.new-")
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            extract_safely(tar, unpacked)
    except BaseException:
        shutil.rmtree(unpacked, ignore_errors=True)
        raise
    old = None
    if os.path.exists(folder):
        old = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(folder)}.old-")
        os.rename(folder, os.path.join(old, "folder"))
    os.rename(unpacked, folder)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def extract_safely(tar: tarfile.TarFile, folder: str) -> None:
    """Extract only plain files and folders inside `folder`: tarfile's "data" filter where this Python has it
    (3.10.12, 3.11.4 and later), else the same check written out."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(folder, filter="data")
        return
    root = os.path.realpath(folder)
    for member in tar.getmembers():
        target = os.path.realpath(os.path.join(folder, member.name))
        if not (member.isfile() or member.isdir()) or os.path.commonpath([root, target]) != root:
            raise ValueError(f"refusing to unpack {member.name!r}: not a plain file or folder inside the run folder")
    tar.extractall(folder)


def run_on_cluster(
    jobs: list[dict], address: str, runs_root: str, working_dir: str, max_retries: int = 3, describe=None, prog=None
) -> tuple[dict[str, int | None], int | None]:
    """Send every job to the cluster at `address` as a Ray task (run_on_node), with `working_dir` uploaded to every
    node, and unpack each finished run's folder into `runs_root`. A bar counts the runs; each finished one prints a
    line with the node it ran on and `describe(folder)` (its final return). Returns each job's exit status by label
    (None for a task that failed; the others still finish), and the signal that stopped them (None when none did).
    Ctrl-C or SIGTERM stops every run in flight after its iteration, with a checkpoint, and brings its folder home as
    a finished one's; no new run starts. A second signal cancels them (their checkpoints stay only in --storage)."""
    if not jobs:
        return {}, None
    prog = prog or os.path.basename(sys.argv[0])
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")  # read when ray is imported: each run's "running on" line is kept
    import ray
    import ray.cloudpickle
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    excludes = list(UPLOAD_EXCLUDES)
    runs_root = os.path.abspath(runs_root)
    if runs_root.startswith(working_dir + os.sep):
        excludes.append(os.path.relpath(runs_root, working_dir))
    if address not in ("auto", "local") and not ray_address_answers(address):
        raise LaunchError(f"cannot reach Ray at --ray-address {address}: nothing answers there")
    try:
        ray.init(
            address=address,
            runtime_env={"working_dir": working_dir, "excludes": excludes},
            logging_level="ERROR",
            log_to_driver=True,
        )
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise LaunchError(f"cannot reach Ray at --ray-address {address}: {str(e).splitlines()[0]}") from None
    # Workers may not import this module by name (a copy's folder without it): send its functions by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        total = ray.cluster_resources().get("CPU", 0)
        largest = max((node["Resources"].get("CPU", 0) for node in ray.nodes() if node["Alive"]), default=0)
        too_big = [job for job in jobs if job["cpus"] > largest]
        if too_big:  # a run needs its CPUs on one node; Ray would wait for such a node forever
            raise LaunchError(
                f"{too_big[0]['label']} needs {too_big[0]['cpus']:g} CPUs on one node; the largest node has {largest:g}"
            )
        print(f"{prog}: {len(jobs)} runs to the cluster ({total:g} CPUs)", file=sys.stderr, flush=True)
        # on the head's own node: a node lost mid-run must not take the flag with it
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        stop = ray.remote(num_cpus=0, scheduling_strategy=here)(StopFlag).remote()
        task = ray.remote(run_on_node)
        pending = {}
        for job in jobs:
            options = dict(num_cpus=job["cpus"], scheduling_strategy="SPREAD", max_retries=max_retries)
            pending[task.options(**options, name=job["label"]).remote({**job, "stop": stop})] = job
        return collect_runs(pending, runs_root, describe, prog, stop)
    finally:
        ray.shutdown()


def collect_runs(pending: dict, runs_root: str, describe, prog: str, stop) -> tuple[dict[str, int | None], int | None]:
    """Wait for the tasks in `pending` ({ObjectRef: job}) and unpack their run folders as they finish. The first Ctrl-C
    or SIGTERM sets `stop`: the runs in flight stop with their checkpoints and come home, those not started never
    run; a second one cancels them."""
    import ray
    from tqdm import tqdm

    total, statuses, stopped = len(pending), {}, None

    def on_signal(signum, frame):
        nonlocal stopped
        if stopped is not None:
            raise KeyboardInterrupt
        stopped = signum
        name = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
        bar.write(f"{prog}: {name}: the runs in flight stop with a checkpoint and come back (again: cancel them)")
        stop.set.remote()  # the runs not started yet return at once, unstarted

    bar = tqdm(total=total, unit="run", file=sys.stderr, dynamic_ncols=True)
    handlers = {signum: signal.signal(signum, on_signal) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        while pending:
            (ref,), _ = ray.wait(list(pending), num_returns=1)
            job = pending[ref]  # popped once its folder is unpacked: a signal before that still keeps it
            try:
                result = ray.get(ref)
            except ray.exceptions.RayError as e:
                pending.pop(ref)
                lines = [line.strip() for line in str(e).splitlines() if line.strip()]
                statuses[job["label"]] = None
                bar.write(f"{prog}: failed {job['label']}: {lines[-1] if lines else type(e).__name__}", file=sys.stderr)
                bar.update()
                continue
            pending.pop(ref)
            bar.update()
            if result["returncode"] is None:  # it never started: the head had been stopped
                continue
            bar.write(f"{prog}: {finished_line(job, result, runs_root, describe)}", file=sys.stderr)
            statuses[job["label"]] = result["returncode"]
            if result["returncode"] != 0:
                lines = [line for line in result["stderr"].splitlines() if line.strip()]
                bar.write(f"{prog}: {job['label']}: {lines[-1] if lines else ''}", file=sys.stderr)
        if stopped is not None:
            bar.write(f"{prog}: stopped; every run in flight came back with its checkpoint", file=sys.stderr)
    except KeyboardInterrupt:
        # Runs that had finished but were not collected yet are unpacked before the others are cancelled.
        finished, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0) if pending else ([], [])
        for ref in finished:
            keep_finished(ref, pending.pop(ref), runs_root, describe, prog, bar)
        for ref in pending:
            ray.cancel(ref)  # the task passes Ctrl-C to its trainer, whose checkpoint stays only in --storage
        if pending:
            ray.wait(list(pending), num_returns=len(pending), timeout=60)
        bar.write(f"{prog}: stopped; {total - len(pending)} of {total} runs ended and are kept", file=sys.stderr)
        raise
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        bar.close()
    return statuses, stopped


def keep_finished(ref, job: dict, runs_root: str, describe, prog: str, bar) -> None:
    """After Ctrl-C: unpack a run that had ended but was not collected yet, and say so."""
    import ray

    try:
        result = ray.get(ref, timeout=0)
    except ray.exceptions.RayError:
        return  # it failed: nothing to keep
    bar.write(f"{prog}: {finished_line(job, result, runs_root, describe)}", file=sys.stderr)


def finished_line(job: dict, result: dict, runs_root: str, describe) -> str:
    """Unpack a finished run's folder here and say where it ran and how it ended."""
    folder = os.path.join(runs_root, job["run_name"])
    if result["tar"] is not None:
        unpack_folder(result["tar"], folder)
    where = f"on {result['host']} (node {result['node_id'][:8]}) in {result['seconds']:.0f} s"
    if result["returncode"] != 0:
        return f"failed {job['label']} {where} (exit {result['returncode']})"
    return f"done {job['label']} {where}: {describe(folder) if describe else 'done'}"
