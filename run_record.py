"""What a run records of itself and how it talks, in the standard library only: the launcher, the Ray runner and
benchmarks/learning.py's sweeps read it without importing torch (numpy and tensorboard only where a curve is read).

- What a run ran on, in run.json: the Python, the packages that decide whether two runs compare, the CPU; and the
  files' SHA-256 that its code is recorded by.
- How a run ended, in summary.json: read back, and its final return; its curve, from its TensorBoard events.
- Its console: the pipe a launcher reads its progress from, a console that outlives its reader, and an exception's
  message in one line.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.metadata
import json
import os
import platform
import sys
from collections import deque

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


# ---------------------------------------------------------------------------------------------------------------------
# How a run ended, in summary.json
# ---------------------------------------------------------------------------------------------------------------------
def run_summary(folder: str) -> dict:
    """The summary.json of the run in `folder`; {} where there is none yet (a run still going, or one that never
    trained) or it cannot be read."""
    try:
        with open(os.path.join(folder, "summary.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def final_return(summary: dict) -> float | None:
    """A run's final return, as its summary (run_summary) gives it: the mean return of its last episodes (at most
    100); None before an episode ended, or without a summary."""
    final = summary.get("mean_return_last_episodes")
    return None if final is None else float(final)


# ---------------------------------------------------------------------------------------------------------------------
# The console
# ---------------------------------------------------------------------------------------------------------------------
# The environment variable naming the file descriptor a seed writes its progress to, as "<step> <total> <return>"
# (run_management.progress_channel writes it; the launcher's SeedProcess reads it)
PROGRESS_FD = "PPO_PROGRESS_FD"


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


def message_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def first_line(e: BaseException) -> str:
    """An exception's message in one line, for a one-line error: its first line, with the lines after it where it
    ends in a colon (torch.compile's "backend='inductor' raised:" and load_state_dict's "Error(s) in loading
    state_dict for Agent:" are followed by their cause); its type's name where it has no message."""
    lines = message_lines(str(e))
    if not lines:
        return type(e).__name__
    text = lines[0]
    for line in lines[1:]:
        if not text.endswith(":"):
            break
        text = f"{text} {line}"
    return text


def last_line(said: BaseException | str) -> str:
    """The last line of an exception's message, or of what a process printed: where the error is said, under the
    traceback of another process (a Ray task's, an actor's, a trainer's). An exception without a message gives its
    type's name; output without a line, ""."""
    lines = message_lines(str(said))
    if lines:
        return lines[-1]
    return type(said).__name__ if isinstance(said, BaseException) else ""


def read_curve(folder: str) -> tuple | None:
    """(env steps, seconds since the first event, mean return of the last 100 episodes) of one run, numpy arrays read
    from its TensorBoard events (ours: charts/episodic_return; SB3's: rollout/ep_rew_mean); None without either.
    numpy and tensorboard are imported here, when a curve is asked for."""
    import numpy as np
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    event_dirs = sorted({os.path.dirname(p) for p in glob.glob(os.path.join(folder, "**", "events.*"), recursive=True)})
    for event_dir in event_dirs:
        acc = EventAccumulator(event_dir, size_guidance={"scalars": 0})
        acc.Reload()
        tags = acc.Tags()["scalars"]
        if "charts/episodic_return" in tags:  # ours: one point per episode
            events = acc.Scalars("charts/episodic_return")
            window: deque[float] = deque(maxlen=100)
            values = []
            for e in events:
                window.append(e.value)
                values.append(np.mean(window))
        elif "rollout/ep_rew_mean" in tags:  # SB3: already the mean of the last 100 episodes
            events = acc.Scalars("rollout/ep_rew_mean")
            values = [e.value for e in events]
        else:
            continue
        start = min(e.wall_time for e in acc.Scalars(tags[0]))
        return (np.array([e.step for e in events]), np.array([e.wall_time - start for e in events]), np.array(values))
    return None
