"""learning.py --run --ray-address: every run a Ray task, placed across the cluster's nodes, its run folder sent back.

On the head, then on every other node (each with this repo's requirements installed in the same Python version):

    ray start --head --port 6379
    ray start --address HEAD_IP:6379
    python benchmarks/learning.py --run --ray-address auto --envs Hopper-v5 --seeds 5 --impls ppo \\
        --grid learning-rate=1e-4,3e-4

Why Ray tasks and not Ray Tune: since Ray 2.7, Tune keeps a trial's folder only in a storage path that every node
reaches (cloud storage or NFS) and no longer syncs trial folders to the head (ray-project/ray#37177). A task can
return the run folder itself, so a sweep needs nothing shared, and tasks have what a sweep needs besides:
- resources: a ppo or SB3 run asks 1 CPU, a DPPO run its actors' CPUs plus the learner's;
- placement: "SPREAD" puts the runs on different nodes while there is room;
- faults: a task whose node or worker dies is retried on another node (max_retries). Without --storage its folder
  was on the lost node, so the retry starts it afresh; with --storage it resumes from its last checkpoint, once the
  lost attempt's lease on the folder has gone stale (a minute; see Lease: one attempt writes a run folder at a time).
The code travels as the job's working_dir (Ray uploads this repo, less runs, venvs and results, to every node); the
trainer runs there as a subprocess, exactly the command that learning.py runs locally, in a temporary folder of that
node. When it ends, the task returns its run folder as a tar.gz (TensorBoard events, summary.json, the model and
checkpoint), which the head unpacks into its runs folder.
"""

from __future__ import annotations

import contextlib
import glob
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid

from common import REPO, BenchError
from learning_report import read_curve

# What the job's working_dir leaves behind: Ray uploads the rest of the repo to every node.
UPLOAD_EXCLUDES = [".git", "runs", ".venv", "benchmarks/.venv-*", "benchmarks/results", "**/__pycache__", "*.pt"]


def run_on_node(job: dict) -> dict:
    """(In a Ray worker.) Train one run on this node and say where it ran, how it ended and, unless its folder is in
    the shared --storage, return that folder as a tar.gz. The run resumes from a checkpoint if its folder has one:
    the half-finished folder the head sent, or, with --storage, what an attempt on a lost node left."""
    import ray

    node = {
        "node_id": ray.get_runtime_context().get_node_id(),
        "ip": ray.util.get_node_ip_address(),
        "host": socket.gethostname(),
    }
    print(f"learning.py: {job['label']} running on {node['host']} (node {node['node_id'][:8]})", flush=True)
    take_back_sigint()
    repo = os.getcwd()  # the job's working_dir: this repo, as uploaded
    if job["storage"] and not os.path.isdir(os.path.join(job["storage"], "runs")):
        message = f"--storage {job['storage']} is not there on {node['host']}: mount it on every node"
        return {**node, "returncode": 2, "stderr": message, "seconds": 0.0, "tar": None}
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
        returncode, stderr, seconds = run_trainer(job["python"] or sys.executable, repo, argv, work, lease)
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


def run_trainer(python: str, repo: str, argv: list[str], cwd: str, lease=None) -> tuple[int, str, float]:
    """Run `python repo/argv[0] argv[1:]` in cwd; (exit status, stderr, seconds). The trainer gets SIGTERM when this
    worker dies (it saves a checkpoint and stops), and SIGINT when the sweep is cancelled with Ctrl-C. With a `lease`
    (--storage), it is renewed while the trainer runs; once another attempt has taken it, the trainer is killed at
    once, before it writes again."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [repo, os.environ.get("PYTHONPATH")] if p))
    env.setdefault("MPLBACKEND", "Agg")
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as stderr:  # a file, not a pipe: the wait below never reads it
        parent_death_signal = linux_prctl()  # looked up here: after fork, the child only calls it
        proc = subprocess.Popen(
            [python, os.path.join(repo, argv[0]), *argv[1:]],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            text=True,
            preexec_fn=lambda: prepare_trainer(parent_death_signal),
        )
        try:
            while True:  # short waits: ray.cancel's KeyboardInterrupt arrives between them, not inside a long one
                try:
                    proc.wait(timeout=1)
                    break
                except subprocess.TimeoutExpired:
                    if lease is not None and not lease.keep():
                        proc.kill()
                        proc.wait()
                        message = "another attempt of this run took over its folder (this one was cut off too long)"
                        return 1, message, time.perf_counter() - start
        except BaseException:  # the sweep was cancelled: the trainer saves a checkpoint, then stops
            proc.send_signal(signal.SIGINT)
            proc.wait()
            raise
        stderr.seek(0)
        return proc.returncode, stderr.read(), time.perf_counter() - start


def linux_prctl():
    """libc's prctl on Linux, else None."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    return ctypes.CDLL("libc.so.6", use_errno=True).prctl


def prepare_trainer(prctl) -> None:
    """(In the trainer, before it starts.) A Ray worker blocks SIGINT, and a blocked or ignored signal stays so across
    exec: give the trainer back Ctrl-C. On Linux, also ask for SIGTERM when the worker that started it dies, so that
    a killed worker or a removed node leaves no trainer behind (both signals make it save a checkpoint)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT, signal.SIGTERM])
    if prctl is not None:
        prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


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
            # ValueError, not BenchError: this runs on the nodes too, where benchmarks/common.py cannot be imported
            raise ValueError(f"refusing to unpack {member.name!r}: not a plain file or folder inside the run folder")
    tar.extractall(folder)


def run_on_cluster(jobs: list[dict], cfg) -> None:
    """Send every job (learning.py's run_missing builds them) to the cluster at cfg.ray_address as a Ray task, and
    unpack each finished run's folder into the head's runs folder. A bar counts the runs; each finished one prints a
    line with the node it ran on and its final return. Failed runs are reported at the end; the others still finish.
    Ctrl-C cancels the runs in flight and keeps those already finished."""
    if not jobs:
        return
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")  # read when ray is imported: each run's "running on" line is kept
    import ray
    import ray.cloudpickle

    excludes = list(UPLOAD_EXCLUDES)
    runs_root = os.path.abspath(cfg.runs_root)
    if runs_root.startswith(REPO + os.sep):
        excludes.append(os.path.relpath(runs_root, REPO))
    sys.path.insert(0, REPO)
    from dppo_ray import ray_address_answers

    if cfg.ray_address not in ("auto", "local") and not ray_address_answers(cfg.ray_address):
        raise BenchError(f"cannot reach Ray at --ray-address {cfg.ray_address}: nothing answers there")
    try:
        ray.init(
            address=cfg.ray_address,
            runtime_env={"working_dir": REPO, "excludes": excludes},
            logging_level="ERROR",
            log_to_driver=True,
        )
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise BenchError(f"cannot reach Ray at --ray-address {cfg.ray_address}: {str(e).splitlines()[0]}") from None
    # Workers cannot import benchmarks/ by name: send this module's functions by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        total = ray.cluster_resources().get("CPU", 0)
        largest = max((node["Resources"].get("CPU", 0) for node in ray.nodes() if node["Alive"]), default=0)
        too_big = [job for job in jobs if job["cpus"] > largest]
        if too_big:  # a run needs its CPUs on one node; Ray would wait for such a node forever
            raise BenchError(
                f"{too_big[0]['label']} needs {too_big[0]['cpus']:g} CPUs on one node; the largest node has {largest:g}"
            )
        print(f"learning.py: {len(jobs)} runs to the cluster ({total:g} CPUs)", file=sys.stderr, flush=True)
        task = ray.remote(run_on_node)
        pending = {}
        for job in jobs:
            options = dict(num_cpus=job["cpus"], scheduling_strategy="SPREAD", max_retries=cfg.max_retries)
            pending[task.options(**options, name=job["label"]).remote(job)] = job
        collect_runs(pending, cfg, len(jobs))
    finally:
        ray.shutdown()


def collect_runs(pending: dict, cfg, total: int) -> None:
    """Wait for the tasks in `pending` ({ObjectRef: job}) and unpack their run folders as they finish."""
    import ray
    from tqdm import tqdm

    failures = []
    bar = tqdm(total=total, unit="run", file=sys.stderr, dynamic_ncols=True)
    try:
        while pending:
            (ref,), _ = ray.wait(list(pending), num_returns=1)
            job = pending[ref]  # popped once its folder is unpacked: Ctrl-C before that still keeps it
            try:
                result = ray.get(ref)
            except ray.exceptions.RayError as e:
                pending.pop(ref)
                lines = [line.strip() for line in str(e).splitlines() if line.strip()]
                failures.append(f"{job['label']}: {lines[-1] if lines else type(e).__name__}")
                bar.write(f"learning.py: failed {job['label']}: {failures[-1]}", file=sys.stderr)
                bar.update()
                continue
            bar.write(f"learning.py: {finished_line(job, result, cfg)}", file=sys.stderr)
            pending.pop(ref)
            if result["returncode"] != 0:
                lines = [line for line in result["stderr"].splitlines() if line.strip()]
                failures.append(f"{job['label']}: exit {result['returncode']}: {lines[-1] if lines else ''}")
            bar.update()
    except KeyboardInterrupt:
        # Runs that had finished but were not collected yet are unpacked before the others are cancelled.
        finished, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0) if pending else ([], [])
        for ref in finished:
            keep_finished(ref, pending.pop(ref), cfg, bar)
        for ref in pending:
            ray.cancel(ref)  # the task passes Ctrl-C to its trainer, whose checkpoint stays only in --storage
        if pending:
            ray.wait(list(pending), num_returns=len(pending), timeout=60)
        bar.write(f"learning.py: stopped; {total - len(pending)} of {total} runs ended and are kept", file=sys.stderr)
        raise
    finally:
        bar.close()
    if failures:
        raise BenchError(f"{len(failures)} of {total} runs failed; the first: {failures[0]}")


def keep_finished(ref, job: dict, cfg, bar) -> None:
    """After Ctrl-C: unpack a run that had ended but was not collected yet, and say so."""
    import ray

    try:
        result = ray.get(ref, timeout=0)
    except ray.exceptions.RayError:
        return  # it failed: nothing to keep
    bar.write(f"learning.py: {finished_line(job, result, cfg)}", file=sys.stderr)


def finished_line(job: dict, result: dict, cfg) -> str:
    """Unpack a finished run's folder on the head and say where it ran and how it ended."""
    folder = os.path.join(os.path.abspath(cfg.runs_root), job["run_name"])
    if result["tar"] is not None:
        unpack_folder(result["tar"], folder)
    where = f"on {result['host']} (node {result['node_id'][:8]}) in {result['seconds']:.0f} s"
    if result["returncode"] != 0:
        return f"failed {job['label']} {where} (exit {result['returncode']})"
    curve = read_curve(folder)
    ending = f"return {curve[2][-1]:.1f}" if curve is not None else "no episode finished"
    return f"done {job['label']} {where}: {ending}"
