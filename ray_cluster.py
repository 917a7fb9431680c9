"""Runs as Ray tasks on a cluster, their folders brought home: the --num-seeds launcher's seeds with --ray-address,
and benchmarks/learning.py's sweeps.

    statuses, signum = run_on_cluster(jobs, "auto", "runs", repo)     # every job a Ray task; each folder into runs/

Each job is a training command and the run folder it writes. Its task trains it in a temporary folder of its node
(run_on_node: a run sent with a half-finished folder, or finding one in the shared --storage, resumes from its
checkpoint) and returns the folder packed (pack_folder), which the head unpacks into its runs folder as each task ends
(unpack_folder). With --storage, a folder every node sees, the runs write there instead, and a lease (Lease) gives a
run folder one writer at a time. The first Ctrl-C or SIGTERM stops the runs in flight after their iteration, with a
checkpoint, and brings them home; a second cancels them.

This module imports only the standard library at its top (ray and tqdm where they are used): the launcher imports it
before torch, and the tasks carry its functions to the nodes by value.
"""

from __future__ import annotations

import contextlib
import glob
import io
import json
import logging
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
import warnings

import run_record
import stop_signals
from run_record import final_return, first_line, last_line, run_summary
from stop_signals import TwoStageStop, run_child_setup, signal_name, take_back_stop_signals


class ClusterError(Exception):
    """The cluster cannot take the runs (nothing answers at the address, no node has a run's CPUs): one line."""


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


def connect(address: str | None, runtime_env: dict, **init_kwargs):
    """The one way this repository's code joins Ray: the cluster at `address` (`auto`: the one `ray start` set up on
    this node; host:port: a remote head) or, with None, a Ray of this process's own; quietly, its workers with
    `runtime_env`. Nothing answering there, or ray.init refusing, is one ClusterError line. Returns the ray module."""
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")  # read when ray is imported: each worker's lines are kept whole
    # A Ray started here would hold ray.init until it had started an idle worker per CPU, which workers that carry a
    # runtime_env of their own never take (they start their own).
    os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
    import ray

    if address not in (None, "auto", "local") and not ray_address_answers(address):
        raise ClusterError(f"cannot reach Ray at --ray-address {address}: nothing answers there")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # "local" always starts a new Ray; ray.init() with no address would join whatever cluster on this machine
            # was started last (another user's run, a test cluster), against the scripts' documented default.
            ray.init(
                address=address or "local",
                runtime_env=runtime_env,
                logging_level=logging.ERROR,
                log_to_driver=True,
                **init_kwargs,
            )
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise ClusterError(f"cannot reach Ray at --ray-address {address}: {first_line(e)}") from None
    return ray


def cpu_counts(ray) -> tuple[float, float, float]:
    """(CPUs free now, CPUs in all, the most CPUs one live node has) of the Ray this process joined."""
    largest = max((node["Resources"].get("CPU", 0) for node in ray.nodes() if node["Alive"]), default=0)
    return ray.available_resources().get("CPU", 0), ray.cluster_resources().get("CPU", 0), largest


def refuse_what_does_not_fit(ray, what: str, total: float, each: float, hint: str = "") -> None:
    """Work that would wait for CPUs forever is refused at once, in one ClusterError line: `what` needs `total` CPUs
    free now, and `each` of its parts needs that many CPUs on one node."""
    free, cpus, largest = cpu_counts(ray)
    if total > free:
        raise ClusterError(f"{what} needs {total:g} CPUs; the cluster has {free:g} free of {cpus:g}{hint}")
    if each > largest:
        raise ClusterError(f"{what} needs {each:g} CPUs on one node; the largest node has {largest:g}{hint}")


def cluster_job(
    label: str,
    run_name: str,
    new: list[str] | None,
    resume: list[str] | None,
    folder: str | None = None,
    storage: str | None = None,
    python: str | None = None,
    cpus: float = 1,
) -> dict:
    """A run as run_on_node takes it, the one shape of both its senders (the launcher's seeds, benchmarks/learning.py's
    sweeps): its name in the lines, its folder's name under runs/ (on the node and at home), the command that starts
    it and the one that resumes it from its checkpoint (the node picks by what the folder holds; paths relative to the
    uploaded working_dir and the node's working folder), the half-finished folder sent with it (None: none), the shared
    --storage (None: none), the interpreter (None: the worker's) and the CPUs it holds."""
    return {
        "label": label,
        "run_name": run_name,
        "argv": {"new": new, "resume": resume},
        "folder_tar": pack_folder(folder) if folder else None,
        "storage": storage,
        "python": python,
        "cpus": cpus,
    }


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
    # A Ray started with SIGINT ignored (`ray start` from a background job or nohup) passes that on to its workers, and
    # ray.cancel's KeyboardInterrupt, which arrives as a SIGINT, would be dropped: the trainer would never hear of a
    # cancelled run. The task takes it back (tasks run in the worker's main thread); the worker's mask stays Ray's.
    take_back_stop_signals(unblock=False)
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


WORK_PREFIX = "ray_run_"  # a run's temporary folder on a node: ray_run_<pid of its Ray worker>_<random>


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
    lease_seconds()), takes it, and waits one more renewal period before writing, so that an old holder that comes back
    finds the lease gone and kills its trainer without letting it write. Staleness compares the holder's clock with
    the taker's: nodes are assumed to keep time (NTP) to well under lease_seconds()."""

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
    """How long a lease lives without renewal ($RUN_LEASE_SECONDS, for tests that lose a node on purpose)."""
    return float(os.environ.get("RUN_LEASE_SECONDS", "60"))


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
        proc = subprocess.Popen(
            [python, os.path.join(repo, argv[0]), *argv[1:]],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=run_child_setup(),
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
    jobs: list[dict], address: str, runs_root: str, working_dir: str, max_retries: int = 3, prog: str | None = None
) -> tuple[dict[str, int | None], int | None]:
    """Send every job to the cluster at `address` as a Ray task (run_on_node), with `working_dir` uploaded to every
    node, and unpack each finished run's folder into `runs_root`. A bar counts the runs; each finished one prints a
    line with the node it ran on and its final return. Returns each job's exit status by label (None for a task that
    failed; the others still finish), and the signal that stopped them (None when none did). Ctrl-C or SIGTERM stops
    every run in flight after its iteration, with a checkpoint, and brings its folder home as a finished one's; no new
    run starts. A second signal cancels them (their checkpoints stay only in --storage)."""
    if not jobs:
        return {}, None
    prog = prog or os.path.basename(sys.argv[0])
    excludes = list(UPLOAD_EXCLUDES)
    runs_root = os.path.abspath(runs_root)
    if runs_root.startswith(working_dir + os.sep):
        excludes.append(os.path.relpath(runs_root, working_dir))
    connect(address, {"working_dir": working_dir, "excludes": excludes})
    import ray
    import ray.cloudpickle
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # Workers may not import these modules by name (a copy's folder without them): send their functions by value.
    for module in (sys.modules[__name__], run_record, stop_signals):
        ray.cloudpickle.register_pickle_by_value(module)
    try:
        # the runs queue for the CPUs, but each needs its own on one node
        biggest = max(jobs, key=lambda job: job["cpus"])
        refuse_what_does_not_fit(ray, biggest["label"], 0, biggest["cpus"])
        print(f"{prog}: {len(jobs)} runs to the cluster ({cpu_counts(ray)[1]:g} CPUs)", file=sys.stderr, flush=True)
        # on the head's own node: a node lost mid-run must not take the flag with it
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        stop = ray.remote(num_cpus=0, scheduling_strategy=here)(StopFlag).remote()
        task = ray.remote(run_on_node)
        pending = {}
        for job in jobs:
            options = dict(num_cpus=job["cpus"], scheduling_strategy="SPREAD", max_retries=max_retries)
            pending[task.options(**options, name=job["label"]).remote({**job, "stop": stop})] = job
        return collect_runs(pending, runs_root, prog, stop)
    finally:
        ray.shutdown()


def collect_runs(pending: dict, runs_root: str, prog: str, stop) -> tuple[dict[str, int | None], int | None]:
    """Wait for the tasks in `pending` ({ObjectRef: job}) and unpack their run folders as they finish. The first Ctrl-C
    or SIGTERM sets `stop`: the runs in flight stop with their checkpoints and come home, those not started never
    run; a second one cancels them."""
    import ray
    from tqdm import tqdm

    total, statuses = len(pending), {}

    def stop_runs(signum: int) -> None:
        name = signal_name(signum)
        bar.write(f"{prog}: {name}: the runs in flight stop with a checkpoint and come back (again: cancel them)")
        stop.set.remote()  # the runs not started yet return at once, unstarted

    bar = tqdm(total=total, unit="run", file=sys.stderr, dynamic_ncols=True)
    with TwoStageStop(stop_runs) as stopping:
        try:
            while pending:
                (ref,), _ = ray.wait(list(pending), num_returns=1)
                job = pending[ref]  # popped once its folder is unpacked: a signal before that still keeps it
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayError as e:
                    pending.pop(ref)
                    statuses[job["label"]] = None
                    bar.write(f"{prog}: failed {job['label']}: {last_line(e)}", file=sys.stderr)
                    bar.update()
                    continue
                pending.pop(ref)
                bar.update()
                if result["returncode"] is None:  # it never started: the head had been stopped
                    continue
                bar.write(f"{prog}: {finished_line(job, result, runs_root)}", file=sys.stderr)
                statuses[job["label"]] = result["returncode"]
                if result["returncode"] != 0:
                    bar.write(f"{prog}: {job['label']}: {last_line(result['stderr'])}", file=sys.stderr)
            if stopping.signum is not None:
                bar.write(f"{prog}: stopped; every run in flight came back with its checkpoint", file=sys.stderr)
        except KeyboardInterrupt:
            # Runs that had finished but were not collected yet are unpacked before the others are cancelled.
            finished, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0) if pending else ([], [])
            for ref in finished:
                keep_finished(ref, pending.pop(ref), runs_root, prog, bar)
            for ref in pending:
                ray.cancel(ref)  # the task passes Ctrl-C to its trainer, whose checkpoint stays only in --storage
            if pending:
                ray.wait(list(pending), num_returns=len(pending), timeout=60)
            bar.write(f"{prog}: stopped; {total - len(pending)} of {total} runs ended and are kept", file=sys.stderr)
            raise
        finally:
            bar.close()
    return statuses, stopping.signum


def keep_finished(ref, job: dict, runs_root: str, prog: str, bar) -> None:
    """After Ctrl-C: unpack a run that had ended but was not collected yet, and say so."""
    import ray

    try:
        result = ray.get(ref, timeout=0)
    except ray.exceptions.RayError:
        return  # it failed: nothing to keep
    bar.write(f"{prog}: {finished_line(job, result, runs_root)}", file=sys.stderr)


def finished_line(job: dict, result: dict, runs_root: str) -> str:
    """Unpack a finished run's folder here and say where it ran and how it ended (its final return)."""
    folder = os.path.join(runs_root, job["run_name"])
    if result["tar"] is not None:
        unpack_folder(result["tar"], folder)
    where = f"on {result['host']} (node {result['node_id'][:8]}) in {result['seconds']:.0f} s"
    if result["returncode"] != 0:
        return f"failed {job['label']} {where} (exit {result['returncode']})"
    final = final_return(run_summary(folder))
    return f"done {job['label']} {where}: {'no episode finished' if final is None else f'return {final:.1f}'}"
