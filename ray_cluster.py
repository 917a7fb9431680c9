"""Runs as Ray tasks on a cluster, their folders brought home: the --num-seeds launcher's seeds with --ray-address,
and benchmarks/learning.py's sweeps.

    statuses, signum = run_on_cluster(jobs, "auto", "runs", repo)     # every job a Ray task; each folder into runs/

Each job is a training command and the run folder it writes. Its task trains it in a temporary folder of its node
(run_on_node: a run sent with a half-finished folder, or finding one in the shared --storage, resumes from its
checkpoint) and returns the folder packed (pack_folder), which the head unpacks into its runs folder as each task ends
(unpack_folder). With --storage, a folder every node sees, the runs write there instead, and a lease (Lease) gives a
run folder one writer at a time. Each run holds its CPUs until it ends (StopListener): a node never trains more runs
at once than it has CPUs. The first Ctrl-C or SIGTERM stops the runs in flight after their iteration, with a
checkpoint, and brings them home; a second cancels them. The Ray driver is a child process (drive), so that a cluster
lost under it is one line here, the runs that ended kept.

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
import pickle
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
import warnings

import run_record
import stop_signals
from run_record import final_return, first_line, last_line, run_summary
from stop_signals import TwoStageStop, linux_prctl, run_child_setup, signal_name, take_back_stop_signals


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
    # A Ray started with SIGINT ignored (`ray start` from a background job or nohup) passes that on to its workers, and
    # ray.cancel's KeyboardInterrupt, which arrives as a SIGINT, would be dropped: the trainer would never hear of a
    # cancelled run. The task takes it back (tasks run in the worker's main thread); the worker's mask stays Ray's.
    take_back_stop_signals(unblock=False)
    repo = os.getcwd()  # the job's working_dir: this repo, as uploaded
    if job["storage"] and not os.path.isdir(os.path.join(job["storage"], "runs")):
        message = f"--storage {job['storage']} is not there on {node['host']}: mount it on every node"
        return {**node, "returncode": 2, "stderr": message, "seconds": 0.0, "tar": None}
    stop = StopListener(job["stop"]) if job.get("stop") is not None else None
    if stop is not None and stop.first_answer():
        stop.close()
        return {**node, "returncode": None, "stderr": "", "seconds": 0.0, "tar": None}  # stopped before it started
    print(f"{job['label']} running on {node['host']} (node {node['node_id'][:8]})", flush=True)
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
        started = time.time()
        returncode, stderr, seconds = run_trainer(python, repo, argv, work, lease, stop, folder)
        if os.path.isdir(folder):  # where and when it ran, for the head and the tests (no two at once on a CPU)
            with open(os.path.join(folder, "node.json"), "w") as f:
                json.dump({**node, "started": started, "ended": time.time(), "seconds": round(seconds, 1)}, f)
        folder_tar = None if job["storage"] or not os.path.isdir(folder) else pack_folder(folder)
        return {**node, "returncode": returncode, "stderr": stderr[-2000:], "seconds": seconds, "tar": folder_tar}
    except LeaseHeld as e:
        return {**node, "returncode": 1, "stderr": str(e), "seconds": 0.0, "tar": None}
    finally:
        if stop is not None:
            stop.close()
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
    head sets its StopFlag (`stop`, a StopListener: it saves a checkpoint, and its folder still goes home) or cancels
    the task, and SIGHUP when this worker dies (it saves a checkpoint and stops). With a `lease` (--storage), it is
    renewed while the trainer runs; once another attempt has taken it, the trainer is killed at once, before it writes
    again. Its output (stdout and stderr) is added to `folder`/output.log when it has made that folder."""
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
                    if stop is not None and not stopping and stop.is_set():
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


class StopListener:
    """(In a Ray worker.) Whether the head set its StopFlag, asked once a second from a thread of the task's own. While
    a task's main thread waits in ray.get or ray.wait (even with timeout=0, for an answer not there yet), Ray lends
    its CPU to the next task queued on its node, which then starts: its node would train one run more than it has
    CPUs. A wait in another thread keeps the CPU. (An answer that does not come says no: the flag lives on the head's
    node, and a head that is gone takes its job's tasks with it.)"""

    def __init__(self, flag):
        self.flag = flag
        self.asked, self.answered, self.closed = threading.Event(), threading.Event(), threading.Event()
        threading.Thread(target=self.listen, name="stop-listener", daemon=True).start()

    def listen(self) -> None:
        import ray

        while not self.closed.is_set():
            try:
                if ray.get(self.flag.is_set.remote(), timeout=30):
                    self.asked.set()
            except (ray.exceptions.RayError, OSError):
                pass
            self.answered.set()
            if self.asked.is_set():
                return
            self.closed.wait(1)

    def first_answer(self) -> bool:
        """Whether the head had set its flag when first asked (a run that would start after a stop never does)."""
        self.answered.wait(35)
        return self.asked.is_set()

    def is_set(self) -> bool:
        return self.asked.is_set()

    def close(self) -> None:
        self.closed.set()


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
    """Extract only plain files and folders inside `folder` (tarfile's "data" filter, in every Python the repository
    runs on: pyproject.toml's requires-python)."""
    tar.extractall(folder, filter="data")


def run_on_cluster(
    jobs: list[dict], address: str, runs_root: str, working_dir: str, max_retries: int = 3, prog: str | None = None
) -> tuple[dict[str, int | None], int | None]:
    """Send every job to the cluster at `address` as a Ray task (run_on_node), with `working_dir` uploaded to every
    node, and unpack each finished run's folder into `runs_root`. A bar counts the runs; each finished one prints a
    line with the node it ran on and its final return. Returns each job's exit status by label (None for a task that
    failed, the others still finishing, or that was lost with the cluster), and the signal that stopped them (None
    when none did). Each run holds its CPUs until it ends (StopListener). Ctrl-C or SIGTERM stops every run in flight
    after its iteration, with a checkpoint, and brings its folder home as a finished one's; no new run starts. A
    second signal cancels them (their checkpoints stay only in --storage), and raises KeyboardInterrupt here.

    The Ray driver is a child process (drive), told each signal this process gets: Ray ends a driver whose node's
    raylet or object store has gone (a cluster lost) at once, with no exception to catch, and this process stays to
    say so in one line, the runs that ended known and their folders kept."""
    if not jobs:
        return {}, None
    prog = prog or os.path.basename(sys.argv[0])
    runs_root = os.path.abspath(runs_root)
    statuses: dict[str, int | None] = {}
    unstarted, ending, forwarded = set(), {}, []

    def forward(signum: int, frame) -> None:
        forwarded.append(signum)
        driver.send_signal(signum)

    with tempfile.TemporaryDirectory(prefix="ray_driver_") as folder:
        orders = os.path.join(folder, "orders.pickle")
        with open(orders, "wb") as f:
            pickle.dump((jobs, address, runs_root, working_dir, max_retries, prog), f)
        read, write = os.pipe()
        here = os.path.dirname(os.path.abspath(__file__))  # an edited copy's own module
        code = f"import sys; sys.path.insert(0, {here!r}); import ray_cluster; ray_cluster.drive({orders!r}, {write})"
        try:
            driver = subprocess.Popen(
                [sys.executable, "-c", code], stdin=subprocess.DEVNULL, pass_fds=(write,), preexec_fn=driver_setup()
            )
        finally:
            os.close(write)
        replaced = {signum: signal.signal(signum, forward) for signum in (signal.SIGINT, signal.SIGTERM)}
        try:
            with os.fdopen(read) as said:
                for line in said:
                    try:
                        message = json.loads(line)
                    except ValueError:
                        continue  # cut off as the driver was ended: its end is said below
                    if "unstarted" in message:
                        unstarted.add(message["unstarted"])
                    elif "label" in message:
                        statuses[message["label"]] = message["status"]
                    else:
                        ending = message
            driver.wait()
        finally:
            for signum, handler in replaced.items():
                signal.signal(signum, handler)
    if "error" in ending:
        raise ClusterError(ending["error"])
    if "cancelled" in ending or (not ending and driver.returncode < 0):  # a signal came before its handlers did
        raise KeyboardInterrupt
    if "signum" in ending:
        return statuses, ending["signum"]
    lost = [job["label"] for job in jobs if job["label"] not in statuses and job["label"] not in unstarted]
    what = ending.get("lost") or f"Ray ended the driver process, exit status {driver.returncode}"
    print(
        f"{prog}: lost the cluster ({what}): {len(lost)} of {len(jobs)} runs lost with it; the {len(statuses)} that "
        f"ended are kept in {os.path.relpath(runs_root)}",
        file=sys.stderr,
        flush=True,
    )
    return {**statuses, **dict.fromkeys(lost)}, forwarded[0] if forwarded else None


def driver_setup():
    """A subprocess.Popen preexec_fn for the Ray driver: a process group of its own, so that a terminal's Ctrl-C
    reaches it once, through its parent; on Linux, SIGTERM when that parent dies (its runs stop with their
    checkpoints, and their folders still come home)."""
    prctl = linux_prctl()  # looked up here: after fork, the child only calls it

    def setup() -> None:
        os.setpgrp()
        if prctl is not None:
            prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG

    return setup


class ClusterLost(Exception):
    """The cluster went away while the driver waited for its runs (its message names how)."""


def drive(orders: str, fd: int) -> None:
    """(The Ray driver, run_on_cluster's child process.) Run the jobs that `orders` holds, and tell the parent, one
    JSON line each on `fd`, every run that ends (its label and exit status, None for a failed task; a run that never
    started, said as such) and then how it all ended: the signal that stopped it, a ClusterError's line, the cluster
    lost, or cancelled by a second signal."""
    with open(orders, "rb") as f:
        jobs, address, runs_root, working_dir, max_retries, prog = pickle.load(f)
    channel = os.fdopen(fd, "w", buffering=1)

    def tell(**message) -> None:
        with contextlib.suppress(OSError):  # a parent gone (killed): its SIGTERM brings the runs home all the same
            channel.write(json.dumps(message) + "\n")

    try:
        tell(signum=drive_runs(jobs, address, runs_root, working_dir, max_retries, prog, tell))
    except ClusterError as e:
        tell(error=str(e))
    except ClusterLost as e:
        tell(lost=str(e))
    except KeyboardInterrupt:
        tell(cancelled=True)
    except Exception as e:  # noqa: BLE001 (the parent says it in one line: a failure of this code, not of a run)
        tell(error=f"the Ray driver failed: {type(e).__name__}: {first_line(e)}")
    with contextlib.suppress(OSError):
        channel.close()


def drive_runs(
    jobs: list[dict], address: str, runs_root: str, working_dir: str, max_retries: int, prog: str, tell
) -> int | None:
    """(In the driver.) Connect, send every job as a task and collect them (collect_runs); the signal that stopped
    them, None when none did."""
    excludes = list(UPLOAD_EXCLUDES)
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
        return collect_runs(pending, runs_root, prog, stop, tell)
    finally:
        ray.shutdown()


def collect_runs(pending: dict, runs_root: str, prog: str, stop, tell) -> int | None:
    """Wait for the tasks in `pending` ({ObjectRef: job}), unpack their run folders as they finish and `tell` each
    one's exit status. The first Ctrl-C or SIGTERM sets `stop`: the runs in flight stop with their checkpoints and
    come home, those not started never run; a second one cancels them. A cluster that goes away (its head, or this
    node's raylet) with an exception raises ClusterLost."""
    import ray
    from tqdm import tqdm

    total = len(pending)

    def stop_runs(signum: int) -> None:
        name = signal_name(signum)
        bar.write(f"{prog}: {name}: the runs in flight stop with a checkpoint and come back (again: cancel them)")
        with contextlib.suppress(Exception):  # a cluster already gone: the wait below says so
            stop.set.remote()  # the runs not started yet return at once, unstarted

    bar = tqdm(total=total, unit="run", file=sys.stderr, dynamic_ncols=True)
    with TwoStageStop(stop_runs) as stopping:
        try:
            while pending:
                try:
                    (ref,), _ = ray.wait(list(pending), num_returns=1)
                except (ray.exceptions.RayError, OSError) as e:  # no task's error: the cluster's
                    raise ClusterLost(f"{type(e).__name__}: {first_line(e)}") from None
                job = pending[ref]  # popped once its folder is unpacked: a signal before that still keeps it
                try:
                    result = ray.get(ref)
                except (ray.exceptions.LocalRayletDiedError, OSError) as e:
                    raise ClusterLost(f"{type(e).__name__}: {first_line(e)}") from None
                except ray.exceptions.RayError as e:
                    pending.pop(ref)
                    tell(label=job["label"], status=None)
                    bar.write(f"{prog}: failed {job['label']}: {last_line(e)}", file=sys.stderr)
                    bar.update()
                    continue
                pending.pop(ref)
                bar.update()
                if result["returncode"] is None:  # it never started: the head had been stopped
                    tell(unstarted=job["label"])
                    continue
                bar.write(f"{prog}: {finished_line(job, result, runs_root)}", file=sys.stderr)
                tell(label=job["label"], status=result["returncode"])
                if result["returncode"] != 0 and not stopped_on_request(result):
                    bar.write(f"{prog}: {job['label']}: {last_line(result['stderr'])}", file=sys.stderr)
                # Ray runs a task again to rebuild a result that is still referenced when its node is lost.
                del ref, result
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
    return stopping.signum


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
    summary = run_summary(folder)
    if stopped_on_request(result):
        return f"stopped {job['label']} {where}, at step {summary.get('env_steps', 0)}, with its checkpoint"
    if result["returncode"] != 0:
        return f"failed {job['label']} {where} (exit {result['returncode']})"
    final = final_return(summary)
    return f"done {job['label']} {where}: {'no episode finished' if final is None else f'return {final:.1f}'}"


def stopped_on_request(result: dict) -> bool:
    """Whether a run's trainer ended on a stop signal (the head's flag, or a cancel): checkpoint saved, 130 or 143."""
    return result["returncode"] in (130, 143)
