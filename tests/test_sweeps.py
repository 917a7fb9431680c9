"""benchmarks/learning.py's configurations (--grid) and its runs on a Ray cluster (--ray-address and
ray_cluster.run_on_cluster), on a 2-node ray.cluster_utils.Cluster on this machine: runs land on the nodes that have
CPUs, their folders come back to the head, the table groups by configuration, a lost node costs only a retry, Ctrl-C
keeps what finished, and a second invocation runs only what is missing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO, SAFETY_NET, OwnProcesses, run_python, start_python, wait_until_trained

sys.path.insert(0, str(REPO / "benchmarks"))

# Short Pendulum runs, 2 configurations x 2 seeds.
SWEEP = ["--envs", "Pendulum-v1", "--impls", "ppo", "--seeds", "2", "--grid", "learning-rate=1e-4,3e-4"]
SHORT = ["--total-timesteps", "2048", "--num-steps", "512", "--num-minibatches", "4"]
LABELS = ["ppo__learning-rate=0.0001", "ppo__learning-rate=0.0003"]
# The short sweeps' trainers run with --no-compile: what they check is the sweep's bookkeeping, not the gradient, and
# the compile's start-up costs more than their few minibatches. learning.py passes a trainer's flags through --grid
# only: an axis of one value, in every label. (The long runs, of thousands of minibatches, keep the compiled gradient.)
EAGER = "compile=False"

LEARNING = REPO / "benchmarks" / "learning.py"
PLOTS = {"MPLBACKEND": "Agg"}  # no display


def learning_args(tmp_path: Path, address: str, *extra: str) -> list[str]:
    return ["--run", "--ray-address", address, "--out-dir", str(tmp_path / "out"), *extra]


def run_learning(tmp_path: Path, address: str, *extra: str) -> subprocess.CompletedProcess:
    args = learning_args(tmp_path, address, *extra)
    return run_python(LEARNING, args, tmp_path, timeout=SAFETY_NET, env=PLOTS, repo_on_path=False)


def start_learning(tmp_path: Path, address: str, *extra: str) -> subprocess.Popen:
    args = learning_args(tmp_path, address, *extra)
    return start_python(LEARNING, args, tmp_path, env=PLOTS, repo_on_path=False, stderr=subprocess.STDOUT)


def trainers_running(marker: str, cluster) -> list[int]:
    """Pids of the trainer processes of this test's `cluster` (tagged_cluster) whose command line holds `marker`:
    another test's sweep with the same flags, beside it, carries another tag and is not counted."""
    return [pid for pid, command in cluster.own.alive().items() if "ppo_continuous.py" in command and marker in command]


def run_folders(tmp_path: Path, runs: str = "runs", labels: list[str] = LABELS) -> list[Path]:
    return [tmp_path / runs / "bench" / label / f"Pendulum-v1__{seed}" for label in labels for seed in (1, 2)]


def tagged_cluster(monkeypatch, head_cpus: int):
    """A ray.cluster_utils.Cluster on this machine whose processes carry a tag of their own in their environment
    (`cluster.own`, an OwnProcesses: the nodes start from this process and inherit it, and their workers too)."""
    from ray.cluster_utils import Cluster

    own = OwnProcesses()
    for name, value in own.env().items():
        monkeypatch.setenv(name, value)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": head_cpus})
    cluster.own = own
    return cluster


@pytest.fixture
def cluster(monkeypatch):
    """A 2-CPU head node (tests add a second node)."""
    cluster = tagged_cluster(monkeypatch, 2)
    try:
        yield cluster
    finally:
        cluster.shutdown()


def test_grid_names_configurations_and_refuses_what_does_not_fit(capsys):
    import learning

    cfg = learning.parse_args(["--impls", "ppo", "--grid", "learning-rate=1e-4,3e-4", "norm-adv=True,False"])
    assert cfg.impls == [
        "ppo__learning-rate=0.0001__norm-adv=True",
        "ppo__learning-rate=0.0001__norm-adv=False",
        "ppo__learning-rate=0.0003__norm-adv=True",
        "ppo__learning-rate=0.0003__norm-adv=False",
    ]
    assert cfg.configs[1][2] == ["--learning-rate=0.0001", "--no-norm-adv"]
    written_otherwise = learning.parse_args(
        ["--impls", "ppo", "--grid", "learning-rate=0.0001,0.0003", "norm-adv=true,false"]
    )
    assert written_otherwise.impls == cfg.impls  # values as values: one configuration, one folder, however written
    argv = learning.trainer_argv(cfg, ("x", "ppo", ["--ent-coef=0.01"], "Hopper-v5", 3), "runs/g/x", "new", "")
    assert argv[0] == "ppo_continuous.py" and "--ent-coef=0.01" in argv and "--run-name=bench/x/Hopper-v5__3" in argv
    for grid, message in [
        (["seed=1,2"], "learning.py sets --seed itself"),
        (["max-policy-lag=1,2"], "ppo_continuous.py has no flag --max-policy-lag"),
        (["norm-adv=1,0"], "--norm-adv is a switch"),
        (["learning-rate"], "each axis is FLAG=V1,V2"),
        (["learning-rate=1e-4,"], "each axis is FLAG=V1,V2"),
        (["learning-rate=3e-4,0.0003"], "give distinct values"),  # one value written two ways
        (["update-epochs=1,2.5"], "--update-epochs takes an integer"),
    ]:
        with pytest.raises(SystemExit):
            learning.parse_args(["--impls", "ppo", "dppo_async", "--grid", *grid])
        assert message in capsys.readouterr().err
    for argv, message in [
        (["--grid", "learning-rate=1e-4"], "leave sb3 out of --impls"),
        (["--ray-address", "auto"], "use it with --run"),
        (["--run", "--ray-address", "auto", "--jobs", "2"], "--jobs applies to runs on this machine"),
        (["--run", "--storage", "x"], "use it with --ray-address"),
    ]:
        with pytest.raises(SystemExit):
            learning.parse_args(argv)
        assert message in capsys.readouterr().err


@pytest.mark.slow
def test_a_node_lost_mid_sweep_costs_only_a_retry(tmp_path, monkeypatch):
    """The runs start on worker A (the head has no CPU for them); A is removed while they run, B joins, and the runs
    that were in flight on A run again on B. Their folders come back to the head, the table holds each configuration,
    and a second invocation finds nothing left to run."""
    cluster = tagged_cluster(monkeypatch, 0)
    try:
        node_a = cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        sweep = [*SWEEP[:5], "1", *SWEEP[6:]]  # 1 seed: both runs start on A
        proc = start_learning(tmp_path, cluster.address, *sweep, "--total-timesteps", "30720", *SHORT[2:])
        output: list[str] = []
        reader = threading.Thread(target=lambda: output.extend(proc.stdout), daemon=True)
        reader.start()
        deadline = time.time() + SAFETY_NET
        while time.time() < deadline and len(trainers_running("bench/ppo__learning-rate=", cluster)) < 2:
            time.sleep(0.5)
        assert len(trainers_running("bench/ppo__learning-rate=", cluster)) == 2, "".join(output)[-3000:]
        time.sleep(2)  # the trainers are under way on A, the only node with CPUs
        cluster.remove_node(node_a)  # the runs wait for a node with CPUs
        node_b = cluster.add_node(num_cpus=2)
        proc.wait(timeout=SAFETY_NET)
        reader.join(timeout=10)
        text = "".join(output)
        assert proc.returncode == 0, text[-3000:]
        assert text.count("learning.py: done ppo__learning-rate=") == 2
        assert not trainers_running("bench/ppo__learning-rate=", cluster), "the trainers on A stopped with their node"
        for folder in run_folders(tmp_path)[::2]:
            assert json.loads((folder / "summary.json").read_text())["env_steps"] == 30720
            assert json.loads((folder / "node.json").read_text())["node_id"] == node_b.node_id, text
        table = (tmp_path / "out" / "learning.md").read_text()
        for label in LABELS:
            assert f"| Pendulum-v1 | {label} | 1 | 30,720 |" in table, table
        again = run_learning(tmp_path, cluster.address, *sweep, "--total-timesteps", "30720", *SHORT[2:])
        assert again.returncode == 0, again.stderr[-3000:]
        assert "to the cluster" not in again.stderr and "done ppo" not in again.stderr, "nothing is left to run"
    finally:
        cluster.shutdown()


@pytest.fixture
def sigint_ignored():
    """SIGINT ignored in this process while the test runs (pytest ignores Ctrl-C meanwhile): a cluster started after
    it has nodes that ignore SIGINT, as `ray start` from a background job or nohup has, and their workers inherit
    that."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.slow
def test_ctrl_c_keeps_finished_runs_and_storage_runs_resume(tmp_path, sigint_ignored, cluster):
    """With --storage (here a folder both nodes of this machine see), Ctrl-C stops the sweep; the run that had
    finished stays, the interrupted ones leave checkpoints, and the next invocation resumes them. The nodes ignore
    SIGINT, as those of a `ray start` from a background job do: the cancelled task must still reach its trainer.
    (sigint_ignored comes before cluster in the signature: pytest sets up fixtures of one scope in that order.)"""
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    storage = tmp_path / "shared"
    long_run = ["--total-timesteps", "30720", *SHORT[2:]]  # 60 updates: the signal comes after the first
    sweep = ["--envs", "Pendulum-v1", "--impls", "ppo", "--seeds", "1", "--storage", str(storage)]
    # one finished run first: the 1e-4 configuration, with the flags the sweep below asks (a run of other flags would
    # be refused)
    first = run_learning(tmp_path, cluster.address, *sweep, "--grid", "learning-rate=1e-4", *long_run)
    assert first.returncode == 0, first.stderr[-3000:]
    finished = storage / "runs" / "bench" / LABELS[0] / "Pendulum-v1__1"
    finished_events = sorted(p.name for p in finished.glob("events.*"))
    sweep += ["--grid", "learning-rate=1e-4,3e-4"]
    proc = start_learning(tmp_path, cluster.address, *sweep, *long_run)
    interrupted = storage / "runs" / "bench" / LABELS[1] / "Pendulum-v1__1"
    # the signal must find the trainer training: one that came as it started could leave it no step to checkpoint
    assert wait_until_trained(interrupted, proc, timeout=SAFETY_NET), "the interrupted run never trained"
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=SAFETY_NET)
    assert proc.returncode != 0
    assert "stopped; " in output and "Traceback" not in output, output[-3000:]
    assert sorted(p.name for p in finished.glob("events.*")) == finished_events, "the finished run is kept as it was"
    assert (interrupted / "summary.json").is_file(), output[-3000:]
    summary = json.loads((interrupted / "summary.json").read_text())
    assert summary["status"] == "interrupted" and (interrupted / "checkpoint.pt").is_file(), output[-3000:]
    import learning

    cfg = learning.parse_args(["--run", "--ray-address", "auto", *sweep, *long_run])
    assert [run[-1] for run in learning.missing_runs(cfg)] == ["resume"], "the next invocation resumes only that one"


def test_difference_table_gives_welch_interval_and_the_least_possible_p():
    """Hand-made runs: Welch's interval by hand (sample variances, Welch-Satterthwaite's degrees of freedom) and
    scipy's own Welch test agree with the table; the permutation p of two separated groups is its floor."""
    import math

    from learning_report import difference_table
    from scipy import stats

    from seed_statistics import permutation_floor, permutation_pvalue, welch_interval

    a, b = [1.0, 2.0, 6.0], [0.0, 0.5, 1.0]
    var_a, var_b = 7.0 / 3, 0.25 / 3  # sample variances 7 and 0.25, over 3 seeds each
    se = math.sqrt(var_a + var_b)
    dof = se**4 / (var_a**2 / 2 + var_b**2 / 2)
    assert dof == pytest.approx(2.1427, abs=1e-4)
    half = stats.t.ppf(0.975, dof) * se
    low, high = welch_interval(a, b)
    assert (low, high) == pytest.approx((2.5 - half, 2.5 + half))
    reference = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert (low, high) == pytest.approx((reference.low, reference.high))
    assert welch_interval([3.0, 3.0], [1.0, 1.0]) == (2.0, 2.0)

    assert permutation_floor(3, 3) == pytest.approx(0.1) and permutation_floor(4, 4) == pytest.approx(2 / 70)
    assert permutation_floor(3, 4) == pytest.approx(1 / 35)
    high_seeds, low_seeds = [10.0, 11.0, 12.0, 13.0], [1.0, 2.0, 3.0, 4.0]
    assert permutation_pvalue(high_seeds, low_seeds) == pytest.approx(permutation_floor(4, 4))

    rows = [
        {"env": "Hopper-v5", "impl": "base", "finals": low_seeds, "final": 2.5},
        {"env": "Hopper-v5", "impl": "new", "finals": high_seeds, "final": 11.5},
    ]
    table = "\n".join(difference_table(rows, "base"))
    low, high = welch_interval(high_seeds, low_seeds)
    assert f"| Hopper-v5 | new | +9 | [{low:+.0f}, {high:+.0f}] | 0.029 | 0.029 | 0.029 |" in table
    assert "Welch" in table and "least possible p" in table and "1 task compared" in table
    two_tasks = rows + [{**row, "env": "Walker2d-v5"} for row in rows]  # the same gap on a second task
    table = "\n".join(difference_table(two_tasks, "base"))
    assert "| Walker2d-v5 | new | +9 |" in table and "| 0.029 | 0.029 | 0.057 |" in table  # Bonferroni: p × 2


def test_final_table_gives_per_seed_finals_sample_std_and_flags_mixed_code_and_versions():
    from learning_report import final_return_table, summary_row

    steps, secs = [0, 100], [0.0, 1.0]
    runs = [(steps, secs, [0.0, value]) for value in (10.0, 20.0, 30.0)]
    row = summary_row("Hopper-v5", "ppo", [tuple(map(np.asarray, run)) for run in runs], None, ["aaaa"])
    assert row["final_std"] == pytest.approx(10.0)  # the sample std (n - 1): np.std would say 8.16

    def entry(gae_sha: str, torch_version: str) -> dict:  # a run.json entry, as a hand-made run would have it
        code = {
            "modules": {"gae": {"path": "gae.py", "sha256": gae_sha * 64}},
            "commit": "c" * 40,
            "scripts_clean": True,
        }
        packages = {"torch": torch_version, "gymnasium": "1.2.2", "mujoco": None, "numpy": "2.0", "ray": None}
        return {"code": code, "environment": {"python": "3.11.7", "packages": packages, "cpu": "X", "cores": 2}}

    alike = [{**row, "entries": [entry("a", "2.13.0")]}, {**row, "impl": "dppo", "entries": [entry("a", "2.13.0")]}]
    table = "\n".join(final_return_table(alike))
    assert "| 10, 20, 30 | 20 ± 10 |" in table and "| aaaa |" in table and "| — |" in table  # no target: a dash
    assert "Mixed" not in table and "Ran on Python 3.11.7; torch 2.13.0, gymnasium 1.2.2, numpy 2.0; CPU: X" in table
    mixed = [{**row, "entries": [entry("a", "2.13.0")]}, {**row, "impl": "dppo", "entries": [entry("b", "2.5.1")]}]
    table = "\n".join(final_return_table(mixed))
    assert "**Mixed code:** gae in 2 versions" in table
    assert "**Mixed versions:** the runs ran on Python 3.11.7; torch 2.13.0" in table and "torch 2.5.1" in table
    unrecorded = "\n".join(final_return_table([{**row, "entries": [], "unrecorded": 1}]))
    assert "**Mixed code:** 1 runs without run.json" in unrecorded


# The label of run_local_sweep's runs: ppo, with --no-compile (EAGER)
LOCAL = f"ppo__{EAGER}"


def run_local_sweep(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    args = ["--run", "--envs", "Pendulum-v1", "--impls", "ppo", "--seeds", "1", "--grid", EAGER]
    args += ["--num-steps", "512", "--out-dir", str(tmp_path / "out"), *extra]
    return run_python(LEARNING, args, tmp_path, timeout=SAFETY_NET, env=PLOTS, repo_on_path=False)


@pytest.mark.slow
def test_a_sweep_never_reuses_a_run_of_other_flags_or_code(tmp_path):
    """A finished run is reused only when its run.json says the same command and the same code; otherwise the sweep
    refuses in one line naming the first difference, or reruns it with --rerun-changed."""
    first = run_local_sweep(tmp_path, "--total-timesteps", "1024", "--num-minibatches", "4")
    assert first.returncode == 0, first.stderr[-3000:]
    starts = f"learning.py: {LOCAL} on Pendulum-v1 seed 1 starts"
    assert starts in first.stderr
    run = "Pendulum-v1__1"
    folder = tmp_path / "runs" / "bench" / LOCAL / run
    record = json.loads((folder / "run.json").read_text())
    assert "--total-timesteps=1024" in record["command"] and len(record["code"]["scripts_sha256"]) == 64
    table = (tmp_path / "out" / "learning.md").read_text()
    assert f"| {record['code']['scripts_sha256'][:12]} |" in table

    again = run_local_sweep(tmp_path, "--total-timesteps", "1024", "--num-minibatches", "4")
    assert again.returncode == 0 and starts not in again.stderr, "the same sweep trains nothing"
    for flags, was, asks in [
        (["--total-timesteps", "2048", "--num-minibatches", "4"], "--total-timesteps=1024", "--total-timesteps=2048"),
        (["--total-timesteps", "1024", "--num-minibatches", "2"], "--num-minibatches=4", "--num-minibatches=2"),
    ]:
        refused = run_local_sweep(tmp_path, *flags)
        assert refused.returncode == 1 and "Traceback" not in refused.stderr
        line = refused.stderr.strip()
        assert "\n" not in line and line.startswith(f"learning.py: error: runs/bench/{LOCAL}/{run} was run with")
        assert f"{was}, this sweep asks {asks}" in line and "--rerun-changed" in line
    assert json.loads((folder / "summary.json").read_text())["env_steps"] == 1024, "a refusal touches nothing"

    assert set(record["code"]["modules"]) >= {"ppo_continuous.py", "gae", "checkpoints", "run_management"}
    record["code"]["modules"]["gae"]["sha256"] = "0" * 64  # as if trained before gae.py changed
    (folder / "run.json").write_text(json.dumps(record))
    refused = run_local_sweep(tmp_path, "--total-timesteps", "1024", "--num-minibatches", "4")
    assert refused.returncode == 1 and "was trained by other code (gae.py has changed since" in refused.stderr

    rerun = run_local_sweep(tmp_path, "--total-timesteps", "2048", "--num-minibatches", "4", "--rerun-changed")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert json.loads((folder / "summary.json").read_text())["env_steps"] == 2048
    assert "--total-timesteps=2048" in json.loads((folder / "run.json").read_text())["command"]
    (kept,) = folder.parent.glob("Pendulum-v1__1.replaced-*")  # the old run, set aside, not deleted
    assert json.loads((kept / "summary.json").read_text())["env_steps"] == 1024
    assert f"kept as {kept.name}" in rerun.stderr


def fake_venv(tmp_path: Path, numpy_version: str) -> Path:
    """A venv whose packages are this one's, but whose metadata says numpy is `numpy_version`: another venv, as far
    as a run's recorded versions can tell."""
    import site

    venv = tmp_path / "other_venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (own,) = venv.glob("lib/python*/site-packages")
    (own / "these_packages.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    info = own / f"numpy-{numpy_version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: numpy\nVersion: {numpy_version}\n")
    return venv / "bin" / "python"


@pytest.mark.slow
def test_a_sweep_refuses_other_versions_a_changed_env_module_a_run_extended_by_hand_and_reports_checked(tmp_path):
    """A run is reused (or reported) only when its recorded versions, the code of every module it imported (a custom
    env's outside the repository too) and every resume's flags match: otherwise refused in one line."""
    env_module = tmp_path / "myenvs.py"
    source = 'import gymnasium as gym\ngym.register("MyPendulum-v0", "gymnasium.envs.classic_control:PendulumEnv", '
    env_module.write_text(source + "max_episode_steps=200)\n")
    flags = ["--envs", "myenvs:MyPendulum-v0", "--total-timesteps", "1024", "--num-minibatches", "4"]
    first = run_local_sweep(tmp_path, *flags)
    assert first.returncode == 0, first.stderr[-3000:]
    folder = tmp_path / "runs" / "bench" / LOCAL / "myenvs:MyPendulum-v0__1"
    record = json.loads((folder / "run.json").read_text())
    assert record["code"]["modules"]["myenvs"]["path"] == str(env_module)
    assert record["environment"]["packages"]["numpy"] == np.__version__ and record["environment"]["python"]
    table = (tmp_path / "out" / "learning.md").read_text()
    assert f"| myenvs:MyPendulum-v0 | {LOCAL} | 1 |" in table and "Ran on Python" in table

    def refused(result: subprocess.CompletedProcess, words: str) -> None:
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
        line = result.stderr.strip()
        assert "\n" not in line and line.startswith(f"learning.py: error: runs/bench/{LOCAL}/myenvs:MyPendulum-v0__1 ")
        assert words in line, line

    env_module.write_text(source + "max_episode_steps=100)\n")  # another episode length: another task
    refused(run_local_sweep(tmp_path, *flags), f"was trained by other code ({env_module} has changed since")
    env_module.write_text(source + "max_episode_steps=200)\n")
    other = fake_venv(tmp_path, "0.0.1")
    refused(
        run_local_sweep(tmp_path, *flags, "--python", str(other)),
        f"was trained with numpy {np.__version__}, this sweep's Python has 0.0.1",
    )
    report_args = ["--envs", "myenvs:MyPendulum-v0", "--impls", "ppo", "--seeds", "1", "--grid", EAGER]
    report_args += ["--num-steps", "512"]
    report_args += ["--num-minibatches", "4", "--out-dir", str(tmp_path / "report")]
    report = run_python(LEARNING, [*report_args, "--total-timesteps", "2048"], tmp_path, env=PLOTS, repo_on_path=False)
    refused(report, "was run with --total-timesteps=1024, this sweep asks --total-timesteps=2048")
    assert not (tmp_path / "report").exists(), "report-only mode wrote no table of runs it did not ask for"
    report = run_python(LEARNING, [*report_args, "--total-timesteps", "1024"], tmp_path, env=PLOTS, repo_on_path=False)
    assert report.returncode == 0, report.stderr[-3000:]
    assert f"| myenvs:MyPendulum-v0 | {LOCAL} | 1 |" in (tmp_path / "report" / "learning.md").read_text()

    checkpoint = folder / "checkpoint.pt"
    extended = run_python(
        REPO / "ppo_continuous.py", ["--resume", str(checkpoint), "--total-timesteps", "2048", "--no-compile"], tmp_path
    )
    assert extended.returncode == 0, extended.stderr[-3000:]
    refused(run_local_sweep(tmp_path, *flags), "was resumed with --total-timesteps=2048 (by hand")


def test_unpack_folder_replaces_the_old_folder_only_once_the_new_one_is_whole(tmp_path):
    from ray_cluster import pack_folder, unpack_folder

    source = tmp_path / "source"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "events").write_text("new")
    target = tmp_path / "runs" / "run"
    target.mkdir(parents=True)
    (target / "checkpoint.pt").write_text("old")
    with pytest.raises(Exception):  # noqa: B017 (whatever tarfile raises on a broken archive)
        unpack_folder(b"not a tar.gz", str(target))
    assert (target / "checkpoint.pt").read_text() == "old", "a failed unpack leaves the old folder as it was"
    unpack_folder(pack_folder(str(source)), str(target))
    assert (target / "sub" / "events").read_text() == "new" and not (target / "checkpoint.pt").exists()
    assert sorted(p.name for p in target.parent.iterdir()) == ["run"], "no half-unpacked or old folder is left"


@pytest.mark.slow
def test_lease_gives_a_run_folder_one_writer_at_a_time(tmp_path, monkeypatch):
    """While its holder renews it, a second attempt waits and then gives up; once the holder stops renewing (its node
    was lost), the second takes it over, and the first, if it comes back, finds it gone. The lease is a clock by design:
    its holder renews it every quarter of its 3 s, so the renewing thread may stall for two seconds on a busy machine
    before the lease goes stale under it."""
    from ray_cluster import Lease, LeaseHeld

    monkeypatch.setenv("RUN_LEASE_SECONDS", "3")
    path = str(tmp_path / "runs" / "Hopper-v5__1.lease")
    first, second = Lease(path, "a"), Lease(path, "b")
    first.take()
    stop = threading.Event()

    def renew() -> None:
        while not stop.is_set():
            assert first.keep()
            time.sleep(0.05)

    renewer = threading.Thread(target=renew)
    renewer.start()
    try:
        with pytest.raises(LeaseHeld, match="is held by a:"):
            second.take()
    finally:
        stop.set()
        renewer.join()
    time.sleep(3.2)  # the first stops renewing: its lease goes stale
    second.take()
    assert json.loads(Path(path).read_text())["owner"] == second.owner
    assert not first.keep(), "the first attempt must learn that it lost the folder"
    first.drop()
    assert Path(path).exists(), "dropping a lease one no longer holds leaves the holder's"
    second.drop()
    assert not Path(path).exists()


def test_orphaned_work_folders_of_dead_workers_are_removed(tmp_path, monkeypatch):
    import tempfile

    from ray_cluster import WORK_PREFIX, remove_orphaned_work_folders

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan = tmp_path / f"{WORK_PREFIX}{dead.pid}_abc"
    alive = tmp_path / f"{WORK_PREFIX}{os.getpid()}_def"
    for folder in (orphan, alive):
        (folder / "runs").mkdir(parents=True)
    remove_orphaned_work_folders()
    assert not orphan.exists() and alive.exists()


@pytest.mark.slow
def test_a_node_lost_with_storage_resumes_the_run_from_its_checkpoint_on_another_node(tmp_path, monkeypatch):
    """With --storage the run's folder outlives its node: the retry on node B resumes from the checkpoint that the
    trainer on A saved (run.json records the resume), once A's lease on the folder has gone stale."""
    from ray.cluster_utils import Cluster

    monkeypatch.setenv("RUN_LEASE_SECONDS", "4")  # read by the nodes' workers, which inherit this environment
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        node_a = cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        storage = tmp_path / "shared"
        sweep = ["--envs", "Pendulum-v1", "--impls", "ppo", "--seeds", "1", "--storage", str(storage)]
        # 100 iterations: the first checkpoint (the 25th) leaves 75 to run after node A is removed
        proc = start_learning(tmp_path, cluster.address, *sweep, "--total-timesteps", "51200", *SHORT[2:])
        output: list[str] = []
        reader = threading.Thread(target=lambda: output.extend(proc.stdout), daemon=True)
        reader.start()
        folder = storage / "runs" / "bench" / "ppo" / "Pendulum-v1__1"
        deadline = time.time() + SAFETY_NET
        while time.time() < deadline and not (folder / "checkpoint.pt").is_file():
            time.sleep(0.5)
        assert (folder / "checkpoint.pt").is_file(), "".join(output)[-3000:]
        cluster.remove_node(node_a)
        node_b = cluster.add_node(num_cpus=1)
        proc.wait(timeout=SAFETY_NET)
        reader.join(timeout=10)
        text = "".join(output)
        assert proc.returncode == 0, text[-3000:]
        assert json.loads((folder / "summary.json").read_text())["env_steps"] == 51200
        assert json.loads((folder / "node.json").read_text())["node_id"] == node_b.node_id, text
        resumes = json.loads((folder / "run.json").read_text())["resumes"]
        assert len(resumes) == 1 and resumes[0]["at_step"] > 0, "the retry resumed from the checkpoint"
        assert not list(folder.parent.glob("*.lease")), "the lease is dropped when the run ends"
    finally:
        cluster.shutdown()
