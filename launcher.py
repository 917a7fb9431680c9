"""--num-seeds N and --grid: single runs of the training script, each a process of its own.

    python ppo_continuous.py --num-seeds 4                          # seeds 1..4 in runs/<run-name>__1 .. __4
    python my_ppo.py --num-seeds 4                                  # a researcher's copy launches itself
    python ppo_continuous.py --num-seeds 8 --ray-address auto       # over a Ray cluster; the folders come home
    python ppo_continuous.py --resume runs/<run-name>__1/checkpoint.pt --num-seeds 4     # every seed carries on
    python my_ppo.py --num-seeds 4 --grid learning-rate=1e-4,3e-4   # runs/<run-name>__learning-rate=0.0001__1 ...

Seed k is the command `python <script> <the same flags> --seed=k --run-name=<run-name>__k`, which its run.json
records: the script as it was invoked (an edited copy launches itself), in a process of its own, so each seed is its
single run bit for bit, whatever state the code keeps (module globals, caches, random generators, torch's settings).
At most --seed-processes run at once (default: the cores this process may use); the next starts as one ends.

While they run: one progress line for all seeds (naming a seed that has gone silent: Launch.silent), each seed's
lines on stderr behind "seed k: ", each seed's whole output in its folder (output.log, written as it comes). At the
end: a table of every seed's final return, their mean, std and Student's t interval, and the TensorBoard command that
overlays them; with --grid, the same for each configuration, each against the first (Welch's interval, an exact
permutation p beside the least its seeds allow) and a plot of their curves (seed_statistics.py). Ctrl-C or SIGTERM is
passed on once to every running seed (each saves a checkpoint after its iteration) and no new seed starts; a second
signal is passed on too (they quit at once). A seed that fails stops alone with its line; the closing lines (its
status, the steps it reached, its cause) and the exit status say which.

With --ray-address, each seed is a Ray task on the cluster's nodes (ray_cluster.run_on_cluster, the way
benchmarks/learning.py runs its sweeps: one way to launch runs in the repository), its folder packed on the node and
unpacked here.

This module imports only the standard library and the repository's standard-library modules (tqdm and ray where they
are used), and the script calls it before its own imports: the launcher never imports torch.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import queue
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from command_line import (
    LaunchError,
    command_flags,
    flag_items,
    flag_value,
    grid_configurations,
    script_defaults,
    split_grid,
    whole_number,
)
from ray_cluster import ClusterError, cluster_job, run_on_cluster
from run_record import PROGRESS_FD, final_return, first_line, run_summary, sturdy_console
from seed_statistics import comparison_lines, final_return_lines, plot_curves
from stop_signals import STOP_SIGNALS, TwoStageStop, run_child_setup, signal_name

# pyproject.toml's requires-python, said in one line by either script (each imports this module first)
PYTHON_FLOOR = (3, 11, 4)
if sys.version_info < PYTHON_FLOOR:
    sys.exit(f"{os.path.basename(sys.argv[0])}: error: Python {'.'.join(map(str, PYTHON_FLOOR))} or newer is needed")

# The launcher's own flags: what makes the seeds differ, and how they are run. Every other flag goes to every seed.
LAUNCHER_FLAGS = ("--num-seeds", "--seed-processes", "--ray-address", "--seed", "--run-name", "--resume", "--grid")


# ---------------------------------------------------------------------------------------------------------------------
# Which runs: the seeds and configurations of a command line, each one's flags
# ---------------------------------------------------------------------------------------------------------------------
def without_launcher_flags(argv: list[str]) -> list[str]:
    """argv less the launcher's flags and their values (--grid's too)."""
    rest = split_grid(argv)[0]
    return [item for name, _, items in flag_items(rest) if name not in LAUNCHER_FLAGS for item in items]


def asked(argv: list[str]) -> bool:
    """Whether this command line asks for several runs: seeds or a grid of configurations (and not for --help)."""
    if "-h" in argv or "--help" in argv:
        return False
    if split_grid(argv)[1] or "--grid" in argv or flag_value(argv, "--ray-address"):
        return True  # --ray-address alone is refused here (plan), in one line
    try:
        return int(flag_value(argv, "--num-seeds") or 1) > 1
    except ValueError:
        return True  # not a whole number: said in one line (whole_number), not in the script's parser's box


def configurations(script: str, argv: list[str]) -> list[tuple[str, list[str]]]:
    """--grid's configurations of this command line (grid_configurations); [("", [])] without a grid. A flag the grid
    varies may not be given outside it too, and the launcher's own flags are not the grid's."""
    rest, axes = split_grid(argv)
    if not axes:
        if "--grid" in argv:
            raise LaunchError("--grid takes FLAG=V1,V2 [FLAG=V1,V2 ...], e.g. --grid learning-rate=1e-4,3e-4")
        return [("", [])]
    reserved = {
        flag.removeprefix("--"): "the launcher's flag; the grid varies the script's own" for flag in LAUNCHER_FLAGS
    }
    for name, _, _ in flag_items(rest):
        if name is not None:
            reserved[name.removeprefix("--").removeprefix("no-")] = (
                f"{name} is also given outside the grid: give it once"
            )
    return grid_configurations(axes, script, reserved)


@dataclass
class Seed:
    """One seed's single run: its seed, folder (runs/<run-name>__<seed>, with --grid runs/<run-name>__<config>__<seed>)
    and flags; `fresh`: its folder is removed before it starts (--overwrite, or a folder left without a checkpoint);
    `config`: its configuration's label (--grid); `command`: where the run is not `python <script> <flags>` (another
    interpreter or script, as benchmarks/learning.py's runs)."""

    seed: int
    run_dir: str
    flags: list[str]
    fresh: bool = False
    note: str = ""
    config: str = ""
    command: list[str] | None = None

    @property
    def name(self) -> str:
        """How the lines and the table name it."""
        return f"{self.config} seed {self.seed}" if self.config else f"seed {self.seed}"


def new_seeds(script: str, argv: list[str]) -> list[Seed]:
    """--num-seeds N from --seed, for each configuration of --grid: each seed's flags are this command's, with its
    configuration's and its own --seed and --run-name."""
    defaults = script_defaults(script)
    configs = configurations(script, argv)
    count = whole_number(argv, "--num-seeds", 1, 1)
    first = whole_number(argv, "--seed", int(defaults.get("seed", 1)), 0)
    flags = without_launcher_flags(argv)
    base = flag_value(argv, "--run-name")
    if not base:
        env_id = flag_value(argv, "--env-id") or str(defaults.get("env_id", "env"))
        exp_name = flag_value(argv, "--exp-name") or defaults.get("exp_name") or os.path.basename(script)[:-3]
        base = f"{env_id.replace(':', '_')}__{exp_name}__{int(time.time())}"
        if any(label.startswith("env-id=") or "__env-id=" in label for label, _ in configs):  # each label names it
            base = f"{exp_name}__{int(time.time())}"
    overwrite = "--overwrite" in flags
    seeds = []
    for label, config_flags in configs:
        for seed in range(first, first + count):
            run_name = f"{base}__{label}__{seed}" if label else f"{base}__{seed}"
            run_dir = os.path.join("runs", run_name)
            if os.path.exists(run_dir) and not overwrite:
                raise LaunchError(
                    f"{run_dir} already exists: continue the seeds with --resume "
                    f"{os.path.join(run_dir, 'checkpoint.pt')} --seed {first} --num-seeds {count}, or start them "
                    "afresh with --overwrite"
                )
            run_flags = [*flags, *config_flags, f"--seed={seed}", f"--run-name={run_name}"]
            seeds.append(Seed(seed, run_dir, run_flags, fresh=overwrite, config=label))
    return seeds


def recorded_flags(record: dict) -> list[str]:
    """The flags a seed's run.json records it ran with: its command's, then each resume's (so the latest value of a
    flag comes last, and wins: a resumed run's longer --total-timesteps, as its checkpoint holds it), less the
    launcher's flags and --overwrite (which started it afresh)."""
    commands = [record["command"], *(entry["command"] for entry in record.get("resumes", []))]
    flags = [item for command in commands for item in without_launcher_flags(list(command[1:]))]
    return [item for name, _, items in flag_items(flags) if name != "--overwrite" for item in items]


def read_record(folder: str) -> dict | None:
    """The run.json in `folder`, None where there is none or it cannot be read."""
    try:
        with open(os.path.join(folder, "run.json")) as f:
            record = json.load(f)
        recorded_flags(record)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return record


def resumed_seeds(argv: list[str]) -> list[Seed]:
    """--resume runs/<run-name>__<k>/checkpoint.pt --num-seeds N: seeds k .. k+N-1 of that launch (from --seed, where
    given), each from its own checkpoint; a seed that has none starts afresh with the command that seed k's run.json
    records. Every seed runs with the launch's flags (recorded_flags, a resumed seed's from its own run.json): those a
    checkpoint does not carry (--no-compile, --quiet, the machine's) included, then the flags given here."""
    count = whole_number(argv, "--num-seeds", 1, 1)
    path = flag_value(argv, "--resume")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise LaunchError(f"no run folder at {os.path.dirname(path) or '.'} (--resume {path})")
    record = read_record(folder)
    try:
        first, name = int(record["hyperparameters"]["seed"]), str(record["hyperparameters"]["run_name"])
    except (ValueError, KeyError, TypeError):
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
        own = read_record(os.path.dirname(checkpoint)) or record
        if os.path.isfile(checkpoint):
            resume = [f"--resume={os.path.relpath(checkpoint)}", *recorded_flags(own), *flags]
            seeds.append(Seed(seed, run_dir, resume))
            continue
        start = [*recorded_flags(record), *flags, f"--seed={seed}", f"--run-name={run_name}"]
        if os.path.isdir(os.path.join(root, run_name)):
            seeds.append(Seed(seed, run_dir, start, fresh=True, note="starts afresh: its folder has no checkpoint"))
        else:
            seeds.append(Seed(seed, run_dir, start, note="starts: it had not started"))
    return seeds


def plan(script: str, argv: list[str]) -> list[Seed]:
    """Every seed's run, or a LaunchError for flags that do not fit."""
    flags = command_flags(argv)
    if "--eval-checkpoint" in flags:
        raise LaunchError("--eval-checkpoint evaluates one policy: leave out --num-seeds and --grid")
    if "--resume" in flags and "--overwrite" in flags:
        raise LaunchError("--resume and --overwrite do not fit together: continue the seeds, or start them afresh")
    if "--resume" in flags and "--grid" in flags:
        raise LaunchError(
            "--resume continues the seeds of one configuration: --resume runs/<run-name>__<config>__<seed>/"
            "checkpoint.pt --num-seeds N, without --grid (the closing lines of the launch give each command)"
        )
    whole_number(argv, "--seed-processes", 0, 0)
    if flag_value(argv, "--ray-address") and whole_number(argv, "--num-seeds", 1, 1) == 1 and not split_grid(argv)[1]:
        raise LaunchError(
            "--ray-address sends the runs of --num-seeds or --grid to a cluster: give --num-seeds 2 or more"
        )
    return resumed_seeds(argv) if flag_value(argv, "--resume") else new_seeds(script, argv)


# ---------------------------------------------------------------------------------------------------------------------
# Running the seeds on this machine
# ---------------------------------------------------------------------------------------------------------------------
# A running seed is named on the progress line once it has sent no progress report for STALL_FACTOR times the wait the
# launcher has seen such a report take (Launch.expected_wait), and for STALL_FLOOR seconds at least: an iteration's
# time varies with the machine's load, a periodic checkpoint, an evaluation.
STALL_FLOOR = 60.0
STALL_FACTOR = 4


def duration(seconds: float) -> str:
    """45s, 2m10s, 1h05m."""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class SeedProcess:
    """A seed's run as a child process: its stdout and stderr read line by line into `events`, kept for its folder's
    output.log, and its progress read from a pipe of its own. In a session of its own, so that a Ctrl-C at the
    terminal reaches only the launcher, which passes it on once."""

    def __init__(self, script: str, seed: Seed, events: queue.Queue, cwd: str | None = None):
        self.seed, self.events, self.cwd = seed, events, cwd
        self.lines: list[tuple[str, str]] = []  # (kind, line), held until the run is past its flags
        self.log = None
        self.step = self.total = 0
        self.recent_return: float | None = None
        self.last_error = ""  # its last line on stderr, where a run that stops says why
        self.signal_when_training: int | None = None  # a signal passed on once the run trains (its handler is set)
        self.started = time.time() - 1.0  # file times may be coarser than the clock
        self.begun = time.monotonic()
        self.reports = 0
        self.first_report = self.last_report = 0.0  # time.monotonic() of its first and latest progress reports
        self.record_before = self.record_stat()  # a run past its flags writes its run.json (a resume adds an entry)
        progress_read, progress_write = os.pipe()
        env = dict(os.environ, **{PROGRESS_FD: str(progress_write)})
        self.proc = subprocess.Popen(
            seed.command or [sys.executable, script, *seed.flags],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(progress_write,),
            env=env,
            text=True,
            bufsize=1,
            start_new_session=True,
            preexec_fn=run_child_setup(),
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

    def record_stat(self) -> tuple[int, int] | None:
        try:
            stat = os.stat(os.path.join(self.run_dir, "run.json"))
        except OSError:
            return None
        return stat.st_mtime_ns, stat.st_size

    def past_its_flags(self) -> bool:
        """Whether its run got past its flags: it has written its run.json since it started (a new run's, or a resume's
        entry), or reported progress. Until then its lines are held, so that a refusal is said by the launcher, once
        for every seed that gives it (Launch.handle)."""
        if self.reports:
            return os.path.isdir(self.run_dir)
        return self.record_stat() not in (None, self.record_before)

    def reported(self) -> None:
        self.last_report = time.monotonic()
        self.first_report = self.first_report or self.last_report
        self.reports += 1

    def interval(self) -> float:
        """Its mean time between progress reports (0 before its second)."""
        return (self.last_report - self.first_report) / (self.reports - 1) if self.reports > 1 else 0.0

    def keep(self, kind: str, line: str | None, ended: bool = False) -> list[tuple[str, str]]:
        """Write a line of its stdout or stderr (`kind` "out" or "err"; None: only those held) to its folder's
        output.log, and return the (kind, line) to say now: none while the run is not past its flags (they are held),
        then the held ones too; once it has `ended`, into its folder wherever it has one."""
        if line is not None:
            self.lines.append((kind, line))
        if self.log is None:
            if not (self.past_its_flags() or (ended and os.path.isdir(self.run_dir))):
                return []
            # line-buffered, each line written as it comes: a launcher killed (SIGKILL) leaves each log whole to then
            self.log = open(os.path.join(self.run_dir, "output.log"), "a", buffering=1)  # noqa: SIM115 (close())
        said, self.lines = self.lines, []
        for _, held in said:
            self.log.write(held + "\n")
        return said

    @property
    def run_dir(self) -> str:
        return os.path.join(self.cwd or "", self.seed.run_dir)

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
    """How a seed's run ended: its exit status; `refused`: it exited with status 2 before it got past its flags, and
    `early_lines` are what it printed then (the launcher says them); `step`: the last step its progress reported;
    `last_error`: its last line on stderr."""

    seed: Seed
    returncode: int | None
    early_lines: list[str] = field(default_factory=list)
    started: float = 0.0  # when the launch started it (time.time()): older files in its folder are not its
    step: int = 0
    last_error: str = ""
    refused: bool = False

    @functools.cached_property
    def summary(self) -> dict:
        """The seed's summary.json, read once (its run has ended): the one this launch's run wrote, or for a run that
        had nothing left to do, the one it had; {} when there is none (an earlier run's summary says nothing of a run
        that failed now)."""
        path = os.path.join(self.seed.run_dir, "summary.json")
        try:
            if self.returncode != 0 and os.path.getmtime(path) < self.started:  # 0: done now, or done before
                return {}
        except OSError:
            return {}
        return run_summary(self.seed.run_dir)

    @property
    def steps(self) -> int:
        """The env steps its run reached: its summary's; else the last its progress reported (a run killed, or failed
        without a summary); else what its folder's earlier summary says (a resumed run stopped before its first report
        is where its checkpoint was)."""
        if "env_steps" in self.summary:
            return int(self.summary["env_steps"])
        return self.step or int(run_summary(self.seed.run_dir).get("env_steps") or 0)


class Launch:
    """The seeds' runs on this machine, `parallel` at a time, with one progress display and the signals passed on."""

    def __init__(self, script: str, seeds: list[Seed], parallel: int, quiet: bool, cwd: str | None = None):
        self.script, self.prog, self.cwd = script, os.path.basename(script), cwd
        self.waiting = list(seeds)
        self.parallel, self.quiet = parallel, quiet
        self.running: list[SeedProcess] = []
        self.started: dict[str, SeedProcess] = {}
        self.ended: list[Ended] = []
        self.events: queue.Queue = queue.Queue()
        self.stop = TwoStageStop(self.stop_after_iteration, self.stop_now)  # its signum: the latest signal
        self.refused: set[str] = set()  # the configurations whose flags were refused
        self.stall_floor = STALL_FLOOR
        self.bar = None

    def say(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)

    def stop_after_iteration(self, signum: int) -> None:
        for child in self.running:
            child.stop_after_iteration(signum)
        self.say(
            f"{self.prog}: {signal_name(signum)}: each run under way saves a checkpoint after its iteration, and no "
            "new run starts (signal again to quit now)"
        )

    def stop_now(self, signum: int) -> None:
        for child in self.running:
            child.signal(signum)
        self.say(f"{self.prog}: {signal_name(signum)} again: the runs under way quit now (a checkpoint saved stays)")

    def next_seed(self) -> Seed | None:
        """The waiting seed that starts now, if any: a process is free, no signal came, and its configuration's flags
        were not refused (a refusal is every seed's of that configuration; the other configurations go on)."""
        if len(self.running) >= self.parallel or self.stop.signum is not None:
            return None
        for seed in self.waiting:
            if seed.config not in self.refused:
                self.waiting.remove(seed)
                return seed
        return None

    def run(self) -> list[Ended]:
        from tqdm import tqdm

        self.bar = tqdm(total=0, disable=self.quiet, unit="step", unit_scale=True, dynamic_ncols=True, mininterval=1)
        try:
            with self.stop:
                while True:
                    while (seed := self.next_seed()) is not None:
                        if seed.note:
                            self.say(f"{self.prog}: {seed.name} {seed.note}")
                        self.running.append(SeedProcess(self.script, seed, self.events, self.cwd))
                        self.started[seed.name] = self.running[-1]
                        if self.stop.signum is not None:  # the signal came while it was being started
                            self.running[-1].stop_after_iteration(self.stop.signum)
                    if not self.running:
                        break
                    try:
                        self.handle(*self.events.get(timeout=1.0))
                    except queue.Empty:
                        self.show_progress()  # a seed that has gone silent is named even when no seed reports
        finally:
            self.bar.close()
            self.bar = None
        return self.ended

    def handle(self, child: SeedProcess, kind: str, payload) -> None:
        prefix = f"{child.seed.name}: "
        if kind == "progress":
            with contextlib.suppress(ValueError):
                step, total, recent = payload.split()
                child.step, child.total = int(step), int(total)
                child.recent_return = None if recent == "nan" else float(recent)
                child.reported()
                if child.signal_when_training is not None:
                    child.signal(child.signal_when_training)
                    child.signal_when_training = None
                for held_kind, line in child.keep("err", None):  # a run that trains is past its flags
                    self.echo(prefix + line, held_kind)
                self.show_progress()
        elif kind in ("out", "err"):
            if kind == "err" and payload.strip():
                child.last_error = payload.strip()
            # lines printed before the run got past its flags are said when it does, or when it ends
            for held_kind, line in child.keep(kind, payload):
                self.echo(prefix + line, held_kind)
        else:  # ended
            self.running.remove(child)
            early, refused = [], payload == 2 and not child.past_its_flags()
            if refused:  # said by the launcher, once for the seeds that say the same; no more of its configuration
                early = [line for _, line in child.lines]
                self.refused.add(child.seed.config)
            else:
                said = child.keep("err", None, ended=True)
                for held_kind, line in said if child.log is not None else child.lines:
                    self.echo(prefix + line, held_kind)
            child.close()
            self.ended.append(Ended(child.seed, payload, early, child.started, child.step, child.last_error, refused))
            self.show_progress()

    def echo(self, line: str, kind: str) -> None:
        if kind == "out":
            if self.bar is not None and not self.bar.disable:
                self.bar.write(line)
            else:
                print(line, flush=True)
        else:
            self.say(line)

    def expected_wait(self, child: SeedProcess) -> float:
        """How long the launcher has seen a seed's next progress report take: before its first, the longest any seed of
        this launch took from its start to its first (its start-up and first iteration); after, its mean interval
        between reports, or before its second, the mean of the other seeds'; 0 where none was seen yet."""
        if not child.reports:
            return max((c.first_report - c.begun for c in self.started.values() if c.reports), default=0.0)
        if child.reports > 1:
            return child.interval()
        intervals = [c.interval() for c in self.started.values() if c.reports > 1]
        return sum(intervals) / len(intervals) if intervals else 0.0

    def silent(self) -> list[tuple[SeedProcess, float]]:
        """The running seeds without a progress report (since their last, or their start) for longer than
        max(stall_floor, STALL_FACTOR x expected_wait), each with those seconds; not one past its last step, which
        writes its files and its evaluation."""
        now = time.monotonic()
        found = []
        for child in self.running:
            quiet = now - (child.last_report or child.begun)
            done = child.total and child.step >= child.total
            if not done and quiet > max(self.stall_floor, STALL_FACTOR * self.expected_wait(child)):
                found.append((child, quiet))
        return found

    def progress_line(self) -> str:
        """How many runs are done, the latest return of each seed running, and each silent seed."""
        count = len(self.started) + len(self.waiting)
        returns = " ".join(
            f"{c.seed.config + '/' if c.seed.config else ''}{c.seed.seed}:"
            f"{'n/a' if c.recent_return is None else f'{c.recent_return:.0f}'}"
            for c in self.running
        )
        silent = "".join(f"; {c.seed.name}: no progress for {duration(quiet)}" for c, quiet in self.silent())
        return f"{len(self.ended)} of {count} runs done; returns {returns}{silent}"

    def show_progress(self) -> None:
        """The bar: every seed's steps against every seed's total (each seed's, once it has said it), and the
        progress_line."""
        if self.bar is None or self.bar.disable:
            return
        children = [*self.started.values()]
        self.bar.total = max(c.total for c in children) * (len(children) + len(self.waiting)) or None
        self.bar.n = sum(c.step for c in children)
        self.bar.set_postfix_str(self.progress_line(), refresh=False)
        self.bar.refresh()


# ---------------------------------------------------------------------------------------------------------------------
# The end: every seed's final return, with an interval honest for few seeds
# ---------------------------------------------------------------------------------------------------------------------
def seed_status(ended: Ended) -> str:
    """How the seed's run ended: "timed out" for exit status 124 (its rollout ran past --rollout-timeout), else as its
    summary.json says (a signal that came as it was closing does not undo a completed run); else by its exit status,
    naming the signal that killed or stopped it."""
    code = ended.returncode
    if code == 124:
        return "timed out"
    status = ended.summary.get("status")
    if status:
        return status
    if code is None:
        return "lost"
    if code < 0:
        with contextlib.suppress(ValueError):  # a real-time signal has no name
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    if code - 128 in STOP_SIGNALS:  # a run's own exit status after the signal (130 for Ctrl-C)
        return f"stopped by {signal_name(code - 128)}"
    return "completed" if code == 0 else f"exit {code}"


def seed_cause(prog: str, ended: Ended, status: str) -> str:
    """Why a seed that did not complete stopped, where its status does not say it: the last line it printed on
    stderr, where a run says its error (less `<prog>: error: `), for a run that exited with an error status."""
    code = ended.returncode
    if status == "completed" or code is None or code <= 0 or code - 128 in STOP_SIGNALS:
        return ""
    return ended.last_error.removeprefix(f"{prog}: error: ")


def report(prog: str, ended: list[Ended], not_started: list[Seed], first: int, address: str | None = None) -> list[str]:
    """The closing lines (stdout): a row for each seed, the statistics of the completed seeds' final returns (for
    each configuration of a grid, and each configuration against the first), the TensorBoard command and, when a seed
    did not complete, which, and how to continue them."""
    configs = list(dict.fromkeys(seed.config for seed in [*(row.seed for row in ended), *not_started]))
    width = max(len("config"), *map(len, configs)) + 2 if configs != [""] else 0
    rows = sorted(
        [(row, seed_status(row), row.summary) for row in ended]
        + [(Ended(s, None), "not started", {}) for s in not_started],
        key=lambda row: (configs.index(row[0].seed.config), row[0].seed.seed),
    )
    count = f"{len(configs)} configurations x {len(rows) // len(configs)} seeds" if width else f"{len(rows)} seeds"
    causes = [seed_cause(prog, row, status) for row, status, _ in rows]
    header = f"{'config' if width else '':<{width}}{'seed':>6}  {'status':<20}{'steps':>10}  final return"
    lines = [f"{prog}: {count}", header + ("  cause" if any(causes) else "")]
    finals: dict[str, list[float]] = {config: [] for config in configs}
    for (row, status, summary), cause in zip(rows, causes):
        final = final_return(summary)
        if final is not None and status == "completed":
            finals[row.seed.config].append(float(final))
        shown = "n/a" if final is None else f"{final:.2f}"
        line = f"{row.seed.config:<{width}}{row.seed.seed:>6}  {status:<20}{row.steps:>10}  {shown:<12}  {cause}"
        lines.append(line.rstrip())
    for config in configs:
        lines += final_return_lines(config, finals[config], sum(row.seed.config == config for row, *_ in rows))
    for config in configs[1:]:
        lines += comparison_lines(configs[0], finals[configs[0]], config, finals[config])
    folders = [row.seed for row, *_ in rows if os.path.isdir(row.seed.run_dir)]
    if folders:
        spec = ",".join(f"{s.config + '__' if s.config else ''}seed{s.seed}:{s.run_dir}" for s in folders)
        lines.append(f"curves: tensorboard --logdir_spec {spec}")
    for config in configs:
        unfinished = [(row.seed, status) for row, status, _ in rows if row.seed.config == config]
        lines += continue_lines(prog, unfinished, first, address)
    return lines


def continue_lines(prog: str, seeds: list[tuple[Seed, str]], first: int, address: str | None) -> list[str]:
    """Which seeds of one configuration did not complete (`seeds`: each with its status), and the command that
    continues them all: --resume of a seed's checkpoint (its run.json holds the command; a seed without a checkpoint
    starts afresh, one without a folder starts). Where no seed saved a checkpoint, the command that starts them afresh
    (--overwrite), and a configuration of a grid none of whose seeds started gets the command that starts it alone,
    into the same folders."""
    unfinished = [seed for seed, status in seeds if status != "completed"]
    if not unfinished:
        return []
    config = seeds[0][0].config
    which = f"{config + ' ' if config else ''}seed {', '.join(str(seed.seed) for seed in unfinished)}"
    cluster = f" --ray-address {address}" if address else ""
    recorded = [seed for seed, _ in seeds if os.path.isfile(os.path.join(seed.run_dir, "run.json"))]
    saved = [seed for seed in recorded if os.path.isfile(os.path.join(seed.run_dir, "checkpoint.pt"))]
    if saved:
        checkpoint = os.path.join(saved[0].run_dir, "checkpoint.pt")
        again = f"python {prog} --resume {checkpoint} --seed {first} --num-seeds {len(seeds)}{cluster}"
        return [f"not completed: {which}; continue every seed{' of it' if config else ''} with: {again}"]
    one = seeds[0][0]
    run_name = flag_value(one.flags, "--run-name")
    if run_name is None or not (recorded or config):
        return [f"not completed: {which}; none of them started training: run the same command again"]
    flags = without_launcher_flags(one.flags) + (["--overwrite"] if recorded and "--overwrite" not in one.flags else [])
    again = f"python {prog} {' '.join(shlex.quote(item) for item in flags)} --seed {first} --num-seeds {len(seeds)} "
    again += f"--run-name {run_name.removesuffix(f'__{one.seed}')}{cluster}"
    if recorded:
        return [f"not completed: {which}; none saved a checkpoint: start them afresh with: {again}"]
    return [f"not completed: {which}; none started: start them alone with: {again}"]


def own_paths(seed: Seed) -> list[str]:
    """The paths a seed's lines may name that another seed's name otherwise: its checkpoint's folder and its own."""
    resume = flag_value(seed.flags, "--resume")
    return [path for path in (resume and os.path.dirname(resume), seed.run_dir) if path]


def exit_status(ended: list[Ended], not_started: list[Seed], signum: int | None) -> int:
    if signum is not None:
        return 128 + signum  # as a single run's: 130 for Ctrl-C, 143 for SIGTERM
    if ended and all(e.refused for e in ended):
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
        except ClusterError as e:
            print(f"{prog}: error: {e}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:  # a second signal cancelled the seeds in flight
            print(f"{prog}: cancelled; the seeds that had ended are in runs/", file=sys.stderr)
            return 130
    else:
        run = Launch(script, seeds, parallel, quiet)
        ended, signum = run.run(), run.stop.signum
        not_started = run.waiting
    refusals = [e for e in ended if e.refused]
    said = set()
    for refused in refusals:  # the same refusal of every seed is said once: the first seed's words
        text = "\n".join(refused.early_lines)
        same = text
        for path in own_paths(refused.seed):
            same = same.replace(path, "\0")
        if same not in said:
            said.add(same)
            print(text, file=sys.stderr)
    if ended and len(refusals) == len(ended):
        return 2
    print("\n".join(report(prog, ended, not_started, seeds[0].seed, address)), flush=True)
    if seeds[0].config:  # a grid: the configurations' curves side by side
        first = seeds[0]
        path = first.run_dir[: -len(f"__{first.config}__{first.seed}")] + ".png"
        try:
            print(plot_configurations(ended, path), flush=True)
        except Exception as e:  # noqa: BLE001 (the plot is a view of the runs, whose folders and table stand)
            print(f"no plot of the curves: {first_line(e)}", flush=True)
    return exit_status(ended, not_started, signum)


def plot_configurations(ended: list[Ended], path: str) -> str:
    """Each configuration's curve over its completed seeds (seed_statistics.plot_curves), into `path`; the line that
    says where, or why not."""
    from run_record import read_curve

    curves: dict[str, list] = {}
    for row in ended:
        curve = read_curve(row.seed.run_dir) if seed_status(row) == "completed" else None
        curves.setdefault(row.seed.config, []).extend([curve] if curve is not None else [])
    return plot_curves(curves, path)


# ---------------------------------------------------------------------------------------------------------------------
# On a Ray cluster: every seed a Ray task of ray_cluster.py, its folder packed on the node and unpacked here
# ---------------------------------------------------------------------------------------------------------------------
def seeds_on_cluster(script: str, seeds: list[Seed], address: str) -> tuple[list[Ended], list[Seed], int | None]:
    """Every seed a task of run_on_cluster, from the script's folder (which Ray uploads to the nodes); their folders
    come back into this runs folder. Returns how each seed that ran ended (one lost with the cluster: no exit status),
    the seeds that never started (a signal came first), and that signal."""
    repo = os.path.dirname(script)
    jobs = []
    for seed in seeds:
        run_name = os.path.relpath(seed.run_dir, "runs")
        if "--resume" in command_flags(seed.flags):  # the node resumes from the folder sent with it
            flags = [f"--resume={os.path.join('runs', run_name, 'checkpoint.pt')}"]
            flags += [item for name, _, items in flag_items(seed.flags) if name != "--resume" for item in items]
            jobs.append(cluster_job(seed.name, run_name, None, [os.path.basename(script), *flags], seed.run_dir))
        else:
            jobs.append(cluster_job(seed.name, run_name, [os.path.basename(script), *seed.flags], None))
    started = time.time() - 1.0
    statuses, signum = run_on_cluster(jobs, address, os.path.abspath("runs"), repo)
    ended = [Ended(seed, statuses[seed.name], started=started) for seed in seeds if seed.name in statuses]
    return ended, [seed for seed in seeds if seed.name not in statuses], signum
