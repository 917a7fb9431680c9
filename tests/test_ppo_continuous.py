"""Tests of ppo_continuous.py's algorithm: the Agent, acting, the rollout, the wiring of GAE, the update (plain and
stacked), and end to end, run exactly as a user runs it (a subprocess in a fresh working directory), the training
loop's TensorBoard tags and learning. (Checkpoints: test_checkpoints.py; run management: test_run_management.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.conftest import REPO, SMALL, VALUE_FIT, perturbed_agent, run_python, tensorboard_events

SCRIPT = REPO / "ppo_continuous.py"
sys.path.insert(0, str(REPO))

import checkpoints  # noqa: E402
import dppo_ray  # noqa: E402
import fast_paths  # noqa: E402
import gae  # noqa: E402
import ppo_continuous  # noqa: E402


def run(args: list[str], cwd: Path, timeout: float = 240, **kwargs) -> subprocess.CompletedProcess:
    return run_python(SCRIPT, args, cwd, timeout, **kwargs)


def scalars(run_dir: Path) -> EventAccumulator:
    return tensorboard_events(run_dir, histograms=0)


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
    result = run(["--env-id", "Pendulum-v1", "--total-timesteps", "1024", "--run-name", "p", *SMALL], cwd)
    assert result.returncode == 0, result.stderr
    return cwd, cwd / "runs" / "p"


def test_tensorboard_tags_and_summary(pendulum_run):
    cwd, run_dir = pendulum_run
    acc = scalars(run_dir)
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
    # the user's working directory gets runs/ and nothing else
    assert sorted(os.listdir(cwd)) == ["runs"]
    assert (run_dir / "checkpoint.pt").is_file()


def test_same_seed_same_run(tmp_path):
    args = ["--env-id", "Pendulum-v1", "--total-timesteps", "1024", *SMALL]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert run([*args, "--seed", "3", "--run-name", "s"], tmp_path / "a").returncode == 0
    assert run([*args, "--seed", "3", "--run-name", "s"], tmp_path / "b").returncode == 0
    runs = [scalars(tmp_path / d / "runs" / "s") for d in ("a", "b")]
    for tag in ["charts/episodic_return", "losses/value_loss", "losses/approx_kl"]:
        a, b = ([e.value for e in acc.Scalars(tag)] for acc in runs)
        assert a == b, tag
    ckpts = [torch.load(tmp_path / d / "runs" / "s" / "checkpoint.pt", weights_only=True) for d in ("a", "b")]
    for key, value in ckpts[0]["agent"].items():
        assert torch.equal(value, ckpts[1]["agent"][key]), key
    other = run([*args, "--seed", "4", "--run-name", "t"], tmp_path / "a")
    assert other.returncode == 0
    c = [e.value for e in scalars(tmp_path / "a" / "runs" / "t").Scalars("losses/value_loss")]
    assert c != [e.value for e in runs[0].Scalars("losses/value_loss")], "a different seed must change the run"


# ---------------------------------------------------------------------------------------------------------------------
# Gymnasium autoreset and the truncation bootstrap, on deterministic test envs (tests/envs.py)
# ---------------------------------------------------------------------------------------------------------------------
def critic_values(run_dir: Path) -> np.ndarray:
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    agent = ppo_continuous.Agent(1, 1)
    agent.load_state_dict(ckpt["agent"])
    with torch.no_grad():
        return agent.get_value(torch.arange(5, dtype=torch.float32)[:, None]).numpy()


def test_autoreset_records_real_episodes_only(tmp_path):
    """With SAME_STEP autoreset no fake reset transition enters the data: every 5-step episode returns exactly 5."""
    result = run(
        ["--env-id", "tests.envs:Truncating-v0", "--run-name", "c", "--total-timesteps", "1280", *VALUE_FIT], tmp_path
    )
    assert result.returncode == 0, result.stderr
    acc = scalars(tmp_path / "runs" / "c")
    lengths = [e.value for e in acc.Scalars("charts/episodic_length")]
    returns = [e.value for e in acc.Scalars("charts/episodic_return")]
    assert len(lengths) == 1280 // 5
    assert set(lengths) == {5.0} and set(returns) == {5.0}


def test_truncation_bootstraps_and_termination_does_not(tmp_path):
    """Reward 1 per step, gamma 0.5. If the time limit bootstraps from V(final obs), V = 1/(1-0.5) = 2 in every state;
    had truncation been treated as termination, V would fall to 1 at the last step. A real termination gives
    V(s_t) = 2 - 0.5^(4-t), i.e. 1 at the last step."""
    for env_id, name in [("tests.envs:Truncating-v0", "trunc"), ("tests.envs:Terminating-v0", "term")]:
        result = run(["--env-id", env_id, "--run-name", name, "--total-timesteps", "12800", *VALUE_FIT], tmp_path)
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
def test_learns_pendulum(tmp_path):
    """RL-Zoo's Pendulum settings (4 envs x 1024 steps, gamma 0.9, lr 1e-3), 100k steps, about a minute here.
    A random policy scores about -1200; this run reaches about -400 (mean of the last 100 training episodes)."""
    args = ["--env-id", "Pendulum-v1", "--total-timesteps", "102400", "--num-envs", "4", "--num-steps", "1024"]
    args += ["--gamma", "0.9", "--learning-rate", "1e-3", "--run-name", "learn", "--save-model", "--quiet"]
    result = run(args, tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "runs" / "learn" / "summary.json").read_text())
    assert summary["mean_return_last_episodes"] > -700, summary["mean_return_last_episodes"]
    evaluation = run(["--eval-checkpoint", str(tmp_path / "runs" / "learn" / "ppo_continuous.model")], tmp_path)
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
    obs_dim, act_dim = ppo_continuous.check_spaces(env_id, sampler.envs[0])
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


def random_batch(n: int, obs_dim: int, act_dim: int, discrete: bool) -> dict:
    g = torch.Generator().manual_seed(3)
    actions = torch.randint(0, act_dim, (n,), generator=g).float() if discrete else torch.randn(n, act_dim, generator=g)
    batch = dict(obs=torch.randn(n, obs_dim, generator=g), actions=actions, advantages=torch.randn(n, generator=g))
    batch |= {k: torch.randn(n, generator=g) for k in ("values", "returns")}
    return batch | dict(logprobs=torch.randn(n, generator=g) - 3, size=n, non_finite=0, outliers=0)


def fast_update_for(agent: ppo_continuous.Agent, lr: float = 1e-3) -> fast_paths.FastPaths:
    optimizer = torch.optim.Adam(agent.parameters(), lr=lr, eps=1e-5)
    return optimizer, fast_paths.FastPaths(True, fast_paths.StackedUpdate(agent, optimizer))


def test_stacked_update_computes_what_the_plain_update_computes():
    """StackedUpdate runs both nets with batched matmuls over one flat buffer and steps Adam by hand: the same
    parameters as the plain path (autograd and torch.optim.Adam) over a whole ppo_update, within float noise (several
    epochs, so Adam's moments, its bias correction and the gradient clip are exercised too)."""
    import copy

    args = ppo_continuous.Args(update_epochs=3, num_minibatches=4, learning_rate=1e-3, max_grad_norm=0.5)
    agent = perturbed_agent(11, 3, False)
    reference = copy.deepcopy(agent)
    optimizer, fast = fast_update_for(agent, args.learning_rate)
    batch = random_batch(256, 11, 3, False)
    torch.manual_seed(7)
    learner = ppo_continuous.Learner(agent, optimizer, None, None, fast)
    stats, problem = ppo_continuous.ppo_update(learner, batch, args, ppo_continuous.loss_settings(args, 0.01), 1)
    torch.manual_seed(7)
    torch_adam = torch.optim.Adam(reference.parameters(), lr=args.learning_rate, eps=1e-5)
    plain_learner = ppo_continuous.Learner(reference, torch_adam, None, None)
    loss_kwargs = ppo_continuous.loss_settings(args, 0.01)
    plain_stats, plain_problem = ppo_continuous.ppo_update(plain_learner, batch, args, loss_kwargs, 1)
    assert problem is None and plain_problem is None and stats["losses/value_loss"] > 0
    for key, value in plain_stats.items():
        assert value == pytest.approx(stats[key], rel=1e-3, abs=1e-5), key
    for (name, fast_param), plain in zip(agent.named_parameters(), reference.parameters()):
        assert not torch.equal(fast_param, perturbed_agent(11, 3, False).state_dict()[name]), f"{name} did not move"
        torch.testing.assert_close(fast_param, plain, rtol=1e-4, atol=1e-5, msg=name)
    saved, expected = fast.update.state_dict(), torch_adam.state_dict()
    assert len(saved["state"]) == len(expected["state"]) == len(list(agent.parameters()))
    for i, state in expected["state"].items():
        assert int(saved["state"][i]["step"]) == int(state["step"]) == args.update_epochs * args.num_minibatches
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(saved["state"][i][key], state[key], rtol=1e-3, atol=1e-8)


def agent_with(activation: type[torch.nn.Module], hidden_layers: int = 2) -> ppo_continuous.Agent:
    """The Agent with another activation or depth, as a researcher would edit mlp()."""
    agent = perturbed_agent(11, 3, False)
    for name in ("actor_mean", "critic"):
        net, layers = getattr(agent, name), []
        for i in range(hidden_layers):
            layers += [torch.nn.Linear(11 if i == 0 else 64, 64), activation()]
        setattr(agent, name, torch.nn.Sequential(*layers, torch.nn.Linear(64, net[-1].out_features)))
    return agent


@pytest.mark.parametrize(
    "activation, hidden_layers",
    [
        (torch.nn.Tanh, 2),
        (torch.nn.ReLU, 2),
        (torch.nn.SiLU, 2),
        (torch.nn.ELU, 2),
        (torch.nn.LeakyReLU, 2),
        (torch.nn.Sigmoid, 2),
        (torch.nn.Tanh, 3),
        (torch.nn.ReLU, 1),
    ],
)
@pytest.mark.parametrize("clip_vloss, ent_coef, decoupled", [(True, 0.0, False), (False, 0.01, True)])
def test_analytic_backward_matches_autograd(activation, hidden_layers, clip_vloss, ent_coef, decoupled):
    """StackedUpdate's written-out backward (no autograd) gives the loss, diagnostics and gradient of every parameter
    that autograd gives through Agent.evaluate and gae.ppo_loss, for every activation and depth it accepts, on the
    synthetic minibatch of the start-up check (every branch of both clips)."""
    import copy

    agent = agent_with(activation, hidden_layers) if (activation, hidden_layers) != (torch.nn.Tanh, 2) else None
    agent = agent or perturbed_agent(11, 3, False)
    reference = copy.deepcopy(agent)
    _, fast = fast_update_for(agent)
    minibatch = fast_paths.synthetic_minibatch(reference, 11, 0.2, decoupled)
    kw = dict(clip_coef=0.2, clip_vloss=clip_vloss, ent_coef=ent_coef, vf_coef=0.5, norm_adv=True)
    written_out = fast.update.loss_and_gradients(minibatch, **kw)
    plain_update = ppo_continuous.PlainUpdate(reference, torch.optim.SGD(reference.parameters()))
    plain = plain_update.loss_and_gradients(minibatch, **kw)
    assert 0 < plain.clipfrac.item() < 1
    for name in ("loss", "policy_loss", "value_loss", "entropy", "approx_kl", "old_approx_kl", "clipfrac"):
        torch.testing.assert_close(getattr(written_out, name), getattr(plain, name).detach(), msg=name)
    for (name, fast_param), plain_param in zip(agent.named_parameters(), reference.parameters()):
        assert plain_param.grad.abs().max() > 0, name
        # float32 noise grows with the gradient's size (the synthetic minibatch has ratios up to 6, weights up to 100)
        atol = 1e-5 * float(plain_param.grad.abs().max())
        torch.testing.assert_close(fast_param.grad, plain_param.grad, rtol=1e-4, atol=atol, msg=name)
    layers = fast.update.unflatten(fast.update.grads)
    assert not layers[-3][1, 1:].any() and not layers[-2][1, 0, 1:].any()  # the critic's padded outputs stay 0


def test_stacked_update_resumes_from_a_torch_adam_state():
    """A checkpoint's optimizer state (torch.optim.Adam's format, which both paths save) loaded into the optimizer
    reaches StackedUpdate, and the next step matches torch.optim.Adam's from the same state."""
    import copy

    agent = perturbed_agent(5, 2, False)
    reference = copy.deepcopy(agent)
    torch_adam = torch.optim.Adam(reference.parameters(), lr=1e-3, eps=1e-5)
    for p in reference.parameters():
        p.grad = torch.randn_like(p)
    torch_adam.step()
    agent.load_state_dict(reference.state_dict())
    optimizer = torch.optim.Adam(agent.parameters(), lr=0.5, eps=1e-5)
    optimizer.load_state_dict(torch_adam.state_dict())
    update = fast_paths.StackedUpdate(agent, optimizer)
    assert update.group["lr"] == 1e-3 and update.steps == 1
    for p, fast_p in zip(reference.parameters(), agent.parameters()):
        p.grad = torch.randn_like(p)
        fast_p.grad.copy_(p.grad)
    torch_adam.step()
    update.step()
    for fast_p, plain in zip(agent.parameters(), reference.parameters()):
        torch.testing.assert_close(fast_p, plain, rtol=1e-5, atol=1e-6)
    other = perturbed_agent(5, 2, False)
    with pytest.raises(ValueError, match="parameters"):
        fast_update_for(other)[1].update.load_state_dict({"state": {0: {}}, "param_groups": [{"lr": 1.0}]})


def choose_fast_paths(capsys, agent, optimizer, settings: list[dict], plain) -> tuple[fast_paths.FastPaths, list[str]]:
    """fast_paths.choose_fast_paths with the fast paths enabled, and the lines it printed (without the script's name
    before each)."""
    capsys.readouterr()
    fast = fast_paths.choose_fast_paths(agent, optimizer, settings, True, plain)
    prefix = f"{fast_paths.PROG}: "
    printed = capsys.readouterr().err.splitlines()
    assert all(line.startswith(prefix) for line in printed), printed
    return fast, [line[len(prefix) :] for line in printed]


@pytest.mark.parametrize(
    "change, reason",
    [
        ("critic width", "different widths"),
        ("layer norm", "LayerNorm"),
        ("sgd", "SGD"),
        ("adam weight decay", "weight_decay"),
    ],
)
def test_a_network_or_optimizer_the_stacked_update_cannot_run_is_refused_with_its_reason(change, reason, capsys):
    agent = perturbed_agent(5, 2, False)
    if change == "critic width":
        agent.critic[2], agent.critic[4] = torch.nn.Linear(64, 32), torch.nn.Linear(32, 1)
    if change == "layer norm":
        agent.actor_mean.insert(1, torch.nn.LayerNorm(64))
        agent.critic.insert(1, torch.nn.LayerNorm(64))
    optimizer = {
        "sgd": torch.optim.SGD(agent.parameters(), lr=1e-3),
        "adam weight decay": torch.optim.Adam(agent.parameters(), weight_decay=1e-4),
    }.get(change, torch.optim.Adam(agent.parameters()))
    with pytest.raises(fast_paths.DoesNotFit, match=reason):
        fast_paths.StackedUpdate(agent, optimizer)
    settings = [dict(clip_coef=0.2, clip_vloss=True, ent_coef=0.0, vf_coef=0.5, norm_adv=True)]
    plain = (ppo_continuous.PlainUpdate, ppo_continuous.clip_gradients)
    fast, lines = choose_fast_paths(capsys, agent, optimizer, settings, plain)
    assert fast.update is None and fast.acting  # LayerNorm included: numpy runs that one layer in torch
    assert len(lines) == 1 and lines[0].startswith("fast update off:") and reason in lines[0]


def test_the_start_up_check_catches_a_fast_path_that_drifts_from_the_definition(monkeypatch, capsys):
    """The check compares numbers, not shapes: a wrong derivative in the written-out backward, or a gradient clip
    edited to treat tensors one by one, makes the update step aside; a numpy actor that no longer mirrors the Agent
    makes acting step aside; so does an Adam step without its bias correction."""
    agent = perturbed_agent(5, 2, False)
    optimizer = torch.optim.Adam(agent.parameters(), eps=1e-5)
    settings = [dict(clip_coef=0.2, clip_vloss=True, ent_coef=0.0, vf_coef=0.5, norm_adv=True)]
    plain = (ppo_continuous.PlainUpdate, ppo_continuous.clip_gradients)
    fast, lines = choose_fast_paths(capsys, agent, optimizer, settings, plain)
    assert fast.acting and fast.update is not None and lines == []

    def per_tensor_clip(gradients, max_norm):
        for g in gradients:
            norm = float(g.norm())
            if norm > max_norm:
                g.mul_(max_norm / norm)
        return max(float(g.norm()) for g in gradients)

    def step_without_bias_correction(self):
        lr, (beta1, beta2), eps = float(self.group["lr"]), self.group["betas"], self.group["eps"]
        self.steps += 1
        self.exp_avg.lerp_(self.grads, 1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(self.grads, self.grads, value=1 - beta2)
        self.params.addcdiv_(self.exp_avg, self.exp_avg_sq.sqrt().add_(eps), value=-lr)

    for drift in ("derivative", "clip", "actor", "adam"):
        agent = agent_with(torch.nn.ReLU)  # 11 observations, 3 actions
        optimizer = torch.optim.Adam(agent.parameters(), eps=1e-5)
        checked = (ppo_continuous.PlainUpdate, per_tensor_clip) if drift == "clip" else plain
        with monkeypatch.context() as m:
            if drift == "derivative":
                m.setitem(fast_paths.DERIVATIVES, torch.nn.ReLU, lambda module, u, h: torch.ones_like(u))
            if drift == "actor":
                m.setattr(fast_paths, "numpy_layer", lambda module: fast_paths.torch_layer(torch.nn.Tanh()))
            if drift == "adam":
                m.setattr(fast_paths.StackedUpdate, "step", step_without_bias_correction)
            fast, lines = choose_fast_paths(capsys, agent, optimizer, settings, checked)
        if drift == "actor":
            assert not fast.acting and len(lines) == 1 and lines[0].startswith("fast acting off: it differs")
        else:
            assert fast.update is None and len(lines) == 1 and "differs from autograd" in lines[0], lines
            assert ("Adam step" in lines[0]) == (drift == "adam"), lines


@pytest.mark.parametrize("with_statistics", [True, False])
def test_normalize_obs_standardizes_clips_and_marks_non_finite_rows(with_statistics):
    rng = np.random.default_rng(0)
    raw = rng.normal(size=(5, 4)) * 3.0
    raw[1, 2], raw[3, 0] = np.nan, -np.inf
    mean, std = (rng.normal(size=4), rng.uniform(0.5, 2.0, size=4)) if with_statistics else (None, None)
    expected = raw.copy() if mean is None else np.clip((raw - mean) / std, -2.5, 2.5)
    expected[[1, 3]] = np.nan  # the whole row, whatever the clip would have made of it
    out = np.full((5, 4), 7.0, np.float32)
    x = gae.normalize_obs(raw, mean, std, 2.5, out=out)
    assert x is out and x.dtype == np.float32
    np.testing.assert_array_equal(x, expected.astype(np.float32))
    np.testing.assert_array_equal(gae.normalize_obs(raw, mean, std, 2.5), x)
    for_acting = gae.normalize_obs(raw, mean, std, 2.5, fill=0.0)
    np.testing.assert_array_equal(for_acting[[1, 3]], 0.0)
    np.testing.assert_array_equal(np.delete(for_acting, [1, 3], axis=0), np.delete(x, [1, 3], axis=0))
