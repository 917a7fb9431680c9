"""Tests of ppo_continuous.py's algorithm: the Agent, acting, the rollout, the wiring of GAE, and end to end, run
exactly as a user runs it (a subprocess in a fresh working directory), CleanRL's command line, the training loop's
TensorBoard tags and learning. (The numpy actor and the compiled gradient against the plain path: test_fast_paths.py;
checkpoints: test_checkpoints.py; run management: test_run_management.py.)"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import REPO, SAFETY_NET, SMALL, VALUE_FIT, perturbed_agent, run_ppo, run_python, tensorboard_events

sys.path.insert(0, str(REPO))

import checkpoints  # noqa: E402
import dppo_ray  # noqa: E402
import fast_paths  # noqa: E402
import gae  # noqa: E402
import ppo_continuous  # noqa: E402

CLEANRL_TAGS = [
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "charts/learning_rate",
    "losses/value_loss",
    "losses/policy_loss",
    "losses/entropy",
    "losses/old_approx_kl",
    "losses/approx_kl",
    "losses/clipfrac",
    "losses/explained_variance",
]


@pytest.fixture(scope="module")
def pendulum_run(tmp_path_factory):
    """One short Pendulum run shared by the tests that only read its outputs."""
    cwd = tmp_path_factory.mktemp("pendulum")
    result = run_ppo(
        ["--env-id", "Pendulum-v1", "--total-timesteps", "1024", "--run-name", "p", *SMALL], cwd, forked=True
    )
    assert result.returncode == 0, result.stderr
    return cwd, cwd / "runs" / "p", result.stderr


def test_tensorboard_tags_and_summary(pendulum_run):
    cwd, run_dir, stderr = pendulum_run
    assert "rounded down" not in stderr, "1024 steps are 4 whole batches: nothing to say"
    acc = tensorboard_events(run_dir, histograms=0)
    tags = set(acc.Tags()["scalars"])
    missing = [t for t in CLEANRL_TAGS if t not in tags]
    assert not missing, f"missing TensorBoard tags: {missing}"
    assert "charts/episodic_return_hist" in acc.Tags()["histograms"]
    assert "hyperparameters/text_summary" in acc.Tags()["tensors"]
    returns = [e.value for e in acc.Scalars("charts/episodic_return")]
    assert len(returns) == 4  # 4 envs x 256 steps, Pendulum episodes are 200 steps
    assert all(-2000 < r < 0 for r in returns)
    steps = [e.step for e in acc.Scalars("losses/approx_kl")]
    assert steps == [256, 512, 768, 1024]

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["env_steps"] == 1024
    assert summary["hyperparameters"]["env_id"] == "Pendulum-v1"
    assert summary["hyperparameters"]["num_envs"] == 4
    for key in ["final_entropy", "final_explained_variance", "final_approx_kl", "mean_return_last_episodes"]:
        assert isinstance(summary[key], float), key
    assert summary["wall_time_seconds"] > 0
    assert not any(key.startswith("eval_") for key in summary), "no --save-model: no evaluation"
    # the user's working directory gets runs/ and nothing else
    assert sorted(os.listdir(cwd)) == ["runs"]
    assert (run_dir / "checkpoint.pt").is_file()


def test_same_seed_same_run(pendulum_run, tmp_path):
    """pendulum_run's run (seed 1, the default) run again in another folder, its seed given: the same run, scalar for
    scalar and weight for weight; another seed changes it."""
    args = ["--env-id", "Pendulum-v1", "--total-timesteps", "1024", *SMALL]
    assert run_ppo([*args, "--seed", "1", "--run-name", "s"], tmp_path, forked=True).returncode == 0
    run_dirs = [pendulum_run[1], tmp_path / "runs" / "s"]
    runs = [tensorboard_events(run_dir) for run_dir in run_dirs]
    for tag in ["charts/episodic_return", "losses/value_loss", "losses/approx_kl"]:
        a, b = ([e.value for e in acc.Scalars(tag)] for acc in runs)
        assert a == b, tag
    ckpts = [torch.load(run_dir / "checkpoint.pt", weights_only=True) for run_dir in run_dirs]
    for key, value in ckpts[0]["agent"].items():
        assert torch.equal(value, ckpts[1]["agent"][key]), key
    other = run_ppo([*args, "--seed", "4", "--run-name", "t"], tmp_path, forked=True)
    assert other.returncode == 0
    c = [e.value for e in tensorboard_events(tmp_path / "runs" / "t").Scalars("losses/value_loss")]
    assert c != [e.value for e in runs[0].Scalars("losses/value_loss")], "a different seed must change the run"


# Every field of CleanRL's ppo_continuous_action.py Args, with its default, as its command line spells them (a bool as
# --flag or --no-flag, None as None)
CLEANRL_DEFAULTS = {
    "--exp-name": "ppo_continuous_action",
    "--seed": "1",
    "--torch-deterministic": None,
    "--cuda": None,
    "--no-track": None,
    "--wandb-project-name": "cleanRL",
    "--wandb-entity": "None",
    "--no-capture-video": None,
    "--no-save-model": None,
    "--no-upload-model": None,
    "--hf-entity": "",
    "--env-id": "HalfCheetah-v4",
    "--total-timesteps": "1000000",
    "--learning-rate": "0.0003",
    "--num-envs": "1",
    "--num-steps": "2048",
    "--anneal-lr": None,
    "--gamma": "0.99",
    "--gae-lambda": "0.95",
    "--num-minibatches": "32",
    "--update-epochs": "10",
    "--norm-adv": None,
    "--clip-coef": "0.2",
    "--clip-vloss": None,
    "--ent-coef": "0.0",
    "--vf-coef": "0.5",
    "--max-grad-norm": "0.5",
    "--target-kl": "None",
    "--batch-size": "0",
    "--minibatch-size": "0",
    "--num-iterations": "0",
}


def cleanrl_command(drop: tuple[str, ...] = (), **values: str) -> list[str]:
    """CleanRL's full flag set with its defaults, less the flags in `drop`, with `values` for some (by the flag's
    name in Python: env_id="Pendulum-v1")."""
    assert {f"--{name.replace('_', '-')}" for name in values} <= set(CLEANRL_DEFAULTS), values
    flags = {flag: values.get(flag[2:].replace("-", "_"), default) for flag, default in CLEANRL_DEFAULTS.items()}
    return [item for flag, value in flags.items() if flag not in drop for item in [flag, value] if item is not None]


@pytest.mark.slow
def test_a_cleanrl_command_line_with_every_flag_trains_and_upload_model_is_refused_in_one_line(tmp_path):
    """Every flag of CleanRL's Args, spelled out, is taken with CleanRL's meaning (the run's summary records each
    value; batch sizes and iterations are computed, as in CleanRL). --upload-model is refused in one line, exit status
    2, by both scripts; dppo_ray.py, which has --num-actors x --num-envs-per-actor envs, refuses --num-envs so."""
    short = dict(env_id="Pendulum-v1", total_timesteps="128", num_steps="64", num_minibatches="2", update_epochs="1")
    ours = ["--quiet"]  # after the CleanRL line: no progress bar
    result = run_ppo([*cleanrl_command(**short), *ours], tmp_path, forked=True)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "error" not in result.stderr, result.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.startswith("Pendulum-v1__ppo_continuous_action__1__")
    hyperparameters = json.loads((run_dir / "summary.json").read_text())["hyperparameters"]
    expected = {
        "exp_name": "ppo_continuous_action",
        "seed": 1,
        "torch_deterministic": True,
        "cuda": True,
        "track": False,
        "wandb_project_name": "cleanRL",
        "wandb_entity": None,
        "capture_video": False,
        "save_model": False,
        "upload_model": False,
        "hf_entity": "",
        "env_id": "Pendulum-v1",
        "total_timesteps": 128,
        "learning_rate": 3e-4,
        "num_envs": 1,
        "num_steps": 64,
        "anneal_lr": True,
        "gamma": 0.99,
        "gae_lambda": 0.95,
        "num_minibatches": 2,
        "update_epochs": 1,
        "norm_adv": True,
        "clip_coef": 0.2,
        "clip_vloss": True,
        "ent_coef": 0.0,
        "vf_coef": 0.5,
        "max_grad_norm": 0.5,
        "target_kl": None,
        "batch_size": 64,
        "minibatch_size": 32,
        "num_iterations": 2,
    }
    assert {name: hyperparameters[name] for name in expected} == expected

    for script, drop in [("ppo_continuous.py", ()), ("dppo_ray.py", ("--num-envs",))]:
        upload = [*cleanrl_command(("--no-upload-model", *drop), **short), "--upload-model"]
        refused = run_python(REPO / script, [*upload, *ours], tmp_path)
        lines = refused.stderr.strip().splitlines()
        assert refused.returncode == 2 and len(lines) == 1, refused.stderr
        assert lines[0].startswith(f"{script}: error: --upload-model") and "--save-model" in lines[0], lines[0]
    refused = run_python(REPO / "dppo_ray.py", [*cleanrl_command(**short), *ours], tmp_path)
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert lines[0].startswith("dppo_ray.py: error: --num-envs") and "--num-actors" in lines[0], lines[0]
    assert [path.name for path in (tmp_path / "runs").iterdir()] == [run_dir.name], "a refused run leaves no folder"


# ---------------------------------------------------------------------------------------------------------------------
# Gymnasium autoreset and the truncation bootstrap, on deterministic test envs (tests/envs.py)
# ---------------------------------------------------------------------------------------------------------------------
def critic_values(run_dir: Path) -> np.ndarray:
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    agent = ppo_continuous.Agent(1, 1)
    agent.load_state_dict(ckpt["agent"])
    with torch.no_grad():
        return agent.get_value(torch.arange(5, dtype=torch.float32)[:, None]).numpy()


@pytest.mark.slow
def test_autoreset_records_real_episodes_only(tmp_path):
    """With SAME_STEP autoreset no fake reset transition enters the data: every 5-step episode returns exactly 5."""
    result = run_ppo(
        ["--env-id", "tests.envs:Truncating-v0", "--run-name", "c", "--total-timesteps", "1280", *VALUE_FIT],
        tmp_path,
        forked=True,
    )
    assert result.returncode == 0, result.stderr
    acc = tensorboard_events(tmp_path / "runs" / "c")
    lengths = [e.value for e in acc.Scalars("charts/episodic_length")]
    returns = [e.value for e in acc.Scalars("charts/episodic_return")]
    assert len(lengths) == 1280 // 5
    assert set(lengths) == {5.0} and set(returns) == {5.0}


@pytest.mark.slow
def test_truncation_bootstraps_and_termination_does_not(tmp_path):
    """Reward 1 per step, gamma 0.5. If the time limit bootstraps from V(final obs), V = 1/(1-0.5) = 2 in every state;
    had truncation been treated as termination, V would fall to 1 at the last step. A real termination gives
    V(s_t) = 2 - 0.5^(4-t), i.e. 1 at the last step."""
    for env_id, name in [("tests.envs:Truncating-v0", "trunc"), ("tests.envs:Terminating-v0", "term")]:
        result = run_ppo(
            ["--env-id", env_id, "--run-name", name, "--total-timesteps", "12800", *VALUE_FIT], tmp_path, forked=True
        )
        assert result.returncode == 0, result.stderr
    truncating = critic_values(tmp_path / "runs" / "trunc")
    terminating = critic_values(tmp_path / "runs" / "term")
    np.testing.assert_allclose(truncating, [2.0] * 5, atol=0.15)
    np.testing.assert_allclose(terminating, [2 - 0.5**4, 2 - 0.5**3, 2 - 0.5**2, 1.5, 1.0], atol=0.15)


def learner_for(agent: ppo_continuous.Agent, obs_rms, fast_acting: bool) -> ppo_continuous.Learner:
    """A Learner around a given agent and statistics, acting on the fast path or not (what policy_weights reads)."""
    learner = ppo_continuous.Learner(agent, torch.optim.Adam(agent.parameters()), obs_rms, None)
    learner.fast.acting = fast_acting
    return learner


@pytest.mark.parametrize("discrete, fast", [(False, True), (False, False), (True, False)])
def test_actors_draw_from_the_agents_distribution_with_its_log_probability(discrete, fast):
    """The sampler's log-probability is the denominator of PPO's ratio: it must equal the learner's, on the fast path
    (NumpyActor) and the plain one (TorchActor, or for DPPO's Discrete actions dppo_ray.CategoricalActor, which has no
    fast path); the best action (checkpoints.distribution_mode, what a saved Policy takes) is the distribution's
    mode."""
    agent = perturbed_agent(11, 3, discrete)
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((64, 11)).astype(np.float32)
    noise = rng.random((64, 1)) if discrete else rng.standard_normal((64, 3))
    if discrete:
        actor = dppo_ray.CategoricalActor(agent)
    else:
        actor = fast_paths.NumpyActor(agent) if fast else ppo_continuous.TorchActor(agent)
    actions = actor.act(obs, noise)
    logprobs = actor.log_prob(obs, actions, noise)
    torch_logprobs, _, _ = agent.evaluate(torch.from_numpy(obs), torch.as_tensor(actions, dtype=torch.float32))
    np.testing.assert_allclose(logprobs, torch_logprobs.detach().numpy(), rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        best = checkpoints.distribution_mode(agent.get_distribution(torch.from_numpy(obs))).numpy()
    out = agent.actor_mean(torch.from_numpy(obs)).detach().numpy()
    np.testing.assert_allclose(best, out.argmax(1) if discrete else out, atol=1e-5)
    if discrete:  # sampled actions follow the categorical's probabilities
        many = actor.act(np.repeat(obs[:1], 20000, 0), rng.random((20000, 1)))
        probs = torch.softmax(torch.from_numpy(out[0]), 0).numpy()
        np.testing.assert_allclose(np.bincount(many, minlength=3) / 20000, probs, atol=0.015)
    else:  # mean + std * noise, the std from the log-std parameter
        expected = out + np.exp(agent.actor_logstd.detach().numpy()) * noise
        np.testing.assert_allclose(actions, expected, rtol=1e-5, atol=1e-5)


def test_gaussian_logprob_and_entropy_match_torch_distributions():
    agent = ppo_continuous.Agent(4, 2)
    with torch.no_grad():
        agent.actor_logstd.copy_(torch.tensor([[0.3, -0.7]]))
    obs, actions = torch.randn(9, 4), torch.randn(9, 2)
    logprob, entropy, value = agent.evaluate(obs, actions)
    dist = torch.distributions.Normal(agent.actor_mean(obs), agent.actor_logstd.exp())
    torch.testing.assert_close(logprob, dist.log_prob(actions).sum(-1))
    torch.testing.assert_close(entropy, dist.entropy().sum(-1))
    torch.testing.assert_close(value, agent.critic(obs)[:, 0])


# ---------------------------------------------------------------------------------------------------------------------
# Learning: fails when learning breaks
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_learns_pendulum(tmp_path):
    """RL-Zoo's Pendulum settings (4 envs x 1024 steps, gamma 0.9, lr 1e-3), 100k steps, about a minute here.
    A random policy scores about -1200; this run reaches about -400 (mean of the last 100 training episodes)."""
    args = ["--env-id", "Pendulum-v1", "--total-timesteps", "102400", "--num-envs", "4", "--num-steps", "1024"]
    args += ["--gamma", "0.9", "--learning-rate", "1e-3", "--run-name", "learn", "--save-model", "--quiet"]
    result = run_ppo(args, tmp_path, timeout=SAFETY_NET, forked=True)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "runs" / "learn" / "summary.json").read_text())
    assert summary["mean_return_last_episodes"] > -700, summary["mean_return_last_episodes"]
    evaluation = run_ppo(
        ["--eval-checkpoint", str(tmp_path / "runs" / "learn" / "ppo_continuous.model")], tmp_path, forked=True
    )
    assert evaluation.returncode == 0
    assert float(evaluation.stdout.split("mean return ")[1].split(" ")[0]) > -700


def sampler_for(env_id: str, num_envs: int) -> ppo_continuous.Sampler:
    """ppo_continuous.Sampler; for CartPole (Discrete actions, which only DPPO samples) dppo_ray.RolloutActor, the
    Sampler that acts with a categorical, run as a plain object."""
    args = ppo_continuous.Args(env_id=env_id)
    if env_id == "CartPole-v1":
        return dppo_ray.RolloutActor(env_id, num_envs, 0, args)
    return ppo_continuous.Sampler(env_id, num_envs, 0, args)


def set_policy(sampler: ppo_continuous.Sampler, weights: dict) -> None:
    """Sampler.set_policy, with a policy version for a RolloutActor."""
    if isinstance(sampler, dppo_ray.RolloutActor):
        sampler.set_policy(weights, 0)
    else:
        sampler.set_policy(weights)


@pytest.mark.parametrize("env_id, fast", [("Pendulum-v1", True), ("Pendulum-v1", False), ("CartPole-v1", False)])
def test_rollout_log_probs_and_actions_are_the_policys(env_id, fast):
    """The rollout draws its noise for all steps at once and computes the log-probabilities after it: the stored
    log-probs must be the learner's for the stored (obs, action) pairs, and the actions those that the actor draws
    step by step from the same generator, on either acting path (Discrete actions have only the torch one)."""
    sampler = sampler_for(env_id, 2)
    obs_dim, act_dim, discrete = dppo_ray.check_spaces(env_id, sampler.envs[0])
    agent = perturbed_agent(obs_dim, act_dim, discrete)
    obs_rms = gae.RunningMeanStd(shape=(obs_dim,))
    obs_rms.update_from_moments(*sampler.warm_up(32))
    set_policy(sampler, ppo_continuous.policy_weights(learner_for(agent, obs_rms, fast)))
    expected_actor = dppo_ray.CategoricalActor if discrete else ppo_continuous.TorchActor
    assert isinstance(sampler.policy, fast_paths.NumpyActor if fast else expected_actor)
    replay = np.random.default_rng()
    replay.bit_generator.state = sampler.rng.bit_generator.state
    rollout = sampler.rollout(300)  # Pendulum's episodes end at 200: an episode end inside the rollout
    assert rollout["truncations"].any() or rollout["terminations"].any()
    obs = torch.from_numpy(rollout["obs"].reshape(600, obs_dim))
    actions = torch.from_numpy(rollout["actions"].reshape(600, *rollout["actions"].shape[2:]))
    learner_logprobs, _, _ = agent.evaluate(obs, actions)
    np.testing.assert_allclose(rollout["logprobs"].reshape(-1), learner_logprobs.detach().numpy(), rtol=1e-4, atol=1e-4)
    if not discrete:  # the same stream of noise as one draw per step
        noise = np.stack([replay.standard_normal((2, act_dim)) for _ in range(300)])
        policy = fast_paths.NumpyActor(agent)
        expected = policy.actor(rollout["obs"].reshape(600, obs_dim)) + policy.std * noise.reshape(600, act_dim)
        np.testing.assert_allclose(rollout["actions"].reshape(600, act_dim), expected, rtol=1e-5, atol=1e-5)
    sampler.close()


def test_rollout_acts_on_zeros_for_a_non_finite_observation_and_stores_its_row_as_nan():
    """The rollout normalizes each step's observation for acting and marks the non-finite rows of what it stores
    after the loop: a NaN observation must be acted on as zeros (the env still gets a finite action) and stored as an
    all-NaN row, which the guard masks; every other row must be the normalized observation the policy acted on."""
    env_id = "tests.envs:NanObsSometimes-v0"  # a NaN observation every 97 steps of each env
    args = ppo_continuous.Args(env_id=env_id)
    sampler = ppo_continuous.Sampler(env_id, 2, 0, args)
    obs_dim, act_dim = sampler.check_spaces(env_id, sampler.envs[0])
    agent = perturbed_agent(obs_dim, act_dim, False)
    obs_rms = gae.RunningMeanStd(shape=(obs_dim,))
    obs_rms.update(np.random.default_rng(1).normal(0.5, 2.0, size=(64, obs_dim)))
    weights = ppo_continuous.policy_weights(learner_for(agent, obs_rms, True))
    sampler.set_policy(weights)
    replay = np.random.default_rng()
    replay.bit_generator.state = sampler.rng.bit_generator.state
    raw_first = sampler.raw_obs.copy()
    rollout = sampler.rollout(400)
    sampler.close()
    stored = rollout["obs"].reshape(800, obs_dim)
    bad = np.isnan(stored).any(axis=1)
    assert 4 <= bad.sum() <= 10 and np.isnan(stored[bad]).all()  # whole rows, and only the NaN observations
    policy = fast_paths.NumpyActor(agent)
    acted_on = np.where(bad[:, None], 0.0, stored).astype(np.float32)
    noise = replay.standard_normal((400, 2, act_dim)).reshape(800, act_dim)
    actions = rollout["actions"].reshape(800, act_dim)
    assert np.isfinite(actions).all()
    np.testing.assert_allclose(actions, policy.actor(acted_on) + policy.std * noise, rtol=1e-5, atol=1e-5)
    std = np.sqrt(obs_rms.var + 1e-8)
    np.testing.assert_array_equal(stored[:2], np.clip((raw_first - obs_rms.mean) / std, -10, 10).astype(np.float32))


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "CartPole-v1"])
def test_envs_get_actions_within_their_bounds_and_the_rollout_stores_the_drawn_ones(env_id):
    """A Box env is stepped with the drawn action clipped into its bounds, while the rollout stores the drawn action,
    whose log-probability is the policy's; a Discrete env (DPPO's sampler) gets the drawn index as it is."""
    sampler = sampler_for(env_id, 2)
    obs_dim, act_dim, discrete = dppo_ray.check_spaces(env_id, sampler.envs[0])
    agent = perturbed_agent(obs_dim, act_dim, discrete)
    if not discrete:
        with torch.no_grad():
            agent.actor_logstd.fill_(2.0)  # std 7.4 against Pendulum's bounds of +-2: most actions fall outside
    set_policy(sampler, ppo_continuous.policy_weights(learner_for(agent, gae.RunningMeanStd(shape=(obs_dim,)), True)))
    received = [[] for _ in sampler.envs]

    def recording(step, seen: list):
        def record_and_step(action):
            seen.append(np.copy(action))
            return step(action)

        return record_and_step

    for env, seen in zip(sampler.envs, received):
        env.step = recording(env.step, seen)
    rollout = sampler.rollout(50)
    sampler.close()
    got = np.stack([np.stack(seen) for seen in received], axis=1).reshape(rollout["actions"].shape)
    drawn = rollout["actions"]
    if discrete:
        np.testing.assert_array_equal(got, drawn)
        return
    space = sampler.action_space
    assert (np.abs(drawn) > space.high).mean() > 0.5
    # the env gets the action before the rollout stores it as float32
    np.testing.assert_array_equal(got.astype(np.float32), np.clip(drawn, space.low, space.high))


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "CartPole-v1"])
def test_rollout_episode_returns_and_lengths_carry_across_rollouts(env_id):
    """The rollout totals each finished episode's rewards once per rollout: the returns and lengths it reports, in
    the order the episodes ended, must be those of a step-by-step count over all rollouts' rewards and episode ends
    (episodes span rollouts: Pendulum's are 200 steps, the rollouts 70)."""
    sampler = sampler_for(env_id, 3)
    obs_dim, act_dim, discrete = dppo_ray.check_spaces(env_id, sampler.envs[0])
    obs_rms = gae.RunningMeanStd(shape=(obs_dim,))
    agent = perturbed_agent(obs_dim, act_dim, discrete)
    set_policy(sampler, ppo_continuous.policy_weights(learner_for(agent, obs_rms, True)))
    rollouts = [sampler.rollout(70) for _ in range(10)]
    sampler.close()
    rewards = np.concatenate([r["rewards"] for r in rollouts])
    ended = np.concatenate([r["terminations"] | r["truncations"] for r in rollouts])
    expected_returns, expected_lengths, running, length = [], [], np.zeros(3), np.zeros(3, int)
    for step in range(len(rewards)):
        running, length = running + rewards[step], length + 1
        for i in np.flatnonzero(ended[step]):
            expected_returns.append(running[i])
            expected_lengths.append(length[i])
            running[i], length[i] = 0.0, 0
    assert len(expected_lengths) >= 6
    np.testing.assert_allclose(np.concatenate([r["episode_returns"] for r in rollouts]), expected_returns, rtol=1e-12)
    np.testing.assert_array_equal(np.concatenate([r["episode_lengths"] for r in rollouts]), expected_lengths)
    if env_id == "Pendulum-v1":
        assert set(expected_lengths) == {200}
