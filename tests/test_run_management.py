"""Tests of run_management.py, mostly end to end through ppo_continuous.py as a user runs it (a subprocess in a fresh
working directory): the run folder, MuJoCo's log, the numerical guard's counting and stopping, health warnings,
signals (Ctrl-C), one-line errors of the command line (--capture-video without moviepy among them), the line saying
--total-timesteps was rounded down, summary.json's --save-model evaluation and library versions, and a machine
without a C++ compiler for torch.compile."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from tests.conftest import (
    PPO_SCRIPT,
    REPO,
    SAFETY_NET,
    SMALL,
    VALUE_FIT,
    run_ppo,
    run_python,
    scalars,
    start_python,
    tensorboard_events,
    wait_until_trained,
)

sys.path.insert(0, str(REPO))

import run_management  # noqa: E402


@pytest.mark.slow
def test_mujoco_run_leaves_nothing_in_cwd(tmp_path):
    result = run_ppo(
        ["--env-id", "Hopper-v5", "--total-timesteps", "512", "--run-name", "h", *SMALL], tmp_path, forked=True
    )
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(tmp_path)) == ["runs"], "MUJOCO_LOG.TXT or other files leaked into the cwd"
    assert "charts/episodic_return" in tensorboard_events(tmp_path / "runs" / "h").Tags()["scalars"]


# ---------------------------------------------------------------------------------------------------------------------
# Numerical guard, health warnings, Ctrl-C
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_numerical_guard_skips_bad_batches_then_stops(tmp_path):
    # NaN rewards start after 600 steps of each sub-env: iterations 1-4 (128 steps per env) are clean, iteration 5 has
    # 88 good steps of 128 per env and trains without the other 80 samples, and from iteration 6 nothing is usable.
    args = ["--env-id", "tests.envs:NanReward-v0", "--run-name", "g", "--checkpoint-every", "1", *VALUE_FIT]
    result = run_ppo([*args, "--total-timesteps", "25600"], tmp_path, forked=True)
    assert result.returncode == 1
    assert result.stderr.count("warning: skipped a bad batch") == 3
    last = result.stderr.strip().splitlines()[-1]
    assert "error: stopping: 3 bad batches in a row (last: only 0 of 256 samples are usable" in last, last
    assert "Traceback" not in result.stderr
    ckpt = torch.load(tmp_path / "runs" / "g" / "checkpoint.pt", weights_only=True)
    assert ckpt["iteration"] == 5, "the last good checkpoint is kept"
    assert all(torch.isfinite(v).all() for v in ckpt["agent"].values())
    summary = json.loads((tmp_path / "runs" / "g" / "summary.json").read_text())
    assert summary["status"] == "stopped_by_guard" and summary["bad_batches"] == 3
    acc = tensorboard_events(tmp_path / "runs" / "g")
    assert [e.value for e in acc.Scalars("guard/bad_batches")] == [1, 2, 3]
    assert [e.value for e in acc.Scalars("guard/dropped_samples")][0] == 80


@pytest.mark.slow
@pytest.mark.parametrize("env_id", ["tests.envs:NanSometimes-v0", "tests.envs:NanObsSometimes-v0"])
def test_flaky_env_trains_to_completion_dropping_bad_samples(tmp_path, env_id):
    """One NaN reward or observation every 97 steps spoils no batch: those samples are dropped, counted and
    reported, and the run completes with finite losses and statistics. (A NaN observation that ends a 5-step episode
    is a final observation, not a sample: it only stops the bootstrap.)"""
    args = ["--env-id", env_id, "--run-name", "f", "--total-timesteps", "4096", *SMALL]
    result = run_ppo(args, tmp_path, forked=True)
    assert result.returncode == 0, result.stderr
    assert "warning: dropped" in result.stderr and "skipped a bad batch" not in result.stderr
    summary = json.loads((tmp_path / "runs" / "f" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["env_steps"] == 4096
    assert summary["dropped_samples"] >= 4096 // 97 * 3 // 4 and summary["bad_batches"] == 0
    acc = tensorboard_events(tmp_path / "runs" / "f")
    assert all(np.isfinite(e.value) for e in acc.Scalars("losses/value_loss"))
    ckpt = torch.load(tmp_path / "runs" / "f" / "checkpoint.pt", weights_only=True)
    assert all(torch.isfinite(v).all() for v in ckpt["obs_rms"].values())
    assert all(torch.isfinite(v).all() for v in ckpt["return_rms"].values())


@pytest.mark.slow
def test_always_nan_env_stops_with_one_line(tmp_path):
    args = ["--env-id", "tests.envs:AlwaysNan-v0", "--run-name", "n", "--total-timesteps", "4096", *SMALL]
    result = run_ppo(args, tmp_path, forked=True)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "stopping: 3 bad batches in a row" in errors[0], result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_an_env_that_never_returns_stops_the_run_at_its_rollout_timeout_with_a_checkpoint_and_one_line(tmp_path):
    """--rollout-timeout: an env stuck in Python (a sleep), in C code that no signal interrupts (os.read on a pipe
    nobody writes, every signal blocked in its thread), and one of dppo_ray.py's in-process actors: each run stops
    on its own within the timeout plus a margin, exit status 124, with the checkpoint of its last update (it
    resumes) and a last line naming the env and the step; summary.json says why. Under --num-seeds 2, the seed whose
    env hangs (the first to reach its 300th step) stops so while the other trains every step, and the closing table
    says which timed out, and why."""
    timeout = 3
    shape = ["--num-steps", "64", "--num-minibatches", "4", "--update-epochs", "2", "--obs-warmup-steps", "100"]
    common = [*shape, "--quiet", "--rollout-timeout", str(timeout), "--total-timesteps", "4096"]
    runs = {  # every env hangs on its 300th step (the warm-up's count): the 4th rollout, after three updates
        "python": (PPO_SCRIPT, ["--env-id", "tests.envs:HangOnce-v0", "--num-envs", "4"]),
        "in_c": (PPO_SCRIPT, ["--env-id", "tests.envs:HangOnceInC-v0", "--num-envs", "4"]),
        "dppo": (REPO / "dppo_ray.py", ["--env-id", "tests.envs:HangOnce-v0", "--no-ray", "--num-actors", "2"]),
    }
    seeds = start_python(
        PPO_SCRIPT,
        [*runs["python"][1], *common, "--run-name", "seeds", "--num-seeds", "2"],
        tmp_path,
        {"DPPO_HANG_MARKER": str(tmp_path / "seeds.hung")},
    )
    processes = {}
    for name, (script, args) in runs.items():
        marker = tmp_path / f"{name}.hung"
        env = {"DPPO_HANG_MARKER": str(marker)}
        processes[name] = (marker, start_python(script, [*args, *common, "--run-name", name], tmp_path, env))
    for name, (marker, process) in processes.items():
        _, stderr = process.communicate(timeout=SAFETY_NET)
        waited = time.time() - marker.stat().st_mtime  # from the moment the env hung to the run's end
        waits = 2 * timeout if name == "dppo" else timeout  # --no-ray: the actors' rollouts together
        assert process.returncode == 124, (name, stderr[-2000:])
        assert waited < waits + 60, (name, waited)
        lines = stderr.strip().splitlines()
        assert "Traceback" not in stderr, (name, stderr[-2000:])
        env_id = runs[name][1][1]
        assert lines[-1].startswith(f"{runs[name][0].name}: error: --rollout-timeout: env "), (name, lines[-1])
        assert f"({env_id}) did not answer within {waits} s, at step " in lines[-1], (name, lines[-1])
        assert "envs.py" in lines[-1] and "(step)" in lines[-1], (name, lines[-1])
        summary = json.loads((tmp_path / "runs" / name / "summary.json").read_text())
        assert summary["status"] == "failed" and summary["error"] in lines[-1], (name, summary)
        ckpt = torch.load(tmp_path / "runs" / name / "checkpoint.pt", weights_only=False)
        assert ckpt["iteration"] == 3, (name, ckpt["iteration"])
    table, stderr = seeds.communicate(timeout=SAFETY_NET)
    assert seeds.returncode == 1, stderr[-2000:]
    rows = {int(line.split()[0]): line for line in table.splitlines() if line.split()[:1] in (["1"], ["2"])}
    assert sorted(rows) == [1, 2], table
    stuck = [seed for seed, row in rows.items() if "timed out" in row]
    assert len(stuck) == 1 and "--rollout-timeout: env " in rows[stuck[0]], table
    healthy = 3 - stuck[0]
    assert "completed" in rows[healthy] and "4096" in rows[healthy], table
    healthy_summary = json.loads((tmp_path / "runs" / f"seeds__{healthy}" / "summary.json").read_text())
    assert healthy_summary["status"] == "completed" and healthy_summary["env_steps"] == 4096
    resumed = run_ppo(["--resume", "runs/in_c/checkpoint.pt", "--quiet"], tmp_path, forked=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads((tmp_path / "runs" / "in_c" / "summary.json").read_text())["env_steps"] == 4096


@pytest.mark.slow
def test_health_warning_is_printed_and_logged(tmp_path):
    result = run_ppo(
        [
            "--env-id",
            "Pendulum-v1",
            "--total-timesteps",
            "3072",
            "--run-name",
            "k",
            *SMALL,
            "--learning-rate",
            "0.1",
            "--update-epochs",
            "4",
        ],
        tmp_path,
        forked=True,
    )
    assert result.returncode == 0, result.stderr
    assert "warning: approx_kl has stayed above 0.02" in result.stderr
    assert "health/high_kl" in tensorboard_events(tmp_path / "runs" / "k").Tags()["scalars"]


@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_that_resumes(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    args = ["--env-id", "Pendulum-v1", "--total-timesteps", "1000000", "--run-name", "i", "--checkpoint-every", "0"]
    proc = subprocess.Popen(
        [sys.executable, str(PPO_SCRIPT), *args, *SMALL],
        cwd=tmp_path,
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    run_dir = tmp_path / "runs" / "i"
    assert wait_until_trained(run_dir, proc), "the run ended before its first update"
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=SAFETY_NET)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "Ctrl-C: saving a checkpoint" in stderr
    assert "interrupted at step" in stdout and "continue with: python ppo_continuous.py --resume" in stdout
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert ckpt["global_step"] > 0 and ckpt["global_step"] % 256 == 0
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"
    total = ckpt["global_step"] + 512
    resumed = run_ppo(
        [
            "--env-id",
            "Pendulum-v1",
            "--total-timesteps",
            str(total),
            "--resume",
            str(run_dir / "checkpoint.pt"),
            *SMALL,
        ],
        tmp_path,
        forked=True,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert torch.load(run_dir / "checkpoint.pt", weights_only=True)["global_step"] == total


# ---------------------------------------------------------------------------------------------------------------------
# Bad input: one line on stderr, non-zero exit, no traceback
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, message",
    [
        (["--env-id", "NoSuchEnv-v0"], "cannot make env 'NoSuchEnv-v0'"),
        (["--env-id", "no_such_module:Env-v0"], "cannot make env 'no_such_module:Env-v0'"),
        (["--env-id", "CartPole-v1"], "needs a continuous (Box) one"),
        (["--num-minibatches", "3"], "--num-minibatches 3 does not divide the batch"),
        (["--num-envs", "0"], "--num-envs must be positive"),
        (["--num-steps", "-5"], "--num-steps must be positive"),
        (["--total-timesteps", "100"], "is less than one batch"),
        (["--learning-rate", "0"], "--learning-rate must be positive"),
        (["--resume", "missing.pt"], "checkpoint not found: missing.pt"),
        (["--eval-checkpoint", "missing.pt"], "checkpoint not found: missing.pt"),
        (["--resume", "a.pt", "--eval-checkpoint", "b.pt"], "do not fit together"),
        (["--track"], "--track needs Weights and Biases: pip install wandb"),
    ],
)
def test_bad_input_one_line_error(tmp_path, args, message):
    if "--track" in args and importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here")
    result = run_ppo(["--env-id", "Pendulum-v1", *args, "--quiet"], tmp_path, timeout=SAFETY_NET, forked=True)
    assert result.returncode == 2
    lines = [line for line in result.stderr.strip().splitlines() if line.strip() and "WARNING" not in line]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("ppo_continuous.py: error:") and message in lines[0], lines[0]
    assert not (tmp_path / "runs").exists(), "a refused run must not leave a run folder behind"


@pytest.mark.parametrize(
    "code",
    [
        "import run_management as rm, gymnasium as gym; rm.quiet_mujoco_log(); gym.make('HalfCheetah-v5').reset()",
        # how every env of the scripts is made (training, evaluation, --eval-checkpoint, load_policy, DPPO's actors)
        "import ppo_continuous; ppo_continuous.make_env('HalfCheetah-v5').reset(seed=0)",
    ],
)
@pytest.mark.slow
def test_mujocos_settotalmass_deprecation_is_not_printed_but_other_warnings_are(tmp_path, capsys, code):
    """Every HalfCheetah env used to print MuJoCo's deprecation of gymnasium's `settotalmass` (two lines on stderr),
    which a user cannot act on; other MuJoCo warnings still reach stderr, and no MUJOCO_LOG.TXT is written."""
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=SAFETY_NET, env=environment
    )
    assert result.returncode == 0, result.stderr
    assert "settotalmass" not in result.stderr
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()
    run_management.mujoco_warning("compiler attribute 'settotalmass' is deprecated and will be removed")
    run_management.mujoco_warning("Nan, Inf or huge value in QACC at DOF 0")
    assert capsys.readouterr().err == "WARNING: Nan, Inf or huge value in QACC at DOF 0\n"


@pytest.mark.slow
@pytest.mark.parametrize("script", ["ppo_continuous.py", "dppo_ray.py"])
def test_capture_video_without_moviepy_is_refused_in_one_line_before_the_run_starts(tmp_path, script):
    """--capture-video writes with moviepy: where it does not import (a moviepy that raises ImportError stands in for
    a missing one, ahead of any installed one on the path), both scripts refuse in one line before making a run."""
    fake = tmp_path / "no_moviepy" / "moviepy"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named moviepy (simulated)')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(fake.parent), str(REPO)])}
    args = ["--env-id", "Pendulum-v1", "--capture-video", "--quiet", *(["--no-ray"] if script == "dppo_ray.py" else [])]
    result = run_python(REPO / script, args, tmp_path, timeout=SAFETY_NET, env=env)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{script}: error: --capture-video needs moviepy") and "(simulated)" in lines[0]
    assert lines[0].endswith("pip install moviepy")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "script, shape",
    [
        ("ppo_continuous.py", ["--num-envs", "4"]),
        ("dppo_ray.py", ["--num-actors", "2", "--num-envs-per-actor", "2", "--no-ray"]),
    ],
)
@pytest.mark.slow
def test_total_timesteps_rounded_down_is_said_and_summary_records_the_evaluation_and_mujoco(tmp_path, script, shape):
    """600 steps in batches of 4 envs x 64 steps: the run trains 512 and says so in one line on stderr as it starts.
    summary.json records --save-model's evaluation (the mean return it prints and logs, its episodes) and MuJoCo's
    version beside torch's and gymnasium's."""
    args = ["--env-id", "Pendulum-v1", "--total-timesteps", "600", "--num-steps", "64", "--num-minibatches", "4"]
    args += ["--update-epochs", "1", "--run-name", "r", "--save-model", "--eval-episodes", "3", "--quiet"]
    result = run_python(REPO / script, [*args, *shape], tmp_path)
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if "--total-timesteps" in line]
    rounded = "--total-timesteps 600 is rounded down to whole batches of 256 steps: 512 steps in 2 iterations"
    assert said == [f"{script}: {rounded}"], result.stderr
    summary = json.loads((tmp_path / "runs" / "r" / "summary.json").read_text())
    assert summary["env_steps"] == 512 and summary["status"] == "completed"
    logged = [value for _, value in scalars(tmp_path / "runs" / "r", "eval/episodic_return")]
    assert summary["eval_episodes"] == 3 == len(logged)
    assert summary["eval_mean_return"] == pytest.approx(np.mean(logged), rel=1e-5)
    assert summary["eval_std_return"] == pytest.approx(np.std(logged), rel=1e-4)
    assert f"eval return {summary['eval_mean_return']:.2f} ± {summary['eval_std_return']:.2f}" in result.stdout
    assert "eval_error" not in summary
    try:
        mujoco = importlib.metadata.version("mujoco")
    except importlib.metadata.PackageNotFoundError:
        mujoco = None
    assert summary["mujoco_version"] == mujoco and summary["torch_version"] == torch.__version__


@pytest.mark.slow
def test_a_machine_without_a_cpp_compiler_trains_with_the_eager_gradient_after_one_line(tmp_path):
    """torch.compile's CPU kernels need a C++ compiler: without one (and with nothing in the compile cache) the run
    says so in one line and trains with the eager gradient, never a traceback."""
    args = [
        "--env-id",
        "Pendulum-v1",
        "--total-timesteps",
        "512",
        "--num-steps",
        "256",
        "--num-minibatches",
        "4",
        "--compile",
    ]
    env = dict(os.environ, PYTHONPATH=str(REPO), CXX=str(tmp_path / "no-such-compiler"))
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "cache")
    out = subprocess.run(
        [sys.executable, str(REPO / "ppo_continuous.py"), *args, "--run-name", "d", "--quiet"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=SAFETY_NET,
    )
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    lines = [line for line in out.stderr.splitlines() if "compiled gradient" in line]
    assert len(lines) == 1 and "compiled gradient off at iteration 1: torch.compile failed (" in lines[0], out.stderr
    assert "C++ compiler" in lines[0] and lines[0].endswith("; eager from now on")
    summary = json.loads((tmp_path / "runs" / "d" / "summary.json").read_text())
    assert summary["fast_paths"]["gradient"].startswith("eager from iteration 1: torch.compile failed")


def test_the_python_floor_is_pyprojects_and_this_python_meets_it():
    """pyproject.toml's requires-python is the floor launcher.py refuses below (in one line, before either script
    imports anything else), and the Python the tests run on (CI's) meets it."""
    import tomllib

    import launcher

    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == ">=" + ".".join(map(str, launcher.PYTHON_FLOOR))
    assert sys.version_info >= launcher.PYTHON_FLOOR


def test_code_version_hashes_the_modules_a_run_imported_and_not_a_scratch_file_beside_them(tmp_path, monkeypatch):
    """A run's code is what it imported from outside the installed packages (and its env id's module), each under its
    path: a scratch .py lying beside the code changes nothing until something imports it."""
    import importlib

    import run_management

    (tmp_path / "scratch_beside.py").write_text("x = 1\n")
    (tmp_path / "my_envs_module.py").write_text("y = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = run_management.code_version(env_id="my_envs_module:Thing-v0")
    assert "scratch_beside" not in before["modules"] and "gae" in before["modules"]
    assert before["modules"]["gae"]["path"] == "gae.py"  # inside the repository: its relative path
    assert before["modules"]["my_envs_module"]["path"] == str(tmp_path / "my_envs_module.py")  # found, not imported
    assert "my_envs_module" not in sys.modules
    assert not any(name.startswith("torch") for name in before["modules"])  # installed packages are not the run's
    assert run_management.code_version(env_id="my_envs_module:Thing-v0")["scripts_sha256"] == before["scripts_sha256"]
    try:
        importlib.import_module("scratch_beside")
        assert "scratch_beside" in run_management.code_version()["modules"]  # once imported, it is the run's code
    finally:
        sys.modules.pop("scratch_beside", None)
    (tmp_path / "my_envs_module.py").write_text("y = 3\n")  # the env's module changed: another run
    after = run_management.code_version(env_id="my_envs_module:Thing-v0")
    assert after["modules"]["my_envs_module"]["sha256"] != before["modules"]["my_envs_module"]["sha256"]
    assert after["scripts_sha256"] != before["scripts_sha256"]


@pytest.mark.parametrize("num_seeds", [1, 2])
def test_a_post_accumulate_grad_hook_in_an_edited_agent_stops_the_run_with_its_checkpoint_and_one_line(
    tmp_path, num_seeds
):
    """An edited copy whose Agent registers a post-accumulate-grad hook, which torch.autograd.grad never runs: the first
    update does not train, the run (each seed) stops with its checkpoint and a line naming the hook, exit status 1."""
    source = (REPO / "ppo_continuous.py").read_text()
    line = "        self.actor_logstd = nn.Parameter(torch.zeros(1, act_dim))\n"
    assert line in source
    hook = "        self.actor_logstd.register_post_accumulate_grad_hook(lambda p: None)\n"
    (tmp_path / "my_ppo.py").write_text(source.replace(line, line + hook))
    args = ["--env-id", "Pendulum-v1", "--total-timesteps", "4096", "--num-seeds", str(num_seeds), "--quiet"]
    result = run_python(tmp_path / "my_ppo.py", [*args, "--run-name", "h"], tmp_path)
    assert result.returncode == 1, result.stderr[-2000:]
    said = "a post-accumulate-grad hook on actor_logstd would never run: the gradient is taken with torch.autograd.grad"
    errors = [line for line in result.stderr.splitlines() if said in line]
    assert len(errors) == num_seeds and "Traceback" not in result.stderr, result.stderr
    folders = [tmp_path / "runs" / "h"] if num_seeds == 1 else sorted((tmp_path / "runs").glob("h*"))
    assert len(folders) == num_seeds
    for folder in folders:
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["status"] == "failed" and summary["env_steps"] == 2048, summary  # one rollout, not trained
        assert (folder / "checkpoint.pt").is_file()


def parent_left_sigint(how: str):
    """A Popen preexec_fn: the child starts with SIGINT as a parent may leave it, `default`, `ignored` (a shell script's
    background job, `python ppo_continuous.py ... &`) or `blocked` (a child of a Ray worker); both survive exec."""

    def prepare() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN if how == "ignored" else signal.SIG_DFL)
        mask = signal.SIG_BLOCK if how == "blocked" else signal.SIG_UNBLOCK
        signal.pthread_sigmask(mask, [signal.SIGINT])

    return prepare


@pytest.mark.slow
@pytest.mark.parametrize("parent", ["default", "ignored", "blocked"])
def test_ctrl_c_while_the_run_starts_is_one_line_and_exit_status_130(tmp_path, parent):
    """Before the training loop takes over the signals (envs made, the compile's start-up), Ctrl-C is one line, never a
    traceback: here while the first env's reset waits for the test. However the parent left SIGINT."""
    paused, go = tmp_path / "paused", tmp_path / "go"
    env = {"TESTS_PAUSE_UNTIL": str(go), "TESTS_PAUSED_AT": str(paused)}
    args = ["--env-id", "tests.envs:PauseOnReset-v0", "--total-timesteps", "2048", "--quiet"]
    proc = start_python(REPO / "ppo_continuous.py", args, tmp_path, env, preexec_fn=parent_left_sigint(parent))
    try:
        deadline = time.monotonic() + SAFETY_NET
        while not paused.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # until the reset says that it waits
        assert paused.exists(), "the run ended or hung before its first reset"
        proc.send_signal(signal.SIGINT)
    finally:
        go.touch()
    _, stderr = proc.communicate(timeout=SAFETY_NET)
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines() == ["ppo_continuous.py: interrupted"], stderr


@pytest.mark.slow
def test_a_run_under_nohup_outlives_its_terminal(tmp_path):
    """nohup starts the run with SIGHUP ignored: the SIGHUP of a closed terminal leaves it training to its end (the
    training loop takes SIGHUP only where nobody ignored it). The envs wait at their 600th step for the test, so the
    signal comes while the run trains however fast the machine is."""
    go = tmp_path / "go"
    args = ["--env-id", "tests.envs:PauseOnce-v0", "--total-timesteps", "2048", "--num-envs", "2", "--num-steps", "128"]
    args += ["--num-minibatches", "4", "--update-epochs", "2", "--obs-warmup-steps", "256", "--run-name", "h"]
    args += ["--quiet"]

    def nohup() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    proc = start_python(PPO_SCRIPT, args, tmp_path, {"TESTS_PAUSE_UNTIL": str(go)}, preexec_fn=nohup)
    try:
        assert wait_until_trained(tmp_path / "runs" / "h", proc), "the run ended before its first update"
        proc.send_signal(signal.SIGHUP)
    finally:
        go.touch()
    _, stderr = proc.communicate(timeout=SAFETY_NET)
    assert proc.returncode == 0 and "SIGHUP" not in stderr, stderr
    assert json.loads((tmp_path / "runs" / "h" / "summary.json").read_text())["status"] == "completed"
