"""Tests of checkpoints.py, mostly end to end through ppo_continuous.py as a user runs it (a subprocess in a fresh
working directory): checkpoint files and resuming from them, corrupt or foreign checkpoints refused, and saved
policies loaded and evaluated; and the modules' import layers (checkpoints.py is handed a script's module, never
imports one)."""

from __future__ import annotations

import ast
import json
import os
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import REPO, SAFETY_NET, SMALL, run_ppo, tensorboard_events

sys.path.insert(0, str(REPO))

import checkpoints  # noqa: E402
import ppo_continuous  # noqa: E402


def test_checkpoint_and_resume_continue_steps_and_curves(tmp_path):
    first = run_ppo(
        ["--env-id", "Pendulum-v1", "--total-timesteps", "512", "--run-name", "r", *SMALL], tmp_path, forked=True
    )
    assert first.returncode == 0, first.stderr
    ckpt_path = tmp_path / "runs" / "r" / "checkpoint.pt"
    ckpt = torch.load(ckpt_path, weights_only=True)
    assert ckpt["global_step"] == 512 and ckpt["iteration"] == 2
    resumed = run_ppo(
        ["--env-id", "Pendulum-v1", "--total-timesteps", "1024", "--resume", str(ckpt_path), *SMALL],
        tmp_path,
        forked=True,
    )
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads((tmp_path / "runs" / "r" / "summary.json").read_text())
    assert summary["env_steps"] == 1024
    steps = sorted({e.step for e in tensorboard_events(tmp_path / "runs" / "r").Scalars("losses/approx_kl")})
    assert steps == [256, 512, 768, 1024], "the resumed run should continue the same curves"
    after = torch.load(ckpt_path, weights_only=True)
    assert after["global_step"] == 1024 and after["iteration"] == 4
    assert not torch.equal(after["agent"]["actor_logstd"], ckpt["agent"]["actor_logstd"])


@pytest.mark.slow
def test_eval_checkpoint_uses_saved_normalization(tmp_path):
    result = run_ppo(
        ["--env-id", "Pendulum-v1", "--total-timesteps", "1024", "--run-name", "e", "--save-model", *SMALL],
        tmp_path,
        forked=True,
    )
    assert result.returncode == 0, result.stderr
    model = tmp_path / "runs" / "e" / "ppo_continuous.model"
    assert model.is_file()
    out = run_ppo(["--eval-checkpoint", str(model), "--eval-episodes", "3", "--seed", "7"], tmp_path, forked=True)
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip().splitlines()[-1]
    assert "Pendulum-v1: mean return" in line and "over 3 episodes" in line
    printed_mean = float(line.split("mean return ")[1].split(" ")[0])

    # The same evaluation in Python, with load_policy and with fresh statistics: the CLI must match the former.
    policy = ppo_continuous.load_policy(str(model))
    assert policy.obs_mean is not None and np.any(policy.obs_mean != 0), "the model must carry the statistics"
    with_saved = checkpoints.evaluate(policy, 3, 7).mean()
    fresh = ppo_continuous.load_policy(str(model))
    fresh.obs_mean, fresh.obs_std = np.zeros(3), np.ones(3)
    with_fresh = checkpoints.evaluate(fresh, 3, 7).mean()
    assert printed_mean == pytest.approx(with_saved, abs=0.01)
    assert with_saved != pytest.approx(with_fresh, abs=0.01)
    # predict: one observation or a batch, the mean action, clipped to the action space
    obs = np.array([[1.0, 0.0, 0.5], [0.0, 1.0, -8.0]])
    batch = policy.predict(obs)
    assert batch.shape == (2, 1) and np.all(np.abs(batch) <= 2.0)
    np.testing.assert_allclose(policy.predict(obs[1]), batch[1], rtol=1e-5)  # one row or two: BLAS may sum apart


# ---------------------------------------------------------------------------------------------------------------------
# Bad checkpoints: one line on stderr, non-zero exit, no traceback, no code run
# ---------------------------------------------------------------------------------------------------------------------
class RunsCode:
    """A pickle payload that would create a file if it were ever unpickled with full pickle."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def bad_checkpoints(tmp_path: Path) -> dict[str, Path]:
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"this is not a checkpoint")
    truncated = tmp_path / "truncated.pt"
    torch.save({"agent": {"w": torch.zeros(1000)}}, truncated)
    truncated.write_bytes(truncated.read_bytes()[:200])
    malicious = tmp_path / "malicious.pt"
    with open(malicious, "wb") as f:
        pickle.dump({"agent": RunsCode(tmp_path / "pwned")}, f)
    wrong = tmp_path / "wrong.pt"
    torch.save({"something": torch.zeros(3)}, wrong)
    return {"corrupt": corrupt, "truncated": truncated, "malicious": malicious, "wrong": wrong}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["corrupt", "truncated", "malicious", "wrong"])
@pytest.mark.parametrize("flag", ["--eval-checkpoint", "--resume"])
def test_bad_checkpoint_is_refused_without_running_code(tmp_path, kind, flag):
    path = bad_checkpoints(tmp_path)[kind]
    result = run_ppo([flag, str(path), "--env-id", "Pendulum-v1", "--quiet"], tmp_path, timeout=SAFETY_NET, forked=True)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"cannot load checkpoint {path}" in lines[0], result.stderr
    assert not (tmp_path / "pwned").exists(), "loading a checkpoint must never execute code"


@pytest.mark.slow
def test_resume_from_checkpoint_of_another_env_is_refused(tmp_path):
    first = run_ppo(
        ["--env-id", "Pendulum-v1", "--total-timesteps", "256", "--run-name", "x", *SMALL], tmp_path, forked=True
    )
    assert first.returncode == 0
    ckpt = str(tmp_path / "runs" / "x" / "checkpoint.pt")
    result = run_ppo(["--env-id", "Hopper-v5", "--resume", ckpt, *SMALL], tmp_path, forked=True)
    assert result.returncode == 2 and "was trained on Pendulum-v1, not --env-id Hopper-v5" in result.stderr


# ---------------------------------------------------------------------------------------------------------------------
# The modules' layers: each imports only those below it
# ---------------------------------------------------------------------------------------------------------------------
LAYERS = {
    "gae": 0,
    "run_record": 0,
    "stop_signals": 0,
    "seed_statistics": 0,
    "command_line": 0,
    "ray_cluster": 1,
    "launcher": 2,
    "checkpoints": 1,
    "fast_paths": 2,
    "run_management": 3,
    "ppo_continuous": 4,
    "dppo_ray": 5,
}
# The modules the launcher runs on: the standard library and these of the repository's (no torch, no numpy)
STANDARD_LIBRARY_ONLY = ("run_record", "stop_signals", "seed_statistics", "command_line", "ray_cluster", "launcher")


def repository_imports(module: str) -> set[str]:
    """The repository's modules that `module` imports anywhere in its file: import statements at any depth, and
    importlib.import_module of a constant name."""
    tree = ast.parse((REPO / f"{module}.py").read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module":
            names |= {str(arg.value).split(".")[0] for arg in node.args[:1] if isinstance(arg, ast.Constant)}
    return names & set(LAYERS)


def test_each_module_imports_only_the_layers_below_it():
    """gae, run_record, stop_signals, seed_statistics, command_line <- checkpoints, ray_cluster <- fast_paths,
    launcher <- run_management <- ppo_continuous <- dppo_ray: no circles, and a module that needs a script's code
    (checkpoints rebuilding an Agent) is handed the script's module instead of importing it. The launcher and the Ray
    runner import only standard-library modules of the repository's: they start the script as processes, before
    torch."""
    upward = {
        module: sorted(name for name in repository_imports(module) if LAYERS[name] >= LAYERS[module])
        for module in LAYERS
    }
    assert upward == {module: [] for module in LAYERS}
    assert repository_imports("dppo_ray") >= {"ppo_continuous", "checkpoints", "run_management"}, "the check sees them"
    for module in STANDARD_LIBRARY_ONLY:
        assert repository_imports(module) <= set(STANDARD_LIBRARY_ONLY), module
