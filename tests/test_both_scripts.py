"""What ppo_continuous.py and dppo_ray.py must share: their flags, their checkpoints, the truncation bootstrap with
normalized observations, and the schedules across an interruption. Each test runs both scripts as a user would."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import REPO, SAFETY_NET, run_forked, scalars, wait_until_trained

sys.path.insert(0, str(REPO))

import checkpoints  # noqa: E402
import dppo_ray  # noqa: E402
import gae  # noqa: E402
import ppo_continuous  # noqa: E402
from tests.envs import cycle_values  # noqa: E402

# The same rollout shape for both: ppo's 2 envs x 128 steps, DPPO's 2 actors x 1 env x 128 steps (in-process).
SHAPE = {"ppo_continuous.py": ["--num-envs", "2"], "dppo_ray.py": ["--num-actors", "2", "--no-ray"]}
COMMON = ["--num-steps", "128", "--num-minibatches", "4", "--update-epochs", "4", "--quiet"]


def run(script: str, args: list[str], cwd: Path, timeout: float = SAFETY_NET) -> subprocess.CompletedProcess:
    """The script run to its end, forked from a process that has imported torch (run_forked): DPPO's runs here train
    in process (SHAPE's --no-ray, which a resumed run takes from its run.json), and an evaluation starts no Ray."""
    return run_forked(REPO / script, args, cwd, timeout)


@pytest.mark.slow
def test_dppo_has_every_flag_of_ppo_with_the_same_default_and_meaning():
    ppo_fields = {f.name: f for f in dataclasses.fields(ppo_continuous.Args)}
    dppo_fields = {f.name: f for f in dataclasses.fields(dppo_ray.Args)}
    rollout_shape = {"num_envs", "num_steps", "exp_name", "env_id"}  # env_id: DPPO also takes Discrete
    seeds_only = {"num_seeds", "seed_processes", "grid"}  # ppo_continuous.py's launcher: off DPPO's --help, refused
    for name, field in ppo_fields.items():
        assert name in dppo_fields, f"--{name} is missing from dppo_ray.py"
        if name not in rollout_shape:
            assert dppo_fields[name].default == field.default, name
        if name not in rollout_shape | seeds_only:
            assert dppo_fields[name].type == field.type, name
    help_text = subprocess.run([sys.executable, str(REPO / "dppo_ray.py"), "--help"], capture_output=True, text=True)
    ppo_help = subprocess.run(
        [sys.executable, str(REPO / "ppo_continuous.py"), "--help"], capture_output=True, text=True
    )
    option = {name: f"--{name.replace('_', '-')} {'[STR' if name == 'grid' else 'INT'}" for name in seeds_only}
    assert all(option[name] in ppo_help.stdout for name in seeds_only)
    assert "--num-envs " not in help_text.stdout and "--num-envs-per-actor" in help_text.stdout
    for name in ppo_fields:
        flag = f"--{name.replace('_', '-')}"
        if name in seeds_only:  # listed as an option in ppo_continuous.py's --help ("--num-seeds INT"), not here
            assert option[name] not in help_text.stdout, name
        elif name not in ("num_envs", "batch_size", "minibatch_size", "num_iterations"):
            assert flag in help_text.stdout, name


@pytest.mark.slow
def test_models_of_either_script_evaluate_with_the_other(tmp_path):
    """A model saved by one script is read by the other's --eval-checkpoint, on the same Box env, with the same
    result."""
    results = {}
    for script in SHAPE:
        name = script.split(".")[0]
        args = ["--env-id", "Pendulum-v1", "--total-timesteps", "1024", "--run-name", name, "--save-model"]
        trained = run(script, [*args, *SHAPE[script], *COMMON], tmp_path)
        assert trained.returncode == 0, trained.stderr
        for path in (tmp_path / "runs" / name / f"{name}.model", tmp_path / "runs" / name / "checkpoint.pt"):
            for evaluator in SHAPE:
                out = run(evaluator, ["--eval-checkpoint", str(path), "--eval-episodes", "2", "--seed", "3"], tmp_path)
                assert out.returncode == 0, out.stderr
                results[(name, path.name, evaluator)] = out.stdout.strip().splitlines()[-1]
    for (name, file, evaluator), line in results.items():
        assert line == results[(name, file, "ppo_continuous.py")], (name, file, evaluator)
        assert line.startswith("Pendulum-v1: mean return")


@pytest.mark.slow
def test_a_discrete_action_model_evaluates_with_dppo_and_is_refused_by_ppo_in_one_line(tmp_path):
    """DPPO trains Discrete actions (CartPole) acting with torch: the numpy actor computes a Gaussian policy, so it is
    off without a check and without a line about it; the gradient is compiled as for any Agent. Its model evaluates
    with dppo_ray.py; ppo_continuous.py's Agent builds no categorical policy, so its --eval-checkpoint refuses in one
    line that names the script to use."""
    args = ["--env-id", "CartPole-v1", "--total-timesteps", "512", "--run-name", "d", "--save-model"]
    trained = run("dppo_ray.py", [*args, "--eval-episodes", "1", *SHAPE["dppo_ray.py"], *COMMON, "--compile"], tmp_path)
    assert trained.returncode == 0, trained.stderr
    assert "fast" not in trained.stderr and "compiled" not in trained.stderr, trained.stderr
    summary = json.loads((tmp_path / "runs" / "d" / "summary.json").read_text())
    used = summary["fast_paths"]
    assert used["acting"].startswith("torch") and used["gradient"].startswith("torch.compile"), used
    assert summary["fast_path_switches"] == [] and summary["discarded_rollouts"] == 0
    model = tmp_path / "runs" / "d" / "dppo_ray.model"
    evaluated = run("dppo_ray.py", ["--eval-checkpoint", str(model), "--eval-episodes", "2"], tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr
    assert evaluated.stdout.strip().splitlines()[-1].startswith("CartPole-v1: mean return")
    refused = run("ppo_continuous.py", ["--eval-checkpoint", str(model), "--eval-episodes", "2"], tmp_path)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert refused.stderr.strip() == (
        f"ppo_continuous.py: error: {model} is a policy over Discrete actions, which this script's Agent does not "
        f"build: use python dppo_ray.py --eval-checkpoint {model}"
    )


@pytest.mark.slow
@pytest.mark.parametrize("script", list(SHAPE))
def test_truncation_bootstraps_with_normalized_observations(tmp_path, script):
    """Cycle-v0's final observation differs from the next reset observation, and its reward depends on the state.
    With observation normalization on, the critic must learn V(o) = o + gamma V(o + 1): only a bootstrap from the
    normalized *final* observation gets there (a cut without bootstrap, or V(reset obs), would not)."""
    args = ["--env-id", "tests.envs:Cycle-v0", "--run-name", "c", "--total-timesteps", "20480", "--no-norm-reward"]
    args += ["--no-clip-vloss", "--gamma", "0.5", "--learning-rate", "3e-3", "--num-steps", "128", "--quiet"]
    args += ["--num-minibatches", "4"]  # 80 updates: the critic is within about 0.02 of V in both scripts by then
    result = run(script, [*args, *SHAPE[script]], tmp_path, timeout=SAFETY_NET)
    assert result.returncode == 0, result.stderr
    policy_ckpt = torch.load(tmp_path / "runs" / "c" / "checkpoint.pt", weights_only=True)
    agent, obs_rms = checkpoints.agent_from_checkpoint(policy_ckpt, "c", ppo_continuous)
    obs = gae.normalize_obs(np.arange(10.0)[:, None], obs_rms.mean, gae.running_std(obs_rms.var), 10.0)
    with torch.no_grad():
        values = agent.get_value(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(values, cycle_values(0.5), atol=0.6)


@pytest.mark.slow
@pytest.mark.parametrize("script", list(SHAPE))
def test_interrupted_and_resumed_run_logs_the_same_schedules(tmp_path, script):
    """SIGTERM mid-run (exit 143, a checkpoint), then --resume with the same flags: charts/learning_rate and
    charts/ent_coef follow the uninterrupted run's curves exactly. The interrupted run's envs wait at their 600th step
    (256 warm-up steps and two rollouts of 128 before it) until the signal has been sent, so it lands mid-run however
    fast the machine is."""
    total = 5120
    args = ["--env-id", "tests.envs:PauseOnce-v0", "--total-timesteps", str(total), "--ent-coef", "0.01"]
    args += ["--ent-coef-final", "0", "--obs-warmup-steps", "256", "--checkpoint-every", "0", *SHAPE[script], *COMMON]
    full = run(script, [*args, "--run-name", "full"], tmp_path)
    assert full.returncode == 0, full.stderr
    go = tmp_path / "go"
    env = dict(os.environ, PYTHONPATH=str(REPO), TESTS_PAUSE_UNTIL=str(go))
    command = [sys.executable, str(REPO / script), *args, "--run-name", "cut"]
    proc = subprocess.Popen(command, cwd=tmp_path, env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert wait_until_trained(tmp_path / "runs" / "cut", proc), "the run ended before its first update"
        proc.send_signal(signal.SIGTERM)
    finally:
        go.touch()  # the envs go on; the run stops at the end of the iteration under way
    stdout, stderr = proc.communicate(timeout=SAFETY_NET)
    assert proc.returncode == 143, stderr
    assert "SIGTERM" in stderr and "Traceback" not in stderr and "--resume" in stdout
    ckpt = tmp_path / "runs" / "cut" / "checkpoint.pt"
    interrupted_at = torch.load(ckpt, weights_only=True)["global_step"]
    # the iteration under way when the signal came ends, and no other starts: the third at the latest (its envs waited)
    assert 0 < interrupted_at <= 3 * 256 and interrupted_at % 256 == 0, interrupted_at
    resumed = run(script, [*args, "--run-name", "cut", "--resume", str(ckpt)], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    for tag in ("charts/learning_rate", "charts/ent_coef"):
        assert scalars(tmp_path / "runs" / "cut", tag) == scalars(tmp_path / "runs" / "full", tag), tag
    assert json.loads((tmp_path / "runs" / "cut" / "summary.json").read_text())["env_steps"] == total


def file_states(folder: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in folder.iterdir()}


@pytest.mark.slow
@pytest.mark.parametrize("script", list(SHAPE))
def test_resume_takes_the_runs_flags_from_the_checkpoint(tmp_path, script):
    base = ["--env-id", "Pendulum-v1", "--run-name", "r", *SHAPE[script], *COMMON]
    first = run(script, [*base, "--total-timesteps", "512"], tmp_path)
    assert first.returncode == 0, first.stderr
    ckpt = str(tmp_path / "runs" / "r" / "checkpoint.pt")
    # A flag that contradicts the checkpoint is refused, naming it; nothing is touched.
    before = file_states(tmp_path / "runs" / "r")
    # (ppo's --num-envs is a flag of the run's shape; dppo refuses it anyway, as its actors' product)
    shape = ("--num-envs", "3") if script == "ppo_continuous.py" else ("--num-actors", "3")
    for flag, value in [("--learning-rate", "1e-3"), ("--num-steps", "64"), ("--no-norm-obs", None), shape]:
        bad = run(script, ["--resume", ckpt, "--total-timesteps", "1024", flag, *([value] if value else [])], tmp_path)
        assert bad.returncode == 2, bad.stderr
        lines = bad.stderr.strip().splitlines()
        assert len(lines) == 1 and f"{flag.replace('--no-', '--')} " in lines[0] and "contradicts" in lines[0], lines
    # A finished run with nothing left to do says so, exits 0 and leaves its files untouched.
    done = run(script, ["--resume", ckpt, "--quiet"], tmp_path)
    assert done.returncode == 0 and "nothing to do" in done.stdout, done.stderr
    assert file_states(tmp_path / "runs" / "r") == before
    # Only --resume and a larger --total-timesteps, and the machine flags the first run had (COMMON's and DPPO's
    # --no-ray), which a checkpoint does not carry: the batch shape and the rest come from the checkpoint.
    machine = ["--quiet", *(["--no-ray"] if script == "dppo_ray.py" else [])]
    more = run(script, ["--resume", ckpt, "--total-timesteps", "1024", *machine], tmp_path)
    assert more.returncode == 0, more.stderr
    summary = json.loads((tmp_path / "runs" / "r" / "summary.json").read_text())
    assert summary["env_steps"] == 1024 and summary["hyperparameters"]["num_steps"] == 128
    assert summary["hyperparameters"]["num_minibatches"] == 4
    # The last episodes' mean spans both sessions: 2 envs, 200-step episodes, 256 steps each per session.
    returns = [value for _, value in scalars(tmp_path / "runs" / "r", "charts/episodic_return")]
    assert summary["num_last_episodes"] == len(returns) == 4
    assert summary["mean_return_last_episodes"] == pytest.approx(np.mean(returns), rel=1e-5)
    # The other script's checkpoint is refused in one line that names the script to use.
    other = "dppo_ray.py" if script == "ppo_continuous.py" else "ppo_continuous.py"
    wrong = run(other, ["--resume", ckpt, "--total-timesteps", "2048"], tmp_path)
    assert wrong.returncode == 2 and "Traceback" not in wrong.stderr, wrong.stderr
    assert (
        wrong.stderr.strip() == f"{other}: error: --resume {ckpt} is a checkpoint of {script}: continue it with "
        f"python {script} --resume {ckpt}"
    )


@pytest.mark.slow
@pytest.mark.parametrize("script", list(SHAPE))
def test_an_existing_run_folder_is_never_mixed(tmp_path, script):
    args = ["--env-id", "Pendulum-v1", "--run-name", "same", "--total-timesteps", "256", *SHAPE[script], *COMMON]
    assert run(script, args, tmp_path).returncode == 0
    again = run(script, args, tmp_path)
    assert again.returncode == 2 and "already exists" in again.stderr and "--overwrite" in again.stderr
    fresh = run(script, [*args, "--overwrite"], tmp_path)
    assert fresh.returncode == 0, fresh.stderr
    assert len(list((tmp_path / "runs" / "same").glob("events.*"))) == 1, "the old run's curves must be gone"


MYENV = """
import gymnasium as gym
from gymnasium.envs.classic_control.pendulum import PendulumEnv

gym.register(id="MyPendulum-v0", entry_point=PendulumEnv, max_episode_steps=200)
"""


@pytest.mark.parametrize(
    "script, extra", [("ppo_continuous.py", []), ("dppo_ray.py", ["--no-ray"]), ("dppo_ray.py", [])]
)
@pytest.mark.slow
def test_custom_env_module_in_the_working_directory(tmp_path, script, extra):
    """`--env-id myenv:MyPendulum-v0` from the folder that holds myenv.py, with no PYTHONPATH, as python -m would.
    In DPPO this includes the Ray actors. Every run ends with one line on stdout, --quiet included."""
    (tmp_path / "myenv.py").write_text(MYENV)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    args = ["--env-id", "myenv:MyPendulum-v0", "--total-timesteps", "512", "--num-steps", "256", "--quiet"]
    args += ["--num-minibatches", "4", "--update-epochs", "1", "--run-name", "m", *extra]
    result = subprocess.run(
        [sys.executable, str(REPO / script), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=SAFETY_NET,
    )
    assert result.returncode == 0, result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert f"{script}: completed at step 512; run folder runs/m; mean return of the last" in last, last
    assert "tensorboard --logdir runs" in last


def test_observation_layout_follows_gymnasiums_flatten_order():
    """The layout saved with the policy lays a Dict observation out exactly as the env's FlattenObservation does:
    a Dict's entries in its own order (here target before body, as the env declares them), nested entries in place."""
    import gymnasium as gym

    raw = gym.make("tests.envs:Reach-v0")
    layout = checkpoints.observation_layout("Reach-v0", raw.observation_space)
    assert layout == [[["target"], [2]], [["body", "position"], [2]], [["body", "velocity"], [2]]]
    obs, _ = raw.reset(seed=3)
    flat = gym.spaces.flatten(raw.observation_space, obs)
    np.testing.assert_array_equal(checkpoints.flatten_observation(obs, layout), flat)
    batch = {"target": np.stack([obs["target"]] * 3), "body": {k: np.stack([v] * 3) for k, v in obs["body"].items()}}
    np.testing.assert_array_equal(checkpoints.flatten_observation(batch, layout), np.stack([flat] * 3))
    env = ppo_continuous.make_env("tests.envs:Reach-v0")
    assert env.observation_space.shape == (6,) and env.obs_layout == layout
    np.testing.assert_array_equal(env.reset(seed=3)[0], flat)
    assert ppo_continuous.make_env("Pendulum-v1").obs_layout is None
    image_like = checkpoints.observation_layout("x", gym.spaces.Box(0, 1, (2, 3)))
    assert image_like == [[[], [2, 3]]]
    grid = np.arange(12.0).reshape(2, 2, 3)  # a batch of two 2x3 observations
    np.testing.assert_array_equal(checkpoints.flatten_observation(grid, image_like), grid.reshape(2, 6))


@pytest.mark.slow
@pytest.mark.parametrize("script", ["ppo_continuous.py", "dppo_ray.py"])
def test_dict_observations_train_and_the_saved_policy_flattens_them(tmp_path, script):
    """A nested Dict observation trains in both scripts; the model carries the layout, so --eval-checkpoint and
    load_policy(...).predict(dict observation) act on it as the training did."""
    args = ["--env-id", "tests.envs:Reach-v0", "--total-timesteps", "512", "--run-name", "d", "--save-model"]
    args += ["--eval-episodes", "2", *COMMON, *SHAPE[script]]
    result = run(script, args, tmp_path)
    assert result.returncode == 0, result.stderr
    model = tmp_path / "runs" / "d" / f"{script[:-3]}.model"
    evaluation = run("ppo_continuous.py", ["--eval-checkpoint", str(model)], tmp_path)
    assert evaluation.returncode == 0, evaluation.stderr
    assert "tests.envs:Reach-v0: mean return" in evaluation.stdout
    policy = ppo_continuous.load_policy(str(model))
    assert policy.obs_layout == [[["target"], [2]], [["body", "position"], [2]], [["body", "velocity"], [2]]]
    obs = {"target": np.array([0.5, -0.5]), "body": {"position": np.array([0.1, 0.2]), "velocity": np.zeros(2)}}
    flat = np.array([0.5, -0.5, 0.1, 0.2, 0.0, 0.0])
    np.testing.assert_allclose(policy.predict(obs), policy.predict(flat))
    assert not np.allclose(policy.predict(obs), policy.predict(flat[[2, 3, 0, 1, 4, 5]])), "the order must matter"


@pytest.mark.slow
@pytest.mark.parametrize("script", ["ppo_continuous.py", "dppo_ray.py"])
def test_a_dict_observation_with_a_non_box_entry_is_one_line(tmp_path, script):
    result = run(script, ["--env-id", "tests.envs:ReachDiscreteLeaf-v0", *SHAPE[script], *COMMON], tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == (
        f"{script}: error: tests.envs:ReachDiscreteLeaf-v0: mode is Discrete(3); observations must be Boxes "
        "(Dict and Tuple of them)"
    )
