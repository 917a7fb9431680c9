"""--num-seeds N: N seeds in one process, each trained as its single run would be, each writing what its single run
writes; an edit reaches every seed; one seed's failure stops that seed only; Ctrl-C checkpoints every seed and
--resume continues them all. Every seed runs the script's own training loop and compiled gradient, so these runs
compile (Pendulum-v1, whose dynamics do not amplify float rounding over a few iterations)."""

from __future__ import annotations

import json
import shutil
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import (
    PPO_SCRIPT,
    REPO,
    SAFETY_NET,
    run_ppo,
    run_python,
    start_python,
    tensorboard_events,
    wait_until_trained,
)

sys.path.insert(0, str(REPO / "benchmarks"))
from edits import edited_copy  # noqa: E402

RUN = ["--env-id", "Pendulum-v1", "--total-timesteps", "768", "--num-steps", "256", "--num-minibatches", "4"]
RUN += ["--update-epochs", "2", "--quiet", "--checkpoint-every", "0"]
TAGS = ["losses/value_loss", "losses/policy_loss", "losses/approx_kl", "losses/entropy", "charts/episodic_return"]


def curves(run_dir: Path) -> dict[str, np.ndarray]:
    events = tensorboard_events(run_dir)
    return {tag: np.array([e.value for e in events.Scalars(tag)]) for tag in TAGS}


def assert_same_training(together: Path, alone: Path) -> None:
    """The first iterations of two runs agree within float noise (a lockstep's stacked actor rounds otherwise than one
    seed's)."""
    a, b = curves(together), curves(alone)
    for tag in TAGS:
        assert len(a[tag]) == len(b[tag]) > 0, tag
        np.testing.assert_allclose(a[tag], b[tag], rtol=1e-3, atol=1e-6, err_msg=tag)


def kinds(run_dir: Path) -> set[str]:
    return {"events" if p.name.startswith("events.") else p.name for p in run_dir.iterdir()}


def test_each_seed_trains_and_writes_as_its_single_run(tmp_path):
    together = run_ppo([*RUN, "--num-seeds", "3", "--run-name", "s", "--save-model", "--eval-episodes", "1"], tmp_path)
    assert together.returncode == 0, together.stderr
    assert "off at iteration" not in together.stderr and "off:" not in together.stderr  # the fast paths all ran
    alone = run_ppo([*RUN, "--seed", "2", "--run-name", "alone", "--save-model", "--eval-episodes", "1"], tmp_path)
    assert alone.returncode == 0, alone.stderr
    runs = tmp_path / "runs"
    assert sorted(p.name for p in runs.iterdir()) == ["alone", "s__1", "s__2", "s__3"]
    assert_same_training(runs / "s__2", runs / "alone")
    assert curves(runs / "s__1")["losses/value_loss"][0] != curves(runs / "s__2")["losses/value_loss"][0]
    for seed in (1, 2, 3):
        folder = runs / f"s__{seed}"
        assert kinds(folder) == kinds(runs / "alone")
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["env_steps"] == 768
        assert summary["hyperparameters"]["seed"] == seed
        assert summary.keys() == json.loads((runs / "alone" / "summary.json").read_text()).keys()
        assert f"run folder runs/s__{seed}" in together.stdout
    saved = torch.load(runs / "s__2" / "checkpoint.pt", weights_only=True)["agent"]
    single = torch.load(runs / "alone" / "checkpoint.pt", weights_only=True)["agent"]
    for name, value in single.items():
        torch.testing.assert_close(saved[name], value, rtol=1e-3, atol=1e-5)


FROZEN_INIT = """
import sys, torch
import ppo_continuous as p
torch.manual_seed(int(sys.argv[1]))  # as seed_everything seeds a run before its Agent is built
saved = torch.load(sys.argv[2], weights_only=True)["agent"]
agent = p.Agent(3, 1)
print(all(torch.equal(saved[f"critic.0.{n}"], getattr(agent.critic[0], n)) for n in ("weight", "bias")))
"""


@pytest.mark.slow
@pytest.mark.parametrize("edit", ["seed_all_layers", "seed_random_layers"])
def test_edits_of_every_layer_train_in_every_seed_as_in_its_single_run(edit, tmp_path):
    """benchmarks/edits.py's SEED_EDITS: the update loop, the training loop, make_learner, the Agent (a per-seed
    attribute, a frozen layer, a Dropout) and the loss (a random op), with numpy's and torch's global generators drawn
    in the loop and the loss. Each seed of --num-seeds 3 trains as the edited copy's single run with that seed."""
    folder = edited_copy(tmp_path, edit)
    flags = [*RUN, "--no-anneal-lr"]  # the scheduler of seed_all_layers sets the learning rate
    together = run_python(
        "ppo_continuous.py", [*flags, "--num-seeds", "3", "--run-name", "e"], folder, repo_on_path=False
    )
    assert together.returncode == 0, together.stderr
    assert "Traceback" not in together.stderr and "off at iteration" not in together.stderr, together.stderr
    if edit == "seed_random_layers":  # each seed's start-up line names its seed
        for seed in (1, 2, 3):
            assert f"ppo_continuous.py: seed {seed}: compiled gradient off: a random layer" in together.stderr
    ent_coefs = []
    for seed in (1, 2, 3):
        alone = run_python(
            "ppo_continuous.py", [*flags, "--seed", str(seed), "--run-name", f"a{seed}"], folder, repo_on_path=False
        )
        assert alone.returncode == 0, alone.stderr
        assert_same_training(folder / "runs" / f"e__{seed}", folder / "runs" / f"a{seed}")
        rates = [tensorboard_events(folder / "runs" / f"{name}") for name in (f"e__{seed}", f"a{seed}")]
        for tag in ("charts/learning_rate", "charts/ent_coef"):
            np.testing.assert_allclose(*[[e.value for e in r.Scalars(tag)] for r in rates], rtol=1e-6, err_msg=tag)
        ent_coefs.append([e.value for e in rates[0].Scalars("charts/ent_coef")])
        if edit == "seed_all_layers":  # the frozen layer kept its initial values in every seed
            ckpt = folder / "runs" / f"e__{seed}" / "checkpoint.pt"
            check = run_python("-c", [FROZEN_INIT, str(seed), str(ckpt)], folder, repo_on_path=False)
            assert check.stdout.strip() == "True", check.stdout + check.stderr
    assert ent_coefs[0] != ent_coefs[1] and min(min(c) for c in ent_coefs) > 0  # numpy's draws are each seed's own


@pytest.mark.slow
def test_a_researchers_copy_runs_its_own_code_in_every_seed(tmp_path):
    """cp ppo_continuous.py my_ppo.py, edit it (ReLU for tanh), python my_ppo.py --num-seeds 2: both seeds train the
    copy's code, as its single runs do, and not the stock script beside it."""
    folder = edited_copy(tmp_path, "relu")
    (folder / "ppo_continuous.py").rename(folder / "my_ppo.py")
    shutil.copy(REPO / "ppo_continuous.py", folder / "ppo_continuous.py")
    together = run_python("my_ppo.py", [*RUN, "--num-seeds", "2", "--run-name", "e"], folder, repo_on_path=False)
    assert together.returncode == 0, together.stderr
    for seed in (1, 2):
        alone = run_python(
            "my_ppo.py", [*RUN, "--seed", str(seed), "--run-name", f"a{seed}"], folder, repo_on_path=False
        )
        assert alone.returncode == 0, alone.stderr
        assert_same_training(folder / "runs" / f"e__{seed}", folder / "runs" / f"a{seed}")
    stock = run_python("ppo_continuous.py", [*RUN, "--seed", "2", "--run-name", "stock"], folder, repo_on_path=False)
    assert stock.returncode == 0, stock.stderr
    edited, unedited = curves(folder / "runs" / "e__2"), curves(folder / "runs" / "stock")
    assert not np.allclose(edited["losses/policy_loss"], unedited["losses/policy_loss"], rtol=1e-3, atol=1e-6)


@pytest.mark.slow
def test_a_seed_whose_env_fails_stops_alone_with_its_checkpoint(tmp_path):
    args = ["--env-id", "tests.envs:FailsForSeed2-v0", "--num-steps", "64", "--num-minibatches", "2"]
    args += ["--total-timesteps", "640", "--obs-warmup-steps", "0", "--quiet", "--num-seeds", "3", "--run-name", "f"]
    result = run_ppo(args, tmp_path)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if "seed 2: error: stopped: its env failed" in line]
    assert len(lines) == 1 and "RuntimeError: simulator diverged at step 300" in lines[0], result.stderr
    runs = tmp_path / "runs"
    failed = json.loads((runs / "f__2" / "summary.json").read_text())
    assert failed["status"] == "failed" and failed["env_steps"] == 256  # four whole iterations before step 300
    assert torch.load(runs / "f__2" / "checkpoint.pt", weights_only=True)["global_step"] == 256
    for seed in (1, 3):
        summary = json.loads((runs / f"f__{seed}" / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["env_steps"] == 640


@pytest.mark.slow
def test_ctrl_c_checkpoints_every_seed_and_resume_continues_them_all(tmp_path):
    args = ["--env-id", "Pendulum-v1", "--num-steps", "64", "--num-minibatches", "2", "--update-epochs", "2"]
    args += ["--total-timesteps", "1000000", "--checkpoint-every", "0", "--quiet"]
    args += ["--num-seeds", "2", "--run-name", "c"]
    proc = start_python(PPO_SCRIPT, args, tmp_path)
    for seed in (1, 2):  # each seed has trained once
        assert wait_until_trained(tmp_path / "runs" / f"c__{seed}", proc), "the run ended before its first update"
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=SAFETY_NET)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    steps = []
    for seed in (1, 2):
        folder = tmp_path / "runs" / f"c__{seed}"
        assert json.loads((folder / "summary.json").read_text())["status"] == "interrupted"
        ckpt = torch.load(folder / "checkpoint.pt", weights_only=True)
        assert ckpt["seed_runs"] == ["runs/c__1/checkpoint.pt", "runs/c__2/checkpoint.pt"]
        steps.append(ckpt["global_step"])
    # each seed stops at the end of its iteration under way; the seeds run apart (each waits only for its own
    # rollouts), so how far each got depends on the machine's speed, not on the code
    assert min(steps) > 0 and all(step % 64 == 0 for step in steps)
    total = max(steps) + 128
    resumed = run_ppo(
        ["--resume", str(Path("runs") / "c__2" / "checkpoint.pt"), "--total-timesteps", str(total)], tmp_path
    )
    assert resumed.returncode == 0, resumed.stderr
    for seed in (1, 2):
        folder = tmp_path / "runs" / f"c__{seed}"
        assert torch.load(folder / "checkpoint.pt", weights_only=True)["global_step"] == total
        assert json.loads((folder / "summary.json").read_text())["status"] == "completed"


@pytest.mark.slow
def test_num_seeds_is_refused_where_it_does_not_fit(tmp_path):
    refused = [
        (run_ppo(["--num-seeds", "0"], tmp_path), "ppo_continuous.py: error: --num-seeds must be positive, got 0"),
        (run_ppo(["--num-seeds", "2", "--track"], tmp_path), "--track and --num-seeds do not fit together"),
        (
            run_python(REPO / "dppo_ray.py", ["--num-seeds", "2"], tmp_path, timeout=SAFETY_NET),
            "dppo_ray.py: error: --num-seeds and --seed-processes are ppo_continuous.py's",
        ),
    ]
    for result, line in refused:
        assert result.returncode == 2, result.stderr
        assert line in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_resuming_one_seed_alone_leaves_the_others(tmp_path):
    args = [*RUN, "--num-seeds", "2", "--run-name", "r", "--no-compile"]
    assert run_ppo(args, tmp_path).returncode == 0
    before = (tmp_path / "runs" / "r__1" / "checkpoint.pt").read_bytes()
    ckpt = str(Path("runs") / "r__2" / "checkpoint.pt")
    resumed = run_ppo(["--resume", ckpt, "--total-timesteps", "1024", "--num-seeds", "1", "--no-compile"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert torch.load(tmp_path / ckpt, weights_only=True)["global_step"] == 1024
    assert (tmp_path / "runs" / "r__1" / "checkpoint.pt").read_bytes() == before


# ---------------------------------------------------------------------------------------------------------------------
# A sampler process's seeds step in lockstep and act in one stacked forward
# ---------------------------------------------------------------------------------------------------------------------
def seed_sampler(env_id: str, seed: int, agent_seed: int):
    """A Sampler with its own envs and a perturbed Agent of its own to act with (on the numpy fast path), its
    observation statistics from a short warm-up."""
    import gae
    import ppo_continuous
    from tests.conftest import perturbed_agent

    sampler = ppo_continuous.Sampler(env_id, 2, seed, ppo_continuous.Args(env_id=env_id))
    agent = perturbed_agent(*sampler.spaces, seed=agent_seed)
    obs_rms = gae.RunningMeanStd(shape=(sampler.spaces[0],))
    obs_rms.update_from_moments(*sampler.warm_up(16))
    learner = ppo_continuous.Learner(agent, torch.optim.Adam(agent.parameters()), obs_rms, None)
    learner.fast.acting = True
    sampler.set_policy(ppo_continuous.policy_weights(learner))
    return sampler


def test_stacked_actor_acts_as_each_seeds_numpy_actor_and_refuses_what_does_not_stack():
    from fast_paths import DoesNotFit, NumpyActor, StackedNumpyActor
    from tests.conftest import perturbed_agent

    agents = [perturbed_agent(17, 6, seed=seed) for seed in range(3)]
    actors = [NumpyActor(agent) for agent in agents]
    generator = np.random.default_rng(0)
    obs = generator.standard_normal((3, 4, 17)).astype(np.float32)
    noise = generator.standard_normal((3, 4, 6))
    stacked = StackedNumpyActor(agents, actors).act(obs, noise)
    expected = np.stack([actor.act(o, z) for actor, o, z in zip(actors, obs, noise)])
    assert not np.allclose(expected[0], expected[1])  # the seeds' weights differ, and so do their actions
    np.testing.assert_allclose(stacked, expected, rtol=1e-6, atol=1e-6)
    agents[1].actor_mean[1] = torch.nn.ReLU()  # one seed's edit: its layers no longer match the others'
    with pytest.raises(DoesNotFit, match="ReLU|Tanh"):
        StackedNumpyActor(agents, actors)
    agents[1].actor_mean[1] = torch.nn.LayerNorm(64)  # a layer with weights of its own that numpy does not mirror
    with pytest.raises(DoesNotFit):
        StackedNumpyActor(agents, actors)


def test_seeds_in_lockstep_sample_what_each_samples_alone():
    import many_seeds

    together = [seed_sampler("Pendulum-v1", seed, seed) for seed in (0, 7)]
    alone = [seed_sampler("Pendulum-v1", seed, seed) for seed in (0, 7)]
    # float rounding: the stacked matmul rounds otherwise than one seed's, and a pendulum carries it a little further
    for _ in range(2):  # the second rollout continues the episodes of the first
        rollouts = many_seeds.rollouts_in_lockstep(together, 150)
        for sampler, rollout in zip(alone, rollouts):
            expected = sampler.rollout(150)
            assert rollout["acting_problem"] == ""
            for key in ("obs", "actions", "logprobs", "rewards", "next_obs", "final_obs", "obs_mean"):
                np.testing.assert_allclose(rollout[key], expected[key], rtol=1e-4, atol=1e-4, err_msg=key)
            for key in ("terminations", "truncations", "final_index", "episode_lengths"):
                np.testing.assert_array_equal(rollout[key], expected[key], err_msg=key)
    assert rollouts[1]["final_index"].size > 0  # an episode ended (Pendulum's end at 200 steps) in the second rollout
    assert not np.allclose(rollouts[0]["actions"], rollouts[1]["actions"])


def test_a_seed_whose_env_raises_in_lockstep_gets_the_error_and_the_others_their_rollouts():
    import many_seeds
    import tests.envs  # noqa: F401 (registers FailsForSeed2-v0)

    samplers = [seed_sampler("FailsForSeed2-v0", seed, seed) for seed in (0, 2, 4)]  # envs seeded 0, 1; 2, 3; 4, 5
    rollouts = many_seeds.rollouts_in_lockstep(samplers, 400)
    assert isinstance(rollouts[1], RuntimeError) and "simulator diverged" in str(rollouts[1])
    assert [rollouts[k]["env_steps"] for k in (0, 2)] == [800, 800]
    again = many_seeds.rollouts_in_lockstep([samplers[0], samplers[2]], 10)  # the others go on
    assert all(rollout["env_steps"] == 20 for rollout in again)
