"""Ctrl-C, SIGTERM and SIGHUP: how a process answers them however its parent started it, and the two-stage stop that a
run, the --num-seeds launcher and a cluster's head share (the first signal asks to stop after the work under way, a
second one stops at once).

Standard library only: the launcher imports it before torch.
"""

from __future__ import annotations

import contextlib
import signal
import sys

# The signals that stop a run after its iteration, with a checkpoint (SIGHUP where the OS has it)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, *([signal.SIGHUP] if hasattr(signal, "SIGHUP") else []))


def signal_name(signum: int) -> str:
    """A signal as a one-line message names it: Ctrl-C for SIGINT, else its own name."""
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


def take_back_stop_signals(hangup: bool = False, unblock: bool = True) -> None:
    """Ctrl-C and SIGTERM reach this process however its parent started it. A shell script's background job (`python
    ppo_continuous.py ... &`, or `ray start` from one) starts with SIGINT ignored, and a child of a Ray worker with it
    blocked; both survive exec, so a signal that was ignored is answered again (SIGINT with KeyboardInterrupt) and,
    with `unblock`, one that was blocked is let through. SIGHUP is taken back only with `hangup` (a launcher's seeds,
    which must hear that it died): nohup's run outlives its terminal. A Ray worker keeps its mask (`unblock=False`):
    Ray blocks SIGINT there so that a terminal's Ctrl-C fails no task, and cancels a task by calling its handler."""
    taken = [signal.SIGINT, signal.SIGTERM, *([signal.SIGHUP] if hangup and hasattr(signal, "SIGHUP") else [])]
    for signum in taken:
        if signal.getsignal(signum) is signal.SIG_IGN:
            with contextlib.suppress(ValueError):  # not the main thread, which alone takes signals: nothing to do
                signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
    if unblock and hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, taken)


def linux_prctl():
    """libc's prctl on Linux, else None."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    return ctypes.CDLL("libc.so.6", use_errno=True).prctl


def run_child_setup():
    """A subprocess.Popen preexec_fn for a run this process starts: before it execs, it takes back the stop signals,
    SIGHUP included (take_back_stop_signals), and on Linux asks for SIGHUP when its parent dies, so that a killed
    launcher or Ray worker leaves no run behind: the run saves a checkpoint after its iteration and stops. (SIGHUP,
    which a run takes once however often it comes: Linux sends the signal each time it hands the orphan from one of
    the dying parent's threads to the next, and a second SIGTERM would make it quit without a checkpoint.)"""
    prctl = linux_prctl()  # looked up here: after fork, the child only calls it

    def setup() -> None:
        take_back_stop_signals(hangup=True)
        if prctl is not None:
            prctl(1, signal.SIGHUP)  # 1 = PR_SET_PDEATHSIG

    return setup


class TwoStageStop:
    """Ctrl-C and SIGTERM in two stages, while `with` it: the first asks to stop after the work under way
    (`ask(signum)`), a second stops at once (`now(signum)`; without one, KeyboardInterrupt is raised). `signum` is the
    latest signal that came, None before any. `signals`: those it takes (a subclass may set them as it enters); one
    that cannot stop at once (SIGHUP, which Linux may send several times as a dying parent's threads go) asks once
    and is dropped after. The handlers it replaced come back when it ends."""

    def __init__(self, ask, now=None, signals=(signal.SIGINT, signal.SIGTERM)):
        self.ask, self.now, self.signals = ask, now, signals
        self.signum: int | None = None
        self.replaced: dict = {}

    def __enter__(self):
        self.replaced = {signum: signal.signal(signum, self.on_signal) for signum in self.signals}
        return self

    def on_signal(self, signum, frame) -> None:
        if self.signum is None:
            self.signum = signum
            self.ask(signum)
        elif signum in (signal.SIGINT, signal.SIGTERM):
            self.signum = signum
            if self.now is None:
                raise KeyboardInterrupt
            self.now(signum)

    def __exit__(self, exc_type, exc, traceback) -> bool:
        for signum, handler in self.replaced.items():
            signal.signal(signum, handler)
        return False
