"""What you edit is what runs: common research edits made to copies of the scripts, then trained as a user would.

Each edit is made by text replacement in a copy of the repository's modules in a temporary folder, and the copy's
script is run twice, with the fast paths allowed (the default) and with --no-fast-path. For every edit either a fast
path stays on and equals the plain path, or it steps aside with its one line; either way the run trains the network
as written: its logged losses match the --no-fast-path run's within float noise, and the saved model acts with the
edited network.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from edits import EDITS, EXPECTED, edited_copy  # noqa: E402

RUN = ["--env-id", "Pendulum-v1", "--total-timesteps", "768", "--num-steps", "256", "--num-minibatches", "4"]
RUN += ["--update-epochs", "2", "--save-model", "--eval-episodes", "1", "--quiet", "--checkpoint-every", "0"]


def run_both(folder: Path, script: str, args: list[str], timeout: int = 300) -> list[subprocess.CompletedProcess]:
    """The script with the fast paths allowed (run "fast") and with --no-fast-path (run "plain"), side by side."""
    commands = [[*args, "--run-name", "fast"], [*args, "--run-name", "plain", "--no-fast-path"]]
    processes = [
        subprocess.Popen(
            [sys.executable, script, *command], cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for command in commands
    ]
    results = []
    for process, command in zip(processes, commands):
        stdout, stderr = process.communicate(timeout=timeout)
        results.append(subprocess.CompletedProcess(command, process.returncode, stdout, stderr))
    return results


def losses(run_dir: Path) -> dict[str, np.ndarray]:
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    tags = [t for t in events.Tags()["scalars"] if t.startswith("losses/") or t == "charts/episodic_return"]
    return {tag: np.array([e.value for e in events.Scalars(tag)]) for tag in tags}


# The saved model, loaded by the edited copy, acts as the edited network computes: the model's mean action for some
# observations, against the Agent's own get_distribution(...).mean on the same normalized observations.
ACTS_AS_EDITED = """
import json, sys
import numpy as np, torch
import ppo_continuous as p
import run_utils
policy = p.load_policy(sys.argv[1])
ckpt = run_utils.load_checkpoint(sys.argv[1])
agent, obs_rms = run_utils.agent_from_checkpoint(ckpt, sys.argv[1], p)
obs = np.random.default_rng(0).normal(size=(16, 3)) * 2
with torch.no_grad():
    normalized = torch.tensor(np.clip((obs - obs_rms.mean) / np.sqrt(obs_rms.var + 1e-8), -10, 10), dtype=torch.float32)
    expected = np.clip(agent.get_distribution(normalized).mean.numpy(), -2, 2)
weights = {k: v.numpy().astype(np.float64) for k, v in ckpt["agent"].items()}
stock_tanh = None
if sys.argv[2] == "relu":
    h = normalized.numpy().astype(np.float64)
    for i in (0, 2):
        h = np.tanh(h @ weights[f"actor_mean.{i}.weight"].T + weights[f"actor_mean.{i}.bias"])
    stock_tanh = np.clip(h @ weights["actor_mean.4.weight"].T + weights["actor_mean.4.bias"], -2, 2).tolist()
print(json.dumps(dict(predicted=policy.predict(obs).tolist(), expected=expected.tolist(), stock_tanh=stock_tanh)))
"""


@pytest.mark.parametrize("edit", list(EDITS))
def test_an_edit_runs_as_written_on_a_fast_path_or_the_plain_path(tmp_path, edit):
    folder = edited_copy(tmp_path, edit)
    fast, plain = run_both(folder, "ppo_continuous.py", RUN)
    for result in (fast, plain):
        assert result.returncode == 0, result.stderr[-3000:]
        assert "Traceback" not in result.stderr, result.stderr[-3000:]
    acting_on, update_on = EXPECTED[edit]
    step_aside = [line for line in fast.stderr.splitlines() if " fast " in line and " off: " in line]
    assert (not acting_on) + (not update_on) == len(step_aside), fast.stderr
    assert any("fast acting off: " in line for line in step_aside) != acting_on
    assert any("fast update off: " in line for line in step_aside) != update_on
    assert "fast" not in plain.stderr  # --no-fast-path checks nothing and says nothing
    summary = json.loads((folder / "runs" / "fast" / "summary.json").read_text())
    assert summary["fast_paths"]["acting"].startswith("numpy" if acting_on else "torch")
    assert summary["fast_paths"]["update"].startswith("StackedUpdate" if update_on else "autograd")
    plain_summary = json.loads((folder / "runs" / "plain" / "summary.json").read_text())
    assert plain_summary["fast_paths"]["update"].startswith("autograd")

    # The same training, within float noise, whichever path ran it
    fast_losses, plain_losses = losses(folder / "runs" / "fast"), losses(folder / "runs" / "plain")
    assert set(fast_losses) == set(plain_losses) and len(fast_losses["losses/value_loss"]) == 3
    for tag in fast_losses:
        np.testing.assert_allclose(fast_losses[tag], plain_losses[tag], rtol=2e-3, atol=2e-5, err_msg=tag)

    # The saved model acts with the edited network
    model = folder / "runs" / "fast" / "ppo_continuous.model"
    check = subprocess.run(
        [sys.executable, "-c", ACTS_AS_EDITED, str(model), edit],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stderr[-3000:]
    acted = json.loads(check.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(acted["predicted"], acted["expected"], rtol=1e-4, atol=1e-5)
    if edit == "relu":  # the stock tanh network on the same weights acts otherwise
        assert np.abs(np.array(acted["predicted"]) - np.array(acted["stock_tanh"])).max() > 1e-3
    assert "eval return" in fast.stdout  # --save-model evaluated it at the end of the run


@pytest.mark.parametrize("edit", ["relu", "extra_loss_term"])
def test_dppo_trains_the_edited_network_too(tmp_path, edit):
    """dppo_ray.py shares the agent, the loss and the fast paths: the same edit runs the same way there."""
    folder = edited_copy(tmp_path, edit)
    args = ["--no-ray", "--num-actors", "2", *RUN[:-2]]
    fast, plain = run_both(folder, "dppo_ray.py", args)
    for result in (fast, plain):
        assert result.returncode == 0, result.stderr[-3000:]
    assert ("fast update off: it differs from autograd" in fast.stderr) == (edit == "extra_loss_term"), fast.stderr
    fast_losses, plain_losses = losses(folder / "runs" / "fast"), losses(folder / "runs" / "plain")
    for tag in fast_losses:
        np.testing.assert_allclose(fast_losses[tag], plain_losses[tag], rtol=2e-3, atol=2e-5, err_msg=tag)
