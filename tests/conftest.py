"""What several test files share: the repository's root, running a script as a user runs it (or forked from a
process that has imported torch), the processes a run left behind, waiting for a run to train, reading a run's
TensorBoard scalars, and a perturbed Agent for the update tests. Plain functions, imported with `from tests.conftest
import ...`; imports the tests do not all need are made where they are used."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import ppo_continuous

REPO = Path(__file__).resolve().parent.parent
# How long a test waits for a process it started to end, or for a run to reach the event it needs: a safety net that
# stops a hung test, never a clock a test races. A loaded 2-core machine takes many times a quiet one's time.
SAFETY_NET = 1800.0


def script_env(env: Mapping[str, str] | None = None, repo_on_path: bool = True) -> dict[str, str]:
    """This process's environment, with PYTHONPATH the repository (so `--env-id tests.envs:...` imports the test envs)
    unless `repo_on_path` is False, and `env` on top."""
    return {**os.environ, **({"PYTHONPATH": str(REPO)} if repo_on_path else {}), **(env or {})}


def run_python(
    script: str | Path,
    args: Sequence[str] = (),
    cwd: Path | None = None,
    timeout: float = SAFETY_NET,
    env: Mapping[str, str] | None = None,
    *,
    repo_on_path: bool = True,
    **kwargs,
) -> subprocess.CompletedProcess:
    """`python script *args` in `cwd`, to its end, its output captured as text (environment as in script_env)."""
    return subprocess.run(
        [sys.executable, str(script), *args],
        cwd=cwd,
        env=script_env(env, repo_on_path),
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )


def start_python(
    script: str | Path,
    args: Sequence[str] = (),
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    *,
    repo_on_path: bool = True,
    **kwargs,
) -> subprocess.Popen:
    """`python script *args` in `cwd`, started and left running; stdout and stderr piped as text unless `kwargs` say
    otherwise (environment as in script_env)."""
    kwargs = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **kwargs}
    return subprocess.Popen(
        [sys.executable, str(script), *args], cwd=cwd, env=script_env(env, repo_on_path), text=True, **kwargs
    )


# ---------------------------------------------------------------------------------------------------------------------
# A script run in a process forked from one that has imported its libraries
# ---------------------------------------------------------------------------------------------------------------------
# What every run imports before it reaches its own code (torch's compiler, which the optimizer's first step and a
# compiled gradient import, included): a test that runs many short trainings starts each from a server that holds them
# (multiprocessing's forkserver, one per test worker), so that each run pays for its own code, not for torch's import.
# None is a module of the repository, and none starts a thread (a thread does not survive a fork).
PRELOADED = [
    "numpy",
    "torch",
    "torch._dynamo",
    "torch._inductor.compile_fx",
    "torch.utils.tensorboard",
    "gymnasium",
    "tyro",
    "tqdm",
]


def _script_in_fork(script: str, args: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """(In a child of the fork server.) What `python script *args` does in `cwd` with environment `env`: the script's
    folder first on the import path, then PYTHONPATH's, then the interpreter's own (the repository and its tests left
    out, so that a copy of the code imports the copy's modules); stdout and stderr to the files `out` and `err`; exits
    with the script's status (1 after a traceback, as the interpreter does)."""
    import atexit
    import runpy
    import traceback

    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out), (2, err)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_TRUNC), fd)
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 (block-buffered, as a pipe's stdout is)
    sys.stderr = open(2, "w", buffering=1, errors="backslashreplace", closefd=False)  # noqa: SIM115
    os.chdir(cwd)
    script_path = Path(script).resolve()
    left_out = {REPO, REPO / "benchmarks", REPO / "tests"}
    own = [p for p in sys.path if p and Path(p).resolve() not in left_out]
    sys.path[:] = [str(script_path.parent), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep)), *own]
    sys.argv = [script, *args]
    status = 0
    try:
        runpy.run_path(str(script_path), run_name="__main__")
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            status = (e.code or 0) & 0xFF
        else:
            print(e.code, file=sys.stderr)
            status = 1
    except BaseException:  # noqa: BLE001 (reported as the interpreter reports it)
        traceback.print_exc()
        status = 1
    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


class ForkedScript:
    """`python script *args` in `cwd`, started in a process of its own forked from the fork server (PRELOADED), with
    this process's environment as script_env makes it; `result()` waits for its end."""

    def __init__(
        self,
        script: str | Path,
        args: Sequence[str] = (),
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        *,
        repo_on_path: bool = True,
    ):
        import multiprocessing
        import tempfile

        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOADED)
        self.args = [sys.executable, str(script), *args]
        self.outputs = []
        for _ in range(2):
            fd, path = tempfile.mkstemp(prefix="forked_script_", suffix=".txt")
            os.close(fd)
            self.outputs.append(path)
        environment = script_env(env, repo_on_path)
        target_args = (str(script), list(args), str(cwd or os.getcwd()), environment, *self.outputs)
        self.process = context.Process(target=_script_in_fork, args=target_args)
        self.process.start()

    def result(self, timeout: float = SAFETY_NET) -> subprocess.CompletedProcess:
        """The ended run's exit status (negative: the signal that ended it) and output."""
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
            raise subprocess.TimeoutExpired(self.args, timeout)
        stdout, stderr = (Path(path).read_text(errors="replace") for path in self.outputs)
        for path in self.outputs:
            os.unlink(path)
        return subprocess.CompletedProcess(self.args, self.process.exitcode, stdout, stderr)


def run_forked(
    script: str | Path,
    args: Sequence[str] = (),
    cwd: Path | None = None,
    timeout: float = SAFETY_NET,
    env: Mapping[str, str] | None = None,
    *,
    repo_on_path: bool = True,
) -> subprocess.CompletedProcess:
    """ForkedScript's run, to its end: run_python's result, without the start-up of torch in each run."""
    return ForkedScript(script, args, cwd, env, repo_on_path=repo_on_path).result(timeout)


class OwnProcesses:
    """The processes that the scripts a test starts through it leave running, and only those: not another Ray job's or
    a user's own cluster on this machine. Each script runs in a session of its own, which every process it starts
    stays in (Ray's raylet, GCS, agents and workers among them), with a tag in its environment, which they inherit.
    Either mark makes a process the test's: Ray's agents overwrite the environment that /proc shows when they set
    their process titles, and a process that called setsid() has left the session but keeps the tag."""

    VARIABLE = "PPO_TESTS_PROCESS_TAG"

    def __init__(self):
        self.tag = uuid.uuid4().hex
        self.sessions: set[int] = set()

    def env(self, env: Mapping[str, str] | None = None) -> dict[str, str]:
        """`env` with this test's tag added."""
        return {**(env or {}), self.VARIABLE: self.tag}

    def start(
        self, script: str | Path, args: Sequence[str] = (), cwd: Path | None = None, env=None, **kwargs
    ) -> subprocess.Popen:
        """start_python, in a new session and with the tag."""
        proc = start_python(script, args, cwd, self.env(env), start_new_session=True, **kwargs)
        self.sessions.add(proc.pid)
        return proc

    def run(
        self,
        script: str | Path,
        args: Sequence[str] = (),
        cwd: Path | None = None,
        timeout: float = SAFETY_NET,
        env=None,
    ) -> subprocess.CompletedProcess:
        """run_python, in a new session and with the tag; on a timeout, every process of the test is killed first, so
        that a hung run does not load the machine for the tests after it."""
        proc = self.start(script, args, cwd, env)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            proc.communicate()
            raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)

    def alive(self) -> dict[int, str]:
        """The test's live processes (zombies have ended), each with its command line; processes this user may not
        read are not the test's."""
        found = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    # the command name in parentheses may hold spaces: the fields after its last ")" are sure
                    state, _, _, session = f.read().rsplit(b")", 1)[1].split()[:4]
                with open(f"/proc/{entry}/environ", "rb") as f:
                    environ = f.read().split(b"\0")
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:  # ended meanwhile, or another user's
                continue
            tagged = f"{self.VARIABLE}={self.tag}".encode() in environ
            if state != b"Z" and (tagged or int(session) in self.sessions):
                found[int(entry)] = command
        return found

    def left_behind(self, within: float = 300) -> dict[int, str]:
        """alive() once it is empty, or after `within` seconds: a process still shutting down is not left behind. (Ray's
        processes end within seconds of the run; a busy machine may take several times that, and an empty alive()
        returns at once.)"""
        deadline = time.monotonic() + within
        while (found := self.alive()) and time.monotonic() < deadline:
            time.sleep(0.5)
        return found

    def kill(self) -> None:
        """SIGKILL to those of alive() that are in a script's session: checked again here, apart from alive(), as
        processes of every user and session on a machine may be within reach."""
        for pid in self.alive():
            with contextlib.suppress(OSError):
                if os.getsid(pid) in self.sessions:
                    os.kill(pid, signal.SIGKILL)


def wait_until_trained(run_dir: Path, proc: subprocess.Popen | None = None, timeout: float = SAFETY_NET) -> bool:
    """Whether the run writing to `run_dir` has trained once (its TensorBoard events hold losses/approx_kl, logged
    after each update) within `timeout` seconds; False as soon as `proc`, its process, has ended. A test that signals a
    run after this reaches it training, however long a loaded machine took to start it (Ray, torch, the envs)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (proc is None or proc.poll() is None):
        if list(run_dir.glob("events.*")) and "losses/approx_kl" in tensorboard_events(run_dir).Tags()["scalars"]:
            return True
        time.sleep(0.5)
    return False


PPO_SCRIPT = REPO / "ppo_continuous.py"


def run_ppo(
    args: Sequence[str], cwd: Path, timeout: float = SAFETY_NET, *, forked: bool = False, **kwargs
) -> subprocess.CompletedProcess:
    """`python ppo_continuous.py *args` in `cwd`, as a user runs it (run_python), or with `forked` in a process forked
    from one that has imported torch (run_forked: for a test of what a run trains and writes, not of its process)."""
    return (run_forked if forked else run_python)(PPO_SCRIPT, args, cwd, timeout, **kwargs)


def tensorboard_events(run_dir: Path, **size_guidance: int) -> EventAccumulator:
    """A run folder's TensorBoard events, loaded, with every scalar kept (TensorBoard keeps only a sample by default);
    `size_guidance` for other kinds, e.g. histograms=0 to keep every histogram too."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, **size_guidance})
    acc.Reload()
    return acc


def scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    """The (step, value) of every scalar a run logged under `tag`."""
    return [(e.step, e.value) for e in tensorboard_events(run_dir).Scalars(tag)]


def perturbed_agent(obs_dim: int = 5, act_dim: int = 2, discrete: bool = False, seed: int = 0) -> ppo_continuous.Agent:
    """An Agent whose initial weights are each moved by seeded Gaussian noise of scale 0.3: ppo_continuous.py's, or
    with `discrete` dppo_ray.py's (the only one that builds a categorical policy)."""
    import torch

    import ppo_continuous

    torch.manual_seed(seed)
    if discrete:
        import dppo_ray

        agent = dppo_ray.Agent(obs_dim, act_dim, discrete=True)
    else:
        agent = ppo_continuous.Agent(obs_dim, act_dim)
    with torch.no_grad():
        for p in agent.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return agent


# ppo_continuous.py's flags for short runs. SMALL: small, fast settings (2 iterations of 4 envs x 64 steps per 512
# steps). VALUE_FIT: a critic fitted on the deterministic test envs (tests/envs.py), without normalization. Runs this
# short train with the eager gradient by the compile rule (fast_paths.compile_pays); a test of the compiled path gives
# --compile.
SMALL = ["--num-envs", "4", "--num-steps", "64", "--num-minibatches", "4", "--update-epochs", "2", "--quiet"]
VALUE_FIT = ["--no-norm-obs", "--no-norm-reward", "--no-clip-vloss", "--gamma", "0.5", "--learning-rate", "3e-3"]
VALUE_FIT += ["--num-envs", "2", "--num-steps", "128", "--num-minibatches", "4", "--quiet"]


# ---------------------------------------------------------------------------------------------------------------------
# A test alone with Ray: `--ray-address auto` joins any Ray on the machine, a local one another test started included
# ---------------------------------------------------------------------------------------------------------------------
def session_lock_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The gate and the lock shared by every worker of this pytest session (pytest-xdist's workers have folders of
    their own under one session folder)."""
    base = tmp_path_factory.getbasetemp()
    folder = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    return folder / "ray_alone.gate", folder / "ray_alone.lock"


@pytest.fixture(autouse=True)
def _beside_others(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """Every test holds the shared lock while it runs, except one that asks to be alone (`alone_with_ray`). The gate
    lets no test in while one waits to be alone, so that it is not kept waiting by tests that keep coming."""
    if "alone_with_ray" in request.fixturenames:
        yield
        return
    import fcntl

    gate_path, lock_path = session_lock_files(tmp_path_factory)
    with open(gate_path, "a") as gate, open(lock_path, "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_SH)
        fcntl.flock(gate, fcntl.LOCK_UN)
        yield


@pytest.fixture
def alone_with_ray(tmp_path_factory: pytest.TempPathFactory):
    """Run with no other test of this session running, and once the Ray the earlier ones started has gone; skipped
    where a Ray outside the tests (a user's cluster) runs on this machine."""
    import fcntl

    gate_path, lock_path = session_lock_files(tmp_path_factory)
    with open(gate_path, "a") as gate, open(lock_path, "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_EX)
        deadline = time.monotonic() + 60.0  # the tests' Ray is gone within seconds of their end; a user's stays
        while subprocess.run(["pgrep", "-f", "gcs_server"], capture_output=True).returncode == 0:
            if time.monotonic() > deadline:
                pytest.skip("a Ray cluster runs on this machine, outside these tests")
            time.sleep(0.5)
        yield
