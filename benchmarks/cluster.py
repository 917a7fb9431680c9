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
  was on the lost node, so the retry starts it afresh; with --storage it resumes from its last checkpoint.
The code travels as the job's working_dir (Ray uploads this repo, less runs, venvs and results, to every node); the
trainer runs there as a subprocess, exactly the command that learning.py runs locally, in a temporary folder of that
node. When it ends, the task returns its run folder as a tar.gz (TensorBoard events, summary.json, the model and
checkpoint), which the head unpacks into its runs folder.
"""

from __future__ import annotations

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
    repo = os.getcwd()  # the job's working_dir: this repo, as uploaded
    if job["storage"] and not os.path.isdir(os.path.join(job["storage"], "runs")):
        message = f"--storage {job['storage']} is not there on {node['host']}: mount it on every node"
        return {**node, "returncode": 2, "stderr": message, "seconds": 0.0, "tar": None}
    work = job["storage"] or tempfile.mkdtemp(prefix="learning_run_")
    folder = os.path.join(work, "runs", job["run_name"])
    try:
        if job["folder_tar"] is not None:
            unpack_folder(job["folder_tar"], folder)
        if os.path.isfile(os.path.join(folder, "checkpoint.pt")) and job["argv"]["resume"]:
            argv = job["argv"]["resume"]
        else:
            shutil.rmtree(folder, ignore_errors=True)  # a folder without a checkpoint: the run starts afresh
            argv = job["argv"]["new"]
        os.makedirs(os.path.join(work, "runs"), exist_ok=True)
        returncode, stderr, seconds = run_trainer(job["python"] or sys.executable, repo, argv, work)
        if os.path.isdir(folder):  # where it ran, for the head and the tests
            with open(os.path.join(folder, "node.json"), "w") as f:
                json.dump({**node, "seconds": round(seconds, 1)}, f)
        folder_tar = None if job["storage"] or not os.path.isdir(folder) else pack_folder(folder)
        return {**node, "returncode": returncode, "stderr": stderr[-2000:], "seconds": seconds, "tar": folder_tar}
    finally:
        if not job["storage"]:
            shutil.rmtree(work, ignore_errors=True)


def run_trainer(python: str, repo: str, argv: list[str], cwd: str) -> tuple[int, str, float]:
    """Run `python repo/argv[0] argv[1:]` in cwd; (exit status, stderr, seconds). The trainer gets SIGTERM when this
    worker dies (it saves a checkpoint and stops), and SIGINT when the sweep is cancelled with Ctrl-C."""
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
                    continue
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
    """Replace `folder` with the contents of pack_folder's bytes."""
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(folder, filter="data")


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
    from run_utils import ray_address_answers

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
            job = pending.pop(ref)
            try:
                result = ray.get(ref)
            except ray.exceptions.RayError as e:
                lines = [line.strip() for line in str(e).splitlines() if line.strip()]
                failures.append(f"{job['label']}: {lines[-1] if lines else type(e).__name__}")
                bar.write(f"learning.py: failed {job['label']}: {failures[-1]}", file=sys.stderr)
                bar.update()
                continue
            bar.write(f"learning.py: {finished_line(job, result, cfg)}", file=sys.stderr)
            if result["returncode"] != 0:
                lines = [line for line in result["stderr"].splitlines() if line.strip()]
                failures.append(f"{job['label']}: exit {result['returncode']}: {lines[-1] if lines else ''}")
            bar.update()
    except KeyboardInterrupt:
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
