"""What you edit is what runs: research edits made to copies of the scripts, then trained as a user would.

Each edit is made by text replacement in a copy of the repository's modules in a temporary folder (benchmarks/edits.py:
edits of the network, the loss and the optimizer, and one for each seam between the code a researcher edits and what
trains: the optimizer's step and state, .grad and .data rebound by the loop, TorchActor, the loss's clipped region, a
limit that binds mid-run). The copy's script is run twice, with the fast paths (numpy acting, the compiled gradient)
and with --no-fast-path (torch acting, the eager gradient). For every edit a fast part either runs or steps aside with
its one line, at start-up or, for acting that only the run's own data shows to differ (benchmarks/edits.py's AUDITED),
when the audit meets it; either way the run trains the network as written: its logged losses match the --no-fast-path
run's within float noise every iteration (up to the iteration before the acting audit stepped in: a discarded rollout
shifts the data after that), and the saved model acts with the edited network. Pendulum's dynamics do not amplify
float rounding over these few iterations, so the two runs see the same data.

Each run is `python script ...` in the copy's folder, in a process of its own forked from one that has imported torch
(tests.conftest.ForkedScript): the copy's modules are imported in the run, as they are in a user's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import REPO, ForkedScript, run_forked, tensorboard_events

sys.path.insert(0, str(REPO / "benchmarks"))
from edits import AUDITED, EDITS, EXPECTED, edited_copy  # noqa: E402

RUN = ["--env-id", "Pendulum-v1", "--total-timesteps", "768", "--num-steps", "256", "--num-minibatches", "4"]
RUN += ["--update-epochs", "2", "--save-model", "--eval-episodes", "1", "--quiet", "--checkpoint-every", "0"]
# Flags that make an edit bind: raw Pendulum observations (angular velocity up to 8) for the input clamp and the
# drift; a negative entropy coefficient drives the log-std down to the floor during the third iteration's update (the
# start-up check's log-stds stay within about 0.4 of 0), so the compiled gradient meets the floor mid-update and the
# acting audit at the next rollout; a learning rate large enough that ratios pass the upper clip's bound. (A learning
# rate of 0.1 amplifies float rounding on Pendulum too: two runs of the same code part within two iterations.)
FLAGS = {
    "upper_clip_only": ["--learning-rate", "0.01", "--update-epochs", "4"],  # ratios past 1.4 in the first iterations
    "input_clamp": ["--no-norm-obs"],
    "drift_beyond_4": ["--no-norm-obs"],
    "std_floor": ["--total-timesteps", "1536", "--learning-rate", "0.01", "--ent-coef", "-1", "--seed", "2"],
}


def run_both(folder: Path, script: str, args: list[str]) -> list[subprocess.CompletedProcess]:
    """The copy's script with the fast paths (run "fast", --compile: a run this short would train eagerly by the
    compile rule) and with --no-fast-path (run "plain"), side by side, each in a process of its own (ForkedScript)."""
    commands = [[*args, "--run-name", "fast", "--compile"], [*args, "--run-name", "plain", "--no-fast-path"]]
    runs = [ForkedScript(folder / script, command, folder, repo_on_path=False) for command in commands]
    return [run.result() for run in runs]


def losses(run_dir: Path) -> dict[str, np.ndarray]:
    events = tensorboard_events(run_dir)
    tags = [t for t in events.Tags()["scalars"] if t.startswith("losses/") or t == "charts/episodic_return"]
    return {tag: np.array([e.value for e in events.Scalars(tag)]) for tag in tags}


# The saved model, loaded by the edited copy, acts as the edited network computes: the model's mean action for some
# observations (far enough out for an input clamp to bind), against the Agent's own distribution_mode of
# get_distribution, in eval() mode, on the same normalized observations; twice, for a random layer.
ACTS_AS_EDITED = """
import json, sys
import numpy as np, torch
import checkpoints
import ppo_continuous as p
policy = p.load_policy(sys.argv[1])
ckpt = checkpoints.load_checkpoint(sys.argv[1])
agent, obs_rms = checkpoints.agent_from_checkpoint(ckpt, sys.argv[1], p)
agent.eval()
obs = np.random.default_rng(0).normal(size=(16, 3)) * 6
if ckpt["args"]["norm_obs"]:
    normalized = np.clip((obs - obs_rms.mean) / np.sqrt(obs_rms.var + 1e-8), -10, 10)
else:
    normalized = obs
normalized = torch.tensor(normalized, dtype=torch.float32)
with torch.no_grad():
    expected = np.clip(checkpoints.distribution_mode(agent.get_distribution(normalized)).numpy(), -2, 2)
weights = {k: v.numpy().astype(np.float64) for k, v in ckpt["agent"].items()}
stock_tanh = None
if sys.argv[2] == "relu":
    h = normalized.numpy().astype(np.float64)
    for i in (0, 2):
        h = np.tanh(h @ weights[f"actor_mean.{i}.weight"].T + weights[f"actor_mean.{i}.bias"])
    stock_tanh = np.clip(h @ weights["actor_mean.4.weight"].T + weights["actor_mean.4.bias"], -2, 2).tolist()
predicted = policy.predict(obs).tolist()
again = policy.predict(obs).tolist()
print(json.dumps(dict(predicted=predicted, again=again, expected=expected.tolist(), stock_tanh=stock_tanh)))
"""


def check_acts_as_edited(folder: Path, model: Path, edit: str) -> subprocess.CompletedProcess:
    """ACTS_AS_EDITED run on `model` for `edit` in the copy's `folder` with the copy's modules, to its end."""
    check = folder.parent / "acts_as_edited.py"
    check.write_text(ACTS_AS_EDITED)
    return run_forked(check, [str(model), edit], folder, env={"PYTHONPATH": str(folder)}, repo_on_path=False)


def first_switch(summary: dict) -> int | None:
    """The iteration at which the audit first moved a part to the plain path, if it did."""
    return min((s["iteration"] for s in summary["fast_path_switches"]), default=None)


@pytest.mark.slow
@pytest.mark.parametrize("edit", [edit for edit in EDITS if edit not in ("tanh_no_entropy", "mixture_policy")])
def test_an_edit_trains_as_written_on_both_paths(tmp_path, edit):
    folder = edited_copy(tmp_path, edit)
    fast, plain = run_both(folder, "ppo_continuous.py", [*RUN, *FLAGS.get(edit, [])])
    for result in (fast, plain):
        assert result.returncode == 0, result.stderr[-3000:]
        assert "Traceback" not in result.stderr, result.stderr[-3000:]
    acting_on, compiled_on = EXPECTED[edit]
    audited = AUDITED.get(edit, set())
    lines = fast.stderr.splitlines()
    assert any("fast acting off: " in line for line in lines) == (not acting_on and "acting" not in audited), lines
    assert any("compiled gradient off: " in line for line in lines) == (not compiled_on), lines
    for part in audited:  # one line each, naming the iteration and the difference
        said = [line for line in lines if f"fast {part} off at iteration " in line]
        assert len(said) == 1 and "differ from TorchActor" in said[0] and "of their scale" in said[0], fast.stderr
    assert "fast" not in plain.stderr and "compiled" not in plain.stderr  # --no-fast-path checks nothing
    summary = json.loads((folder / "runs" / "fast" / "summary.json").read_text())
    assert summary["fast_paths"]["acting"].startswith("numpy" if acting_on else "torch")
    assert summary["fast_paths"]["gradient"].startswith("torch.compile" if compiled_on else "eager")
    assert {s["part"] for s in summary["fast_path_switches"]} == audited
    assert (summary["discarded_rollouts"] > 0) == ("acting" in audited)
    plain_summary = json.loads((folder / "runs" / "plain" / "summary.json").read_text())
    assert plain_summary["fast_paths"]["gradient"].startswith("eager")

    # The same training, within float noise, whichever path ran it (up to the audit's step, when there is one)
    fast_losses, plain_losses = losses(folder / "runs" / "fast"), losses(folder / "runs" / "plain")
    assert set(fast_losses) == set(plain_losses) and len(fast_losses["losses/value_loss"]) >= 3
    same = len(fast_losses["losses/value_loss"]) if not audited else first_switch(summary) - 1
    if edit == "std_floor":
        assert same >= 1, summary["fast_path_switches"]  # the floor was reached after the start, not at it
    for tag in (t for t in fast_losses if t != "charts/episodic_return" or not audited):
        np.testing.assert_allclose(fast_losses[tag][:same], plain_losses[tag][:same], rtol=2e-3, atol=2e-5, err_msg=tag)

    # The saved model acts with the edited network
    model = folder / "runs" / "fast" / "ppo_continuous.model"
    check = check_acts_as_edited(folder, model, edit)
    assert check.returncode == 0, check.stderr[-3000:]
    acted = json.loads(check.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(acted["predicted"], acted["expected"], rtol=1e-4, atol=1e-5)
    assert acted["again"] == acted["predicted"]  # eval() mode: a random layer gives the same action twice
    if edit == "relu":  # the stock tanh network on the same weights acts otherwise
        assert np.abs(np.array(acted["predicted"]) - np.array(acted["stock_tanh"])).max() > 1e-3
    assert "eval return" in fast.stdout  # --save-model evaluated it at the end of the run


def run_once(folder: Path, *extra: str) -> subprocess.CompletedProcess:
    """The edited copy's ppo_continuous.py, once, as a user runs it (run folder runs/r; run_forked)."""
    args = [*RUN, *extra, "--run-name", "r"]
    return run_forked(folder / "ppo_continuous.py", args, folder, repo_on_path=False)


@pytest.mark.slow
def test_a_policy_without_an_entropy_is_one_line_saying_what_to_do(tmp_path):
    """A tanh-squashed Gaussian straight from torch.distributions has no entropy(): the run stops with one line that
    names what is missing and what to write instead, never a traceback."""
    folder = edited_copy(tmp_path, "tanh_no_entropy")
    result = run_once(folder)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ppo_continuous.py: error: the policy's distribution has no entropy"), last
    assert "Agent.evaluate return an estimate" in last


@pytest.mark.slow
def test_a_saved_policy_without_a_mode_still_leaves_its_summary_and_closing_line(tmp_path):
    """A mixture of Gaussians trains (Agent.evaluate returns an entropy estimate) but has no mode for --save-model's
    mean-action evaluation: one line says so, and summary.json, the model and the closing line are all there."""
    folder = edited_copy(tmp_path, "mixture_policy")
    result = run_once(folder)  # what it checks is the evaluation's, after the training
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "evaluating it failed" in errors[0] and "has no mode" in errors[0], errors
    assert result.stdout.strip().splitlines()[-1].startswith("ppo_continuous.py: completed at step 768")
    summary = json.loads((folder / "runs" / "r" / "summary.json").read_text())
    assert summary["status"] == "completed" and "has no mode" in summary["eval_error"]
    assert (folder / "runs" / "r" / "ppo_continuous.model").exists()


@pytest.mark.slow
@pytest.mark.parametrize("edit", ["relu", "extra_loss_term", "input_clamp"])
def test_dppo_trains_the_edited_network_too(tmp_path, edit):
    """dppo_ray.py shares the agent, the loss, the update and the acting audit: the same edit runs the same way there.
    The input clamp binds only on the run's data: the actors' audit catches it in the first iteration, and its
    rollouts are discarded and sampled again with torch."""
    folder = edited_copy(tmp_path, edit)
    args = ["--no-ray", "--num-actors", "2", *RUN[:-2], *FLAGS.get(edit, [])]
    fast, plain = run_both(folder, "dppo_ray.py", args)
    for result in (fast, plain):
        assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((folder / "runs" / "fast" / "summary.json").read_text())
    assert summary["fast_paths"]["gradient"].startswith("torch.compile"), summary["fast_paths"]
    if edit == "input_clamp":
        assert "fast acting off at iteration 1" in fast.stderr
        assert summary["discarded_rollouts"] >= 2 and summary["fast_paths"]["acting"].startswith("torch")
        return
    assert summary["fast_path_switches"] == [] and "off" not in fast.stderr, fast.stderr
    fast_losses, plain_losses = losses(folder / "runs" / "fast"), losses(folder / "runs" / "plain")
    for tag in fast_losses:
        np.testing.assert_allclose(fast_losses[tag], plain_losses[tag], rtol=2e-3, atol=2e-5, err_msg=tag)


@pytest.mark.slow
def test_an_edit_of_the_loop_steps_reaches_dppo_sync_and_async(tmp_path):
    """benchmarks/edits.py's LOOP_EDITS (a scalar in log_update and one in rollout_batch; a scalar and zero
    advantages in training_loop; a line from the rollout's wrapper; a checkpoint field in save_checkpoint), made in
    ppo_continuous.py only: dppo_ray.py's learner runs that loop, so every edit shows in its sync and async runs as in
    the single run's. An async update may also count the steps of rollouts it dropped as too stale."""
    folder = edited_copy(tmp_path, "loop_steps")
    common = ["--env-id", "Pendulum-v1", "--num-minibatches", "4", "--update-epochs", "2", "--quiet"]
    dppo = ["--no-ray", "--num-actors", "2", "--num-steps", "128", "--total-timesteps", "768"]
    commands = {
        "single": ("ppo_continuous.py", ["--num-steps", "256", "--total-timesteps", "768"]),
        "sync": ("dppo_ray.py", dppo),
        "async": ("dppo_ray.py", [*dppo, "--mode", "async"]),
    }
    runs = {
        name: ForkedScript(folder / script, [*common, *flags, "--run-name", name], folder, repo_on_path=False)
        for name, (script, flags) in commands.items()
    }
    for name, run in runs.items():
        result = run.result()
        stderr = result.stderr
        assert result.returncode == 0, f"{name}: {stderr[-3000:]}"
        events = tensorboard_events(folder / "runs" / name)
        assert [e.value for e in events.Scalars("charts/edited_scalar")] == [7.0] * 3, name
        assert [e.value for e in events.Scalars("charts/edited_loop_iteration")] == [1.0, 2.0, 3.0], name
        assert [e.value for e in events.Scalars("losses/policy_loss")] == [0.0] * 3, name
        rollout_steps = [e.value for e in events.Scalars("charts/edited_rollout_steps")]
        wrapper_steps = [int(line.split()[-2]) for line in stderr.splitlines() if "edited rollout wrapper:" in line]
        assert wrapper_steps == rollout_steps and len(rollout_steps) == 3, (name, rollout_steps, wrapper_steps)
        assert all(steps == 256 if name != "async" else steps >= 256 for steps in rollout_steps), name
        ckpt = torch.load(folder / "runs" / name / "checkpoint.pt", weights_only=False)
        assert ckpt["iteration"] == 3 and ckpt["edited_field"] == 3, name
