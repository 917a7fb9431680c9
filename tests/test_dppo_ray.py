"""End-to-end tests of dppo_ray.py, run as a user runs it: a subprocess in a fresh working directory, on local Ray,
on a simulated 2-node Ray cluster, and in --no-ray mode."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.conftest import (
    REPO,
    SAFETY_NET,
    OwnProcesses,
    run_forked,
    run_python,
    tensorboard_events,
    wait_until_trained,
)

SCRIPT = REPO / "dppo_ray.py"

CARTPOLE = ["--env-id", "CartPole-v1", "--num-actors", "2", "--num-envs-per-actor", "2", "--num-steps", "128"]
CARTPOLE += ["--num-minibatches", "4", "--update-epochs", "4", "--learning-rate", "2.5e-4", "--ent-coef", "0.01"]
CARTPOLE += ["--quiet"]


def run(
    args: list[str], cwd: Path, timeout: float = SAFETY_NET, env: dict | None = None, own: OwnProcesses | None = None
) -> subprocess.CompletedProcess:
    """dppo_ray.py run to its end; through `own` where the test checks what it leaves running; forked from a process
    that has imported torch (run_forked) where it starts no Ray."""
    if own is not None:
        return own.run(SCRIPT, args, cwd, timeout, env)
    return (run_forked if "--no-ray" in args else run_python)(SCRIPT, args, cwd, timeout, env)


def summary(cwd: Path, name: str) -> dict:
    return json.loads((cwd / "runs" / name / "summary.json").read_text())


def scalars(cwd: Path, name: str, tag: str) -> list[float]:
    return [e.value for e in tensorboard_events(cwd / "runs" / name).Scalars(tag)]


@pytest.fixture
def own():
    """The processes the test's runs start (not those of another Ray job or cluster on this machine); any still running
    at its end are killed, so that a failed test does not load the machine for the tests after it."""
    processes = OwnProcesses()
    yield processes
    processes.kill()


@pytest.mark.slow
def test_own_processes_are_the_runs_and_no_others(tmp_path, own):
    """What the check that a run left nothing behind counts: a process with the test's tag in its environment, or one
    in the session of a script the test started (though its environment lost the tag, as /proc shows Ray's agents'),
    even once that script has ended; not one started beside them, as another Ray job's would be, nor another test's."""
    sleep = ["/bin/sh", "-c", "exec sleep 3600"]  # alive until killed, however slowly the test runs
    spawner = tmp_path / "spawn.py"
    quiet = "stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL"
    spawner.write_text(f"import subprocess\nprint(subprocess.Popen({sleep!r}, env={{}}, {quiet}).pid, flush=True)\n")
    script = own.start(spawner, cwd=tmp_path)
    in_session = int(script.stdout.readline())
    script.communicate(timeout=SAFETY_NET)
    tagged = subprocess.Popen(sleep, env=own.env(os.environ))
    others = [subprocess.Popen(sleep), subprocess.Popen(sleep, env=OwnProcesses().env(os.environ))]
    try:
        deadline = time.monotonic() + SAFETY_NET  # /proc shows the tag once the forked child has exec'd with it
        while tagged.pid not in own.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert set(own.alive()) == {in_session, tagged.pid}
        assert set(own.left_behind(within=1)) == {in_session, tagged.pid}, "a check that can fail"
        own.kill()
        assert all(p.poll() is None for p in [tagged, *others]), "kill() stays within the scripts' sessions"
        tagged.kill()
        tagged.wait(timeout=10)
        assert not own.left_behind(), "killed, and the ended ones are not counted"
    finally:
        for p in [tagged, *others]:
            p.kill()
            p.wait()


@pytest.mark.slow
def test_sync_learns_cartpole_and_evaluates(tmp_path):
    """Sync DPPO learns CartPole. Its actors run in process (--no-ray): a sync run trains the same run there as on Ray,
    bit for bit (test_sync_mode_is_reproducible_on_ray_and_in_process_alike), and what Ray adds is tested apart."""
    # seed 1 returns 500 from about 45,000 steps on: the last 100 episodes, about 50,000 steps, are all after it
    args = [*CARTPOLE, "--total-timesteps", "100000", "--run-name", "cp", "--save-model", "--no-ray"]
    result = run(args, tmp_path, 600)
    assert result.returncode == 0, result.stderr
    s = summary(tmp_path, "cp")
    assert s["status"] == "completed" and s["env_steps"] == 99840
    assert s["mean_return_last_episodes"] >= 475, s["mean_return_last_episodes"]
    assert scalars(tmp_path, "cp", "charts/policy_lag_max") == [0.0] * s["learner_updates"], "sync: no stale data"
    for tag in ["losses/approx_kl", "charts/SPS", "perf/learner_update_seconds", "perf/learner_wait_seconds"]:
        assert scalars(tmp_path, "cp", tag), tag
    evaluation = run(["--eval-checkpoint", str(tmp_path / "runs" / "cp" / "dppo_ray.model"), "--no-ray"], tmp_path)
    assert evaluation.returncode == 0, evaluation.stderr
    assert float(evaluation.stdout.split("mean return ")[1].split(" ")[0]) >= 475
    assert sorted(os.listdir(tmp_path)) == ["runs"]


@pytest.mark.slow
def test_sync_mode_is_reproducible_on_ray_and_in_process_alike(tmp_path):
    """The same seed trains the same run whether its actors are Ray's processes or objects in the learner's."""
    args = [*CARTPOLE, "--total-timesteps", "4096", "--run-name", "s", "--seed", "5"]
    for folder, where in (("a", []), ("b", ["--no-ray"])):
        (tmp_path / folder).mkdir()
        result = run([*args, *where], tmp_path / folder)
        assert result.returncode == 0, result.stderr
    for tag in ["charts/episodic_return", "losses/value_loss", "losses/approx_kl"]:
        assert scalars(tmp_path / "a", "s", tag) == scalars(tmp_path / "b", "s", tag), tag
    weights = [torch.load(tmp_path / f / "runs" / "s" / "checkpoint.pt", weights_only=True)["agent"] for f in "ab"]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


@pytest.mark.slow
def test_async_bounds_policy_lag_and_counts_drops(tmp_path):
    """With --max-policy-lag 0, the rollout each actor samples while the learner updates is one version old and is
    dropped; only fresh rollouts are trained on. The module:id env form must resolve inside the actors."""
    args = ["--env-id", "tests.envs:Truncating-v0", "--mode", "async", "--max-policy-lag", "0", "--num-steps", "64"]
    args += ["--num-minibatches", "2", "--update-epochs", "2", "--total-timesteps", "2560", "--run-name", "a"]
    result = run([*args, "--quiet"], tmp_path)
    assert result.returncode == 0, result.stderr
    s = summary(tmp_path, "a")
    assert s["dropped_rollouts"] > 0 and s["learner_updates"] == 20
    assert s["env_steps"] == 64 * (2 * 20 + s["dropped_rollouts"]), "dropped rollouts' steps count too"
    assert set(scalars(tmp_path, "a", "charts/policy_lag_max")) == {0.0}
    assert scalars(tmp_path, "a", "charts/dropped_rollouts")[-1] == s["dropped_rollouts"]


def test_async_default_lag_is_logged_and_within_bound(tmp_path):
    """What async mode promises however fast each actor is: every update trains one batch (2 actors x 2 envs x 128
    steps), so 16 updates for 8192 steps, and no accepted rollout is older than --max-policy-lag. A rollout dropped for
    staleness (an actor slowed by a busy machine) is not trained, but its env steps count: env_steps is 8192 plus 256
    per dropped rollout, and at most one rollout per actor is dropped per update."""
    args = [*CARTPOLE, "--mode", "async", "--max-policy-lag", "2", "--total-timesteps", "8192", "--run-name", "b"]
    result = run(args, tmp_path)
    assert result.returncode == 0, result.stderr
    lag_max = scalars(tmp_path, "b", "charts/policy_lag_max")
    lag_mean = scalars(tmp_path, "b", "charts/policy_lag_mean")
    # from the second update on, the first rollout to arrive was asked for before the first broadcast: lag >= 1
    assert max(lag_max) <= 2 and max(lag_max) >= 1, "async actors sample while the learner updates"
    assert all(0 <= m <= 2 for m in lag_mean)
    s = summary(tmp_path, "b")
    assert s["status"] == "completed" and s["learner_updates"] == 16
    assert 0 <= s["dropped_rollouts"] <= 2 * 16, s["dropped_rollouts"]
    assert s["env_steps"] == 8192 + 256 * s["dropped_rollouts"], "trained steps, plus the dropped rollouts' steps"


@pytest.mark.slow
@pytest.mark.parametrize("sync_every, max_policy_lag", [(1, 0), (4, 0), (4, 1), (4, 2), (10, 3), (3, 8)])
def test_async_never_stalls_in_process(tmp_path, sync_every, max_policy_lag):
    """Every combination finishes: in async mode the weights also go out before the lag window closes on every
    rollout in flight (with --sync-every 4 and the default lag of 2 the run used to stop after 3 updates)."""
    args = ["--env-id", "tests.envs:Truncating-v0", "--mode", "async", "--no-ray", "--num-steps", "32"]
    args += ["--sync-every", str(sync_every), "--max-policy-lag", str(max_policy_lag), "--num-minibatches", "2"]
    args += ["--update-epochs", "1", "--total-timesteps", "1280", "--run-name", "g", "--quiet"]
    result = run(args, tmp_path, timeout=SAFETY_NET)
    assert result.returncode == 0, result.stderr
    s = summary(tmp_path, "g")
    assert s["status"] == "completed" and s["learner_updates"] == 20
    assert max(scalars(tmp_path, "g", "charts/policy_lag_max")) <= max_policy_lag


@pytest.mark.slow
@pytest.mark.parametrize("sync_every, max_policy_lag", [(4, 2)])  # the case that stalled; the others run in process
def test_async_never_stalls_on_ray(tmp_path, sync_every, max_policy_lag):
    args = ["--env-id", "tests.envs:Truncating-v0", "--mode", "async", "--num-steps", "64", "--num-minibatches", "2"]
    args += ["--sync-every", str(sync_every), "--max-policy-lag", str(max_policy_lag), "--update-epochs", "2"]
    args += ["--total-timesteps", "3840", "--run-name", "r", "--quiet"]
    result = run(args, tmp_path, timeout=SAFETY_NET)
    assert result.returncode == 0, result.stderr
    s = summary(tmp_path, "r")
    assert s["status"] == "completed" and s["learner_updates"] == 30
    assert max(scalars(tmp_path, "r", "charts/policy_lag_max")) <= max_policy_lag


@pytest.mark.slow
def test_nan_observations_are_dropped_not_merged(tmp_path):
    """Actors send moments of the observations they met: NaN rows must be left out before the learner merges them,
    or the statistics (broadcast to every actor) would spoil every later batch. In process: the merge is the
    learner's, wherever the actors run."""
    args = ["--env-id", "tests.envs:NanObsSometimes-v0", "--num-steps", "128", "--num-minibatches", "2"]
    args += ["--update-epochs", "2", "--total-timesteps", "5120", "--run-name", "n", "--quiet", "--mode", "async"]
    args += ["--no-ray"]
    result = run(args, tmp_path)
    assert result.returncode == 0, result.stderr
    s = summary(tmp_path, "n")
    # about one sample in 97 of those trained on (rollouts dropped for staleness are not counted)
    assert s["status"] == "completed" and s["bad_batches"] == 0 and s["dropped_samples"] >= 20
    ckpt = torch.load(tmp_path / "runs" / "n" / "checkpoint.pt", weights_only=True)
    assert all(torch.isfinite(v).all() for v in ckpt["obs_rms"].values())
    assert all(np.isfinite(v) for v in scalars(tmp_path, "n", "losses/value_loss"))


@pytest.mark.slow
def test_always_nan_env_stops_with_one_line_and_no_ray_left(tmp_path, own):
    args = ["--env-id", "tests.envs:AlwaysNan-v0", "--num-steps", "64", "--num-minibatches", "2"]
    result = run([*args, "--total-timesteps", "2560", "--run-name", "x", "--quiet"], tmp_path, own=own)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "stopping: 3 bad batches in a row" in errors[0], result.stderr
    assert "Traceback" not in result.stderr and summary(tmp_path, "x")["status"] == "stopped_by_guard"
    assert not (left := own.left_behind()), f"the run's processes were left behind: {left}"


@pytest.mark.slow
def test_killed_actor_is_restarted_and_the_run_completes(tmp_path):
    marker = tmp_path / "crashed"
    args = ["--env-id", "tests.envs:CrashOnce-v0", "--num-steps", "128", "--num-minibatches", "2"]
    args += ["--update-epochs", "2", "--total-timesteps", "2560", "--run-name", "k", "--quiet"]
    result = run(args, tmp_path, env={"DPPO_CRASH_MARKER": str(marker)})
    assert result.returncode == 0, result.stderr
    assert marker.exists(), "the test env should have killed an actor"
    assert "warning: actor" in result.stderr and "failed" in result.stderr
    s = summary(tmp_path, "k")
    assert s["status"] == "completed" and s["env_steps"] == 2560
    assert s["actor_restarts"] >= 1 and s["lost_rollouts"] >= 1


FAULT = ["--num-steps", "64", "--num-minibatches", "2", "--update-epochs", "2", "--quiet"]


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


# The restarted actor's start (a new process importing torch) and first rollout must fit in the timeout too, which 4 s
# did not always on a loaded machine (two test workers beside each other); the other actor samples the rest alone for
# longer than that in async mode, so the timeout still comes first.
@pytest.mark.slow
@pytest.mark.parametrize("mode, total, timeout", [("sync", 2560, 8), ("async", 6400, 8)])
def test_an_env_that_hangs_once_gets_its_actor_restarted_and_the_run_does_every_step(
    tmp_path, own, mode, total, timeout
):
    """A simulator that deadlocks in one step: its actor's rollout is late, the actor is killed and restarted, and the
    run trains every step it was asked for. In async mode the other actor samples meanwhile: the hang comes in the
    first rollout (the first env to reach its 300th step, 256 of them the warm-up's), and each env step sleeps 2 ms,
    so the 100 rollouts of 64 steps that the run needs take the other actor alone 12.8 s at least: longer than the
    timeout on any machine. There, a rollout dropped for staleness (on a busy machine, the restarted actor's first,
    say) is not trained, but its steps count."""
    marker = tmp_path / "hung"
    args = ["--env-id", "tests.envs:HangOnce-v0", "--mode", mode, *FAULT, "--rollout-timeout", str(timeout)]
    args += ["--total-timesteps", str(total), "--run-name", "h"]
    result = run(args, tmp_path, env={"DPPO_HANG_MARKER": str(marker)}, own=own)
    assert result.returncode == 0, result.stderr
    assert marker.exists(), "the test env should have hung"
    assert f"sent no rollout within --rollout-timeout {timeout} s; its rollout is lost; restarted" in result.stderr
    s = summary(tmp_path, "h")
    assert s["status"] == "completed" and s["learner_updates"] == total // 128
    assert s["env_steps"] == total + 64 * s["dropped_rollouts"], "every step trained, and the dropped ones counted"
    assert mode == "async" or s["dropped_rollouts"] == 0, "sync mode drops nothing"
    assert s["actor_restarts"] == 1 and s["lost_rollouts"] == 1
    assert not (left := own.left_behind()), f"processes of the run (the hung actor's among them) left behind: {left}"


@pytest.mark.parametrize(
    "env_id, flags, cause",
    [
        # an exception inside the env: no restart helps, the run stops at once
        ("RaisesOnReset-v0", [], "a rollout actor failed: RuntimeError: simulator lost its connection on reset 200"),
        # the process dies on every reset after a while, and again after each restart: stopped past the cap
        ("DiesOnReset-v0", ["--max-actor-restarts", "2"], "3 actor restarts, past --max-actor-restarts 2"),
    ],
)
@pytest.mark.slow
def test_an_env_that_breaks_for_good_stops_the_run_with_a_checkpoint(tmp_path, own, env_id, flags, cause):
    args = ["--env-id", f"tests.envs:{env_id}", *FAULT, *flags, "--total-timesteps", "1000000", "--run-name", "b"]
    result = run(args, tmp_path, env={"PYTHONWARNINGS": "ignore"}, own=own)
    assert result.returncode == 1, result.stderr
    assert last_line(result.stderr).startswith("dppo_ray.py: error: ") and cause in last_line(result.stderr)
    assert "Traceback" not in result.stderr and "Unhandled error" not in result.stderr, result.stderr
    s = summary(tmp_path, "b")
    assert s["status"] == "failed" and s["learner_updates"] >= 1, "the iterations trained before it are kept"
    ckpt = torch.load(tmp_path / "runs" / "b" / "checkpoint.pt", weights_only=True)
    assert ckpt["iteration"] == s["learner_updates"] and ckpt["global_step"] > 0
    assert f"--resume {Path('runs', 'b', 'checkpoint.pt')}" in result.stdout
    assert not (left := own.left_behind()), f"the run's processes were left behind: {left}"


@pytest.mark.parametrize(
    "env_id, cause",
    [
        # its process dies on the first reset, in the actor's constructor: Ray's restarts of it are bounded too
        ("DiesOnReset-v0", "past --max-actor-restarts 1"),
        # an exception there would only be raised again: no restart
        ("RaisesOnReset-v0", "rollout actor 0 failed as it started: RuntimeError: simulator lost its connection"),
    ],
)
@pytest.mark.slow
def test_an_actor_that_fails_as_it_starts_stops_the_run(tmp_path, own, env_id, cause):
    args = ["--env-id", f"tests.envs:{env_id}", *FAULT, "--max-actor-restarts", "1", "--run-name", "d"]
    args += ["--total-timesteps", "1000000"]
    result = run(args, tmp_path, env={"DPPO_RESETS_BEFORE_FAILURE": "1"}, own=own)
    assert result.returncode == 1, result.stderr
    assert cause in last_line(result.stderr) and "Traceback" not in result.stderr, result.stderr
    assert summary(tmp_path, "d")["status"] == "failed" and (tmp_path / "runs" / "d" / "checkpoint.pt").is_file()
    assert not (left := own.left_behind()), f"the run's processes were left behind: {left}"


@pytest.mark.slow
def test_sigterm_while_an_env_hangs_saves_a_checkpoint_at_once(tmp_path, own):
    """The learner waits for rollouts in short steps: a preemption's SIGTERM does not wait out the rollout timeout.
    That timeout is an hour here, so a run that waited it out could not end within the 5 minutes the test gives it
    (a safety net, many times what a busy machine takes to save, shut Ray down and exit)."""
    marker = tmp_path / "hung"
    args = ["--env-id", "tests.envs:HangOnce-v0", *FAULT, "--total-timesteps", "1000000", "--run-name", "t"]
    args += ["--rollout-timeout", "3600"]
    # the env hangs in a rollout's step, inside the training loop: the signal cannot come before it
    proc = own.start(SCRIPT, args, tmp_path, env={"DPPO_HANG_MARKER": str(marker)})
    deadline = time.monotonic() + SAFETY_NET  # the wait ends when the env hangs, or the run ends
    while time.monotonic() < deadline and not marker.exists() and proc.poll() is None:
        time.sleep(0.2)
    assert marker.exists(), "the test env should have hung"
    time.sleep(1)
    proc.send_signal(signal.SIGTERM)
    try:
        _, stderr = proc.communicate(timeout=SAFETY_NET)
    except subprocess.TimeoutExpired:
        pytest.fail("SIGTERM did not stop the run: it waits for the hung env (--rollout-timeout 3600)")
    assert proc.returncode == 143, stderr
    assert "Traceback" not in stderr
    assert summary(tmp_path, "t")["status"] == "interrupted" and (tmp_path / "runs" / "t" / "checkpoint.pt").is_file()
    assert not (left := own.left_behind()), f"the run's processes were left behind: {left}"


@pytest.mark.slow
def test_two_node_cluster_places_actors_on_both_nodes(tmp_path):
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        args = [*CARTPOLE, "--ray-address", cluster.address, "--total-timesteps", "2048", "--run-name", "c"]
        result = run(args, tmp_path)
        assert result.returncode == 0, result.stderr
        assert summary(tmp_path, "c")["actor_nodes"] == 2
    finally:
        cluster.shutdown()


@pytest.mark.slow
def test_a_run_begun_in_process_resumes_on_ray(tmp_path):
    """--no-ray is the machine's choice, not the run's: the checkpoint does not carry it, and the resumed run's actors
    are Ray's, seeded anew from the step it resumes at."""
    base = [*CARTPOLE, "--run-name", "r"]
    first = run([*base, "--no-ray", "--total-timesteps", "2048"], tmp_path)
    assert first.returncode == 0, first.stderr
    ckpt = tmp_path / "runs" / "r" / "checkpoint.pt"
    assert torch.load(ckpt, weights_only=True)["iteration"] == 4 and summary(tmp_path, "r")["actor_nodes"] == 0
    second = run([*base, "--total-timesteps", "4096", "--resume", str(ckpt)], tmp_path)
    assert second.returncode == 0, second.stderr
    s = summary(tmp_path, "r")
    assert s["env_steps"] == 4096 and s["learner_updates"] == 8 and s["actor_nodes"] == 1
    acc = EventAccumulator(str(tmp_path / "runs" / "r"), size_guidance={"scalars": 0})
    acc.Reload()
    assert sorted({e.step for e in acc.Scalars("losses/approx_kl")}) == [512 * i for i in range(1, 9)]


@pytest.mark.slow
@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_or_sigterm_checkpoints_and_leaves_no_ray_processes(tmp_path, own, signum, status):
    """Ctrl-C, or the SIGTERM with which SLURM, Kubernetes and spot instances preempt a job."""
    args = [*CARTPOLE, "--total-timesteps", "10000000", "--run-name", "i", "--checkpoint-every", "0"]
    proc = own.start(SCRIPT, args, tmp_path, stdout=None)
    run_dir = tmp_path / "runs" / "i"
    # the signal must find the run training: one at step 0 would leave no step to checkpoint
    assert wait_until_trained(run_dir, proc), "the run never trained"
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=SAFETY_NET)
    assert proc.returncode == status, stderr
    assert "Traceback" not in stderr
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert ckpt["global_step"] > 0 and summary(tmp_path, "i")["status"] == "interrupted"
    assert not (left := own.left_behind()), f"the run's processes were left behind: {left}"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--env-id", "NoSuchEnv-v0"], "cannot make env 'NoSuchEnv-v0'"),
        (["--env-id", "no_such_module:Env-v0"], "cannot make env 'no_such_module:Env-v0'"),
        (["--num-minibatches", "3"], "--num-minibatches 3 does not divide the batch"),
        (["--num-actors", "0"], "--num-actors must be positive"),
        (["--ray-address", "127.0.0.1:1"], "cannot reach Ray at --ray-address 127.0.0.1:1"),
        (["--num-actors", "3", "--actor-cpus", "1"], "needs 3 CPUs; the cluster has"),
        (["--num-actors", "2", "--actor-cpus", "1.5"], "needs 3 CPUs; the cluster has"),
        (["--resume", "missing.pt"], "checkpoint not found: missing.pt"),
        (["--eval-checkpoint", "missing.pt"], "checkpoint not found: missing.pt"),
        (["--no-ray", "--ray-address", "auto"], "do not fit together"),
        (["--stale-correction", "decoupled"], "--stale-correction needs stale data"),
    ],
)
@pytest.mark.slow
def test_bad_input_one_line_error(tmp_path, args, message):
    result = run(["--env-id", "CartPole-v1", *args, "--total-timesteps", "4096", "--quiet"], tmp_path)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("dppo_ray.py: error:") and message in lines[0], lines[0]
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_ray_address_auto_with_no_ray_running_is_one_line_error(tmp_path, alone_with_ray):
    """`auto` joins any Ray on the machine, one that a test running beside it started included: this test runs alone
    (alone_with_ray)."""
    result = run(["--env-id", "CartPole-v1", "--ray-address", "auto", "--total-timesteps", "4096", "--quiet"], tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dppo_ray.py: error: cannot reach Ray at --ray-address auto"), lines
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_actors_share_the_cpus_when_one_each_does_not_fit(tmp_path):
    actors = str((os.cpu_count() or 2) + 2)
    args = [
        "--env-id",
        "tests.envs:Truncating-v0",
        "--num-actors",
        actors,
        "--num-steps",
        "32",
        "--num-minibatches",
        "2",
    ]
    args += ["--update-epochs", "1", "--total-timesteps", str(32 * int(actors) * 2), "--quiet"]
    result = run(args, tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"{actors} actors share" in result.stdout and "--actor-cpus" in result.stdout
    assert (
        "--no-no-ray"
        not in subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True).stdout
    )


@pytest.mark.slow
def test_corrupt_checkpoint_refused(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"garbage")
    result = run(["--eval-checkpoint", str(bad)], tmp_path)
    assert result.returncode == 2 and f"cannot load checkpoint {bad}" in result.stderr


def test_stale_correction_defaults_to_decoupled_only_where_data_can_be_stale():
    import dppo_ray

    for mode, sync_every, expected in [("async", 1, "decoupled"), ("sync", 2, "decoupled"), ("sync", 1, "none")]:
        args = dppo_ray.Args(env_id="Pendulum-v1", mode=mode, sync_every=sync_every)
        dppo_ray.validate_args(args)
        assert args.stale_correction == expected, (mode, sync_every)
    args = dppo_ray.Args(env_id="Pendulum-v1", mode="async", stale_correction="none")
    dppo_ray.validate_args(args)
    assert args.stale_correction == "none", "an explicit choice stays"
