"""fast_paths.py and the update it feeds: the numpy actor against TorchActor (at start-up and on a rollout's own data,
and what the run does when it differs), what stops the compiled gradient, and the compiled gradient against
the same gradient run eagerly over whole steps of the optimizer make_learner builds."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from torch.distributions import Independent, Normal, TanhTransform, TransformedDistribution

from tests.conftest import REPO, perturbed_agent

sys.path.insert(0, str(REPO))

import checkpoints  # noqa: E402
import fast_paths  # noqa: E402
import gae  # noqa: E402
import ppo_continuous  # noqa: E402
import run_management  # noqa: E402

COMPILING = (
    "compiling the gradient with torch.compile (a graph not in the cache takes a while to build; --no-compile trains "
    "without it)"
)
SETTINGS = dict(clip_coef=0.2, clip_vloss=True, ent_coef=0.0, vf_coef=0.5, norm_adv=True)


def printed(capsys) -> list[str]:
    """The fast paths' lines printed since the last read, without the script's name before each."""
    lines = capsys.readouterr().err.splitlines()
    assert all(": " in line for line in lines), lines
    return [line.split(": ", 1)[1] for line in lines]


def random_batch(n: int, obs_dim: int, act_dim: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    batch = {k: torch.randn(n, generator=g) for k in ("logprobs", "advantages", "values", "returns")}
    batch["obs"] = torch.randn(n, obs_dim, generator=g)
    batch["actions"] = torch.randn(n, act_dim, generator=g)
    batch["size"] = n
    return batch


def learner_with(agent: ppo_continuous.Agent, **flags) -> tuple[ppo_continuous.Learner, ppo_continuous.Args]:
    args = ppo_continuous.Args(**(dict(num_envs=1, num_steps=256, num_minibatches=4, update_epochs=2) | flags))
    ppo_continuous.validate_args(args)
    learner = ppo_continuous.make_learner(args, agent, torch.device("cpu"))
    ppo_continuous.start_fast_paths(learner, args)
    return learner, args


# ---------------------------------------------------------------------------------------------------------------------
# The numpy actor
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("activation", [torch.nn.Tanh, torch.nn.ReLU, torch.nn.ELU, torch.nn.SiLU, torch.nn.LayerNorm])
def test_the_numpy_actor_acts_as_torch_actor_for_the_layers_it_mirrors_or_runs_in_torch(activation):
    agent = perturbed_agent(5, 2)
    layers = list(agent.actor_mean)
    layers[1] = activation(64) if activation is torch.nn.LayerNorm else activation()
    agent.actor_mean = torch.nn.Sequential(*layers)
    assert fast_paths.check_acting(agent, ppo_continuous.TorchActor) is None
    obs = np.random.default_rng(0).normal(size=(32, 5)).astype(np.float32)
    noise = np.random.default_rng(1).normal(size=(32, 2))
    numpy_actor, torch_actor = fast_paths.NumpyActor(agent), ppo_continuous.TorchActor(agent)
    np.testing.assert_allclose(numpy_actor.act(obs, noise), torch_actor.act(obs, noise), rtol=1e-5, atol=1e-6)
    actions = torch_actor.act(obs, noise)
    np.testing.assert_allclose(
        numpy_actor.log_prob(obs, actions, noise), torch_actor.log_prob(obs, actions, noise), rtol=1e-5, atol=1e-5
    )


class HalfNoiseActor(ppo_continuous.TorchActor):
    """A research edit of TorchActor: half the exploration noise. The numpy actor is checked against this, not
    against Agent.get_distribution, so the edit is what acts."""

    def act(self, obs, noise):
        return super().act(obs, 0.5 * noise)


def test_the_start_up_check_compares_with_torch_actor_itself():
    agent = perturbed_agent(5, 2)
    assert fast_paths.check_acting(agent, ppo_continuous.TorchActor) is None
    problem = fast_paths.check_acting(agent, HalfNoiseActor)
    assert problem.startswith("its ") and " differ from TorchActor by " in problem, problem


def tanh_gaussian(agent: ppo_continuous.Agent, x: torch.Tensor):
    mean = agent.actor_mean(x)
    std = agent.actor_logstd.expand_as(mean).exp()
    return Independent(TransformedDistribution(Normal(mean, std), TanhTransform(cache_size=1)), 1)


def test_a_policy_torch_actor_samples_by_itself_keeps_acting_in_torch_and_acts_with_tanh_of_the_mean():
    """A tanh-squashed Gaussian: TorchActor draws it from torch's generator, which no mirror can follow; the check
    says so. The mean action (checkpoints.distribution_mode, what evaluation and a saved policy take) is tanh of the
    Gaussian's mean."""
    agent = perturbed_agent(5, 2)
    agent.get_distribution = lambda x: tanh_gaussian(agent, x)
    problem = fast_paths.check_acting(agent, ppo_continuous.TorchActor)
    assert "draws randomness of its own" in problem, problem
    obs = np.random.default_rng(0).normal(size=(7, 5)).astype(np.float32)
    with torch.no_grad():
        action = checkpoints.distribution_mode(agent.get_distribution(torch.from_numpy(obs))).numpy()
        expected = torch.tanh(agent.actor_mean(torch.from_numpy(obs))).numpy()
    np.testing.assert_allclose(action, expected, rtol=1e-6)


class ClampedAgent(ppo_continuous.Agent):
    """An input clamp that binds only beyond 5: never on the start-up check's N(0, 1) observations."""

    def get_distribution(self, x):
        return super().get_distribution(x.clamp(-5, 5))

    def get_value(self, x):
        return super().get_value(x.clamp(-5, 5))


def audit(agent, obs: np.ndarray, noise: np.ndarray):
    actor = fast_paths.NumpyActor(agent)
    actions = actor.act(obs, noise).astype(np.float32)
    logprobs = actor.log_prob(obs, actions, noise).astype(np.float32)
    return fast_paths.audit_acting(actor, ppo_continuous.TorchActor(agent), obs, noise, actions, logprobs)


def test_the_acting_audit_catches_an_input_clamp_that_binds_only_on_real_observations():
    torch.manual_seed(0)
    agent = ClampedAgent(3, 1)
    assert fast_paths.check_acting(agent, ppo_continuous.TorchActor) is None  # the start-up check cannot see it
    rng = np.random.default_rng(0)
    for scale, binds in ((1.0, False), (8.0, True)):
        obs = (rng.normal(size=(256, 2, 3)) * np.array([1.0, 1.0, scale])).astype(np.float32)
        obs = np.minimum(obs, 4.9) if not binds else obs
        relative, problem = audit(agent, obs, rng.normal(size=(256, 2, 1)))
        if binds:
            assert relative > fast_paths.TOLERANCE and " differ from TorchActor on this rollout" in problem, problem
        else:
            assert relative < fast_paths.TOLERANCE and problem is None


def test_a_log_std_floor_reached_later_is_caught_by_the_acting_audit():
    """A floor on the log-std that the start-up check's weights never reach: once training drives the log-std past
    it, the numpy actor's std (and so its actions and log-probabilities) differ from TorchActor's."""

    class FlooredAgent(ppo_continuous.Agent):
        def get_distribution(self, x):
            mean = self.actor_mean(x)
            std = self.actor_logstd.clamp(min=-1.0).expand_as(mean).exp()
            return Independent(Normal(mean, std), 1)

    torch.manual_seed(0)
    agent = FlooredAgent(3, 2)
    assert fast_paths.check_acting(agent, ppo_continuous.TorchActor) is None
    obs = np.random.default_rng(1).normal(size=(64, 1, 3)).astype(np.float32)
    noise = np.random.default_rng(2).normal(size=(64, 1, 2))
    for logstd, caught in ((-0.5, False), (-1.6, True)):
        with torch.no_grad():
            agent.actor_logstd.fill_(logstd)
        _, problem = audit(agent, obs, noise)
        assert (problem is not None) == caught, problem


def acting_rollout(audit: float, problem: str = "") -> dict:
    return {"acting_audit": np.array(audit), "acting_problem": np.array(problem)}


def test_the_samplers_acting_audits_move_acting_to_torch_once_and_count_each_discarded_rollout(capsys):
    """read_acting_audits: the largest audit is recorded; each rollout whose numpy actor failed its audit (which its
    sampler discarded and sampled again with torch) is counted; acting moves to torch at the first such rollout, in
    one line, and stays there."""
    fast = fast_paths.FastPaths(acting=True, used={"acting": "numpy"})
    counters = {"discarded_rollouts": 0}
    fast.read_acting_audits([acting_rollout(2e-7), acting_rollout(np.nan), acting_rollout(5e-6)], 1, counters)
    assert fast.acting and fast.switches == [] and counters["discarded_rollouts"] == 0
    assert fast.differences["acting"] == pytest.approx(5e-6) and printed(capsys) == []

    problem = "its actions differ from TorchActor on this rollout's observations by 0.3 of their scale"
    fast.read_acting_audits([acting_rollout(1e-6), acting_rollout(0.3, problem), acting_rollout(0.2, "x")], 5, counters)
    assert not fast.acting and counters["discarded_rollouts"] == 2
    assert fast.differences["acting"] == pytest.approx(0.3)
    assert fast.switches == [
        {"part": "acting", "iteration": 5, "reason": f"{problem}; its rollout was discarded and sampled again"}
    ]
    assert fast.used["acting"].startswith(f"torch (TorchActor) from iteration 5: {problem}")
    lines = printed(capsys)
    assert len(lines) == 1 and lines[0].startswith(f"fast acting off at iteration 5: {problem}"), lines

    fast.read_acting_audits([acting_rollout(0.4, problem)], 6, counters)  # a rollout still acting numpy: counted
    assert counters["discarded_rollouts"] == 3 and len(fast.switches) == 1 and printed(capsys) == []


class ShiftedAgent(ppo_continuous.Agent):
    """A policy whose mean is not actor_mean's output: the numpy actor, which mirrors actor_mean, acts otherwise."""

    def get_distribution(self, x):
        dist = super().get_distribution(x)
        return Independent(Normal(2.0 * dist.mean + 0.5, dist.stddev), 1)


class ShiftedSampler(ppo_continuous.Sampler):
    def make_agent(self):
        return ShiftedAgent(*self.spaces)


@pytest.mark.parametrize("agent_type", [ppo_continuous.Agent, ShiftedAgent])
def test_a_rollout_whose_numpy_actor_failed_its_audit_is_sampled_again_with_torch(agent_type):
    """Sampler.rollout: a numpy actor that acted otherwise than TorchActor has its rollout discarded and sampled again
    with TorchActor (which the sampler then keeps). The rollout returned is the second sample, anchored to Agent (its
    log-probabilities are Agent's), with the steps of both and the episodes of both, and the first one's audit. A
    numpy actor that matches keeps its rollout."""
    args = ppo_continuous.Args(env_id="Pendulum-v1", num_envs=2, norm_obs=False, obs_warmup_steps=0)
    sampler_type = ShiftedSampler if agent_type is ShiftedAgent else ppo_continuous.Sampler
    samplers = [sampler_type(args.env_id, args.num_envs, 3, args) for _ in range(2)]
    torch.manual_seed(0)
    agent = agent_type(*samplers[0].spaces)
    with torch.no_grad():
        for p in agent.parameters():
            p.add_(0.3 * torch.randn_like(p))
    learner = ppo_continuous.make_learner(args, agent, torch.device("cpu"))
    learner.fast = fast_paths.FastPaths(acting=True)
    for sampler in samplers:
        sampler.set_policy(ppo_continuous.policy_weights(learner))
        assert isinstance(sampler.policy, fast_paths.NumpyActor)
    steps = 250  # Pendulum's episodes are 200 steps: each of the two samples ends an episode in each env
    rollout = samplers[0].rollout(steps)
    first = samplers[1].sample(steps)  # the same, step by step: the numpy actor's sample, then torch's
    mismatched = agent_type is ShiftedAgent
    assert bool(str(rollout["acting_problem"])) == mismatched
    assert float(rollout["acting_audit"]) == float(first["acting_audit"])
    assert str(rollout["acting_problem"]) == str(first["acting_problem"])
    if not mismatched:
        assert rollout["env_steps"] == steps * args.num_envs and isinstance(samplers[0].policy, fast_paths.NumpyActor)
        for key in ("obs", "actions", "logprobs", "rewards", "episode_lengths"):
            np.testing.assert_array_equal(rollout[key], first[key])
        return
    assert float(rollout["acting_audit"]) > fast_paths.TOLERANCE
    assert isinstance(samplers[0].policy, ppo_continuous.TorchActor)
    samplers[1].policy = ppo_continuous.TorchActor(samplers[1].agent)
    again = samplers[1].sample(steps)
    assert rollout["env_steps"] == 2 * steps * args.num_envs == first["env_steps"] + again["env_steps"]
    for key in ("obs", "actions", "logprobs", "rewards", "terminations", "truncations", "final_obs", "next_obs"):
        np.testing.assert_array_equal(rollout[key], again[key], err_msg=key)
    for key in ("episode_returns", "episode_lengths"):
        np.testing.assert_array_equal(rollout[key], np.concatenate([first[key], again[key]]), err_msg=key)
    assert len(first["episode_lengths"]) == 2 and list(rollout["episode_lengths"]) == [200] * 4
    with torch.no_grad():  # the rollout kept is the one Agent itself acted: its stored log-probabilities are Agent's
        obs, actions = (torch.from_numpy(rollout[k].reshape(-1, rollout[k].shape[-1])) for k in ("obs", "actions"))
        expected = samplers[0].agent.evaluate(obs, actions)[0].numpy()
        obs, actions = (torch.from_numpy(first[k].reshape(-1, first[k].shape[-1])) for k in ("obs", "actions"))
        discarded = samplers[0].agent.evaluate(obs, actions)[0].numpy()
    np.testing.assert_allclose(rollout["logprobs"].reshape(-1), expected, rtol=1e-5, atol=1e-5)
    assert not np.allclose(first["logprobs"].reshape(-1), discarded, rtol=1e-3, atol=1e-3)  # the discarded one's not
    for sampler in samplers:
        sampler.close()


# ---------------------------------------------------------------------------------------------------------------------
# The compiled gradient
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "state, words",
    [
        ("gradient hook", "a gradient hook on critic.0.weight (a compiled graph does not run it)"),
        ("forward hook", "a module hook on actor_mean.0"),
        ("buffer", "a buffer (scale), which a forward pass may change"),
        ("float16", "parameters that are not float32 or float64"),
        ("batch norm", "a BatchNorm layer (BatchNorm1d) in critic.1 in training mode (its batch statistics make each"),
    ],
)
def test_what_the_compiled_gradient_cannot_honour_means_the_eager_gradient_with_its_reason(capsys, state, words):
    agent = perturbed_agent(5, 2)
    if state == "gradient hook":
        agent.critic[0].weight.register_hook(lambda g: g * 0.5)
    if state == "forward hook":
        agent.actor_mean[0].register_forward_hook(lambda module, inputs, output: output * 2)
    if state == "buffer":
        agent.register_buffer("scale", torch.ones(1))
    if state == "float16":
        agent.actor_logstd.data = agent.actor_logstd.data.half()
    if state == "batch norm":
        agent.critic.insert(1, torch.nn.BatchNorm1d(64))
        words = fast_paths.compile_blockers(agent)
        assert words.startswith("a BatchNorm layer (BatchNorm1d) in critic.1 in training mode (its batch statistics")
        acting = perturbed_agent(5, 2)
        acting.actor_mean.insert(1, torch.nn.BatchNorm1d(64))
        assert fast_paths.acting_blockers(acting).startswith("a BatchNorm layer (BatchNorm1d) in actor_mean.1 in")
    assert fast_paths.compile_blockers(agent) == words
    capsys.readouterr()
    learner, _ = learner_with(agent)
    assert learner.fast.compiled is None and learner.fast.used["gradient"] == f"eager clipped_gradient ({words})"
    assert f"compiled gradient off: {words}; training with the eager gradient" in printed(capsys)


def test_random_ops_in_the_compiled_gradient_draw_what_the_eager_gradient_draws(monkeypatch):
    """A Dropout layer, functional dropout in Agent.get_value, a random op in gae.ppo_loss and noise added to the
    gradients in clip_gradients: compiled, the gradient function draws from torch's generator what it draws run
    eagerly, in the same order (the gradients equal to rounding, the generator left in the same state), three times
    in a row; no step-aside."""
    import torch.nn.functional as F

    class NoisyAgent(ppo_continuous.Agent):
        def get_value(self, x):
            return F.dropout(self.critic(x), 0.1, training=True).squeeze(-1)

    plain_loss, plain_clip = gae.ppo_loss, ppo_continuous.clip_gradients

    def noisy_loss(*args, **kwargs):
        stats = plain_loss(*args, **kwargs)
        return stats._replace(loss=stats.loss * (1 + 0.1 * torch.rand(())))

    def noisy_clip(grads, max_norm):
        return plain_clip([g + 1e-3 * torch.randn_like(g) for g in grads], max_norm)

    monkeypatch.setattr(gae, "ppo_loss", noisy_loss)
    monkeypatch.setattr(ppo_continuous, "clip_gradients", noisy_clip)
    torch.manual_seed(0)
    agent = NoisyAgent(5, 2)
    agent.actor_mean.insert(2, torch.nn.Dropout(0.2))
    assert fast_paths.compile_blockers(agent) is None
    generator = torch.Generator().manual_seed(1)
    minibatch = {k: torch.randn(64, generator=generator) for k in ("logprobs", "advantages", "values", "returns")}
    minibatch |= {"obs": torch.randn(64, 5, generator=generator), "actions": torch.randn(64, 2, generator=generator)}
    loss_kwargs = dict(clip_coef=0.2, clip_vloss=True, ent_coef=0.0, vf_coef=0.5, norm_adv=True)
    params = list(agent.parameters())
    compiled = fast_paths.compile_for(ppo_continuous.clipped_gradient, agent)
    losses = []
    for _ in range(3):
        before = torch.get_rng_state()
        eager, eager_stats, _ = ppo_continuous.clipped_gradient(agent, params, minibatch, loss_kwargs, 0.5)
        after_eager = torch.get_rng_state()
        torch.set_rng_state(before)
        traced, traced_stats, _ = compiled(agent, params, minibatch, loss_kwargs, 0.5)
        assert torch.equal(torch.get_rng_state(), after_eager), "the compiled gradient drew as many numbers"
        for a, b in zip(eager, traced):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(traced_stats["loss"], eager_stats["loss"], rtol=1e-5, atol=1e-7)
        losses.append(eager_stats["loss"].item())
    assert len(set(losses)) == 3, "each call drew new noise"


def test_a_hook_registered_during_the_run_moves_the_next_update_to_the_eager_gradient(capsys):
    agent = perturbed_agent(5, 2)
    learner, args = learner_with(agent, compile=False)
    stand_in = learner.fast.compiled = object()  # stands in for the compiled step: only the choice is tested
    assert fast_paths.update_gradient(learner, ppo_continuous.clipped_gradient, 1) is stand_in
    assert learner.fast.switches == []
    agent.actor_logstd.register_hook(lambda g: g * 0.0)
    capsys.readouterr()
    eager = fast_paths.update_gradient(learner, ppo_continuous.clipped_gradient, 2)
    assert eager.func is fast_paths.set_grads and eager.args == (ppo_continuous.clipped_gradient,)
    assert learner.fast.compiled is None
    lines = printed(capsys)
    assert learner.fast.switches[0]["iteration"] == 2 and lines[0].startswith("compiled gradient off at iteration 2: a")
    assert "a gradient hook on actor_logstd" in lines[0]


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("where", ["critic.2.weight", "a tensor the optimizer holds"])
def test_a_post_accumulate_grad_hook_stops_the_run_before_the_update_with_one_line_naming_it(compiled, where):
    """torch.autograd.grad accumulates nothing, so neither gradient path could run a post-accumulate-grad hook: one on
    a trained tensor (an Agent's parameter, or a tensor only the optimizer holds) stops the run before the update, which
    trains nothing; a hook registered during the run stops the update after it."""
    agent = perturbed_agent(5, 2)
    learner, args = learner_with(agent, compile=compiled)
    _, problem = ppo_continuous.ppo_update(learner, random_batch(256, 5, 2), args, SETTINGS, 1)
    assert problem is None
    tensor = agent.critic[2].weight
    if where != "critic.2.weight":
        tensor = torch.zeros(3, requires_grad=True)
        learner.optimizer.add_param_group({"params": [tensor]})
    tensor.register_post_accumulate_grad_hook(lambda t: None)
    before = [p.detach().clone() for p in agent.parameters()]
    steps = int(learner.optimizer.state[agent.critic[2].weight]["step"])
    with pytest.raises(run_management.StopRun) as stop:
        ppo_continuous.ppo_update(learner, random_batch(256, 5, 2, seed=1), args, SETTINGS, 2)
    assert str(stop.value) == (
        f"a post-accumulate-grad hook on {where} would never run: the gradient is taken with torch.autograd.grad "
        "(Tensor.register_hook runs, before the clip)"
    )
    assert all(torch.equal(p, q) for p, q in zip(agent.parameters(), before))
    assert int(learner.optimizer.state[agent.critic[2].weight]["step"]) == steps


def test_a_gradient_hook_runs_on_every_minibatch_of_the_eager_gradient():
    """What the post-accumulate-grad hook's line points to: Tensor.register_hook runs inside torch.autograd.grad, once
    a minibatch, on the gradient before the clip, and what it returns is the gradient trained on."""
    agent = perturbed_agent(5, 2)
    learner, args = learner_with(agent)
    seen = []
    agent.critic[2].weight.register_hook(lambda g: seen.append(g.norm()) or g * 0.0)
    weight = agent.critic[2].weight.detach().clone()
    _, problem = ppo_continuous.ppo_update(learner, random_batch(256, 5, 2), args, SETTINGS, 1)
    assert problem is None and learner.fast.compiled is None  # a gradient hook: the eager gradient
    assert len(seen) == args.update_epochs * args.num_minibatches and all(norm > 0 for norm in seen)
    assert torch.equal(agent.critic[2].weight, weight), "a zero gradient: Adam's first steps leave the weight as it was"


@pytest.mark.slow
@pytest.mark.parametrize("decoupled", [False, True])
def test_the_compiled_gradient_steps_as_the_eager_one_over_ten_minibatches(decoupled):
    """The compiled gradient (clipped_gradient, autograd through the live Agent and gae.ppo_loss, compiled) against the
    same function run eagerly:
    ten steps of ppo_update's loop, each taken by the optimizer make_learner built, from the same weights. The
    parameters and the optimizer's state (step, moments) agree at float32's noise, and the loss settings' entropy
    term and the decoupled loss's behaviour log-probabilities reach both."""
    batch = random_batch(640, 5, 2)
    if decoupled:
        batch["behaviour_logprobs"] = batch["logprobs"] - 0.3 * torch.rand(640, generator=torch.Generator())
    learners = []
    for compiled in (True, False):
        learner, args = learner_with(perturbed_agent(5, 2), compile=compiled, num_steps=640, num_minibatches=10)
        args.update_epochs = 1
        learners.append(learner)
        torch.manual_seed(5)  # the same shuffle
        stats, problem = ppo_continuous.ppo_update(learner, batch, args, SETTINGS | {"ent_coef": 0.01}, 1)
        assert problem is None, problem
    compiled, eager = learners
    assert compiled.fast.compiled is not None and compiled.fast.switches == [], compiled.fast.used
    assert eager.fast.compiled is None
    for p, q in zip(compiled.agent.parameters(), eager.agent.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
        state, eager_state = compiled.optimizer.state[p], eager.optimizer.state[q]
        assert int(state["step"]) == int(eager_state["step"]) == 10
        torch.testing.assert_close(state["exp_avg"], eager_state["exp_avg"], rtol=1e-4, atol=1e-7)
        torch.testing.assert_close(state["exp_avg_sq"], eager_state["exp_avg_sq"], rtol=1e-4, atol=1e-10)


def test_a_compile_that_fails_trains_with_the_eager_gradient_after_one_line(capsys, monkeypatch):
    """A machine where inductor cannot build (no C++ compiler), or code torch.compile cannot trace: the first
    minibatch's compile raises, one line says why, and that minibatch and every later one take the eager gradient."""

    def failing_compile(fn, **kwargs):
        def run(*args, **kw):
            raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found\nmore detail")

        return run

    monkeypatch.setattr(torch, "compile", failing_compile)
    learner, args = learner_with(perturbed_agent(5, 2))
    assert learner.fast.compiled is not None
    capsys.readouterr()
    _, problem = ppo_continuous.ppo_update(learner, random_batch(256, 5, 2), args, SETTINGS, 1)
    assert problem is None and learner.fast.compiled is None
    lines = printed(capsys)
    assert lines == [
        COMPILING,
        "compiled gradient off at iteration 1: torch.compile failed (RuntimeError: InvalidCxxCompiler: No working C++ "
        "compiler found); eager from now on",
    ], lines
    assert learner.fast.used["gradient"].startswith("eager from iteration 1")


@pytest.mark.parametrize("generator", ["python", "numpy"])
def test_a_draw_from_python_or_numpy_in_the_gradient_is_named_with_its_line_and_what_to_do(
    capsys, monkeypatch, generator
):
    """Python's random module or np.random in the loss: dynamo cannot trace it, and the line says which generator,
    where, and to draw with torch instead; the update then trains with the eager gradient."""
    import random

    plain_loss = gae.ppo_loss

    def drawing_loss(*args, **kwargs):
        stats = plain_loss(*args, **kwargs)
        if generator == "python":
            return stats._replace(loss=stats.loss * (1 + 0.1 * random.random()))
        return stats._replace(loss=stats.loss * (1 + 0.1 * float(np.random.rand())))  # noqa: NPY002

    monkeypatch.setattr(gae, "ppo_loss", drawing_loss)
    learner, args = learner_with(perturbed_agent(5, 2))
    capsys.readouterr()
    _, problem = ppo_continuous.ppo_update(learner, random_batch(256, 5, 2), args, SETTINGS, 1)
    assert problem is None and learner.fast.compiled is None
    lines = [line for line in printed(capsys) if line != COMPILING]
    named = "Python's random module" if generator == "python" else "numpy's generator (np.random)"
    assert len(lines) == 1 and lines[0].startswith(f"compiled gradient off at iteration 1: a draw from {named} at "), (
        lines
    )
    assert "test_fast_paths.py:" in lines[0] and "draw with torch instead" in lines[0], lines


def test_a_failure_keeps_its_cause_where_its_first_line_only_introduces_it():
    """torch.compile's BackendCompilerFailed reads "backend='inductor' raised:" on its first line, its cause after."""
    from torch._dynamo.exc import BackendCompilerFailed

    cause = RuntimeError("C++ compile error\n\nCommand:\ng++ graph.cpp")
    words = fast_paths.failure(BackendCompilerFailed(torch.compile, cause, None))
    assert words == "BackendCompilerFailed: backend='compile' raised: RuntimeError: C++ compile error", words
    assert fast_paths.failure(ValueError("one line\nand more")) == "ValueError: one line"
    assert fast_paths.failure(KeyError()) == "KeyError: no message"


class CountingAgent(ppo_continuous.Agent):
    """A research edit that keeps a Python number in the graph: the value scaled by a count the loop sets every
    update. torch.compile holds the count as a constant, so each new value is a graph of its own."""

    updates = 0

    def evaluate(self, x, action):
        logprob, entropy, value = super().evaluate(x, action)
        return logprob, entropy, value * (self.updates / (self.updates + 1))


@pytest.mark.slow
def test_a_number_that_changes_every_update_stops_the_compile_after_two_recompiles_with_one_line_naming_it(capsys):
    learner, args = learner_with(CountingAgent(5, 2))
    capsys.readouterr()
    for iteration in range(1, 7):
        learner.agent.updates = iteration
        update_once(learner, args, iteration)
        assert (learner.fast.compiled is None) == (iteration > fast_paths.RECOMPILES + 1), iteration
    lines = printed(capsys)
    off = f"compiled gradient off at iteration {fast_paths.RECOMPILES + 2}: agent.updates (the newest graph holds it "
    assert lines[0] == COMPILING and len(lines) == 2 and lines[1].startswith(off), lines
    assert f"constant {fast_paths.RECOMPILES + 1}) keeps changing" in lines[1], lines[1]
    assert lines[1].endswith("; eager from now on"), lines[1]
    assert [switch["iteration"] for switch in learner.fast.switches] == [fast_paths.RECOMPILES + 2]


def test_the_samplers_copies_carry_an_attribute_set_on_the_learners_agent_during_the_run():
    """A flag that switches on a squash, set on the learner's Agent between iterations: the samplers' Agents (rebuilt
    from the weights) act with it too, so their stored log-probabilities are the learner's."""

    class SquashableAgent(ppo_continuous.Agent):
        def get_distribution(self, x):
            dist = super().get_distribution(x)
            if getattr(self, "squash", False):
                return Independent(Normal(torch.tanh(dist.mean), dist.stddev), 1)
            return dist

    class SquashableSampler(ppo_continuous.Sampler):
        def make_agent(self):
            return SquashableAgent(*self.spaces)

    args = ppo_continuous.Args(env_id="Pendulum-v1", num_envs=1, norm_obs=False, fast_path=False)
    sampler = SquashableSampler(args.env_id, 1, 0, args)
    learner = ppo_continuous.make_learner(args, perturbed_agent(3, 1), torch.device("cpu"))
    learner.agent.__class__ = SquashableAgent
    learner.agent.squash = True
    sampler.set_policy(ppo_continuous.policy_weights(learner))
    assert sampler.agent.squash is True
    rollout = sampler.rollout(64)
    with torch.no_grad():
        obs, actions = torch.from_numpy(rollout["obs"][:, 0]), torch.from_numpy(rollout["actions"][:, 0])
        expected = learner.agent.evaluate(obs, actions)[0].numpy()
    np.testing.assert_allclose(rollout["logprobs"][:, 0], expected, rtol=1e-5, atol=1e-5)
    sampler.close()


def test_anneal_keeps_each_parameter_groups_own_rate():
    agent = perturbed_agent(5, 2)
    args = ppo_continuous.Args(learning_rate=1e-3, num_iterations=4)
    optimizer = torch.optim.Adam(
        [{"params": agent.critic.parameters(), "lr": 3e-3}, {"params": agent.actor_mean.parameters()}], lr=1e-3
    )
    for iteration, frac in ((1, 1.0), (2, 0.75), (4, 0.25)):
        ppo_continuous.anneal(optimizer, args, iteration)
        assert [group["lr"] for group in optimizer.param_groups] == pytest.approx([3e-3 * frac, 1e-3 * frac])


def test_a_compiled_agents_model_saves_loads_and_acts(tmp_path):
    """An Agent wrapped in torch.compile (an edit of make_learner): its saved model has the Agent's own parameter
    names, loads into a fresh Agent and acts as the wrapped one does."""
    agent = perturbed_agent(3, 1)
    compiled = torch.compile(agent)
    compiled.obs_layout = None
    compiled.action_bounds = [np.full(1, -2.0), np.full(1, 2.0)]
    args = ppo_continuous.Args(env_id="Pendulum-v1", norm_obs=False)
    path = tmp_path / "compiled.model"
    checkpoints.save_atomic(checkpoints.policy_state(compiled, gae.RunningMeanStd(shape=(3,)), args, 0), str(path))
    assert not any(key.startswith("_orig_mod") for key in torch.load(path, weights_only=True)["agent"])
    old_style = torch.load(path, weights_only=True)  # as an earlier version saved it: the wrapper's names
    old_style["agent"] = {f"_orig_mod.{k}": v for k, v in old_style["agent"].items()}
    torch.save(old_style, tmp_path / "old.model")
    obs = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    with torch.no_grad():
        expected = np.clip(agent.actor_mean(torch.from_numpy(obs)).numpy(), -2, 2)
    for saved in (path, tmp_path / "old.model"):
        policy = ppo_continuous.load_policy(str(saved))
        np.testing.assert_allclose(policy.predict(obs), expected, rtol=1e-6)


def test_a_distribution_without_entropy_or_mode_is_one_line_saying_what_to_do():
    agent = perturbed_agent(5, 2)
    agent.get_distribution = lambda x: tanh_gaussian(agent, x)
    obs, actions = torch.zeros(3, 5), torch.zeros(3, 2)
    with pytest.raises(NotImplementedError) as caught:
        agent.evaluate(obs, actions)
    gap = run_management.distribution_gap(caught.value)
    assert isinstance(gap, checkpoints.DistributionGap)
    assert "has no entropy" in str(gap) and "Agent.evaluate return an estimate" in str(gap), gap
    assert run_management.distribution_gap(NotImplementedError("elsewhere")) is None

    class NoMode(torch.distributions.Distribution):
        arg_constraints: dict = {}

    with pytest.raises(checkpoints.DistributionGap, match="has no mode"):
        checkpoints.distribution_mode(NoMode(validate_args=False))


def test_a_saved_policy_acts_in_eval_mode_with_the_saved_network():
    """predict runs the network itself in eval() mode: a Dropout layer gives the same action twice, and an input
    clamp binds on inputs far from anything the start-up check saw."""
    agent = ClampedAgent(3, 2)
    agent.actor_mean.insert(2, torch.nn.Dropout(0.5))
    agent.action_bounds = [np.full(2, -100.0), np.full(2, 100.0)]
    obs_rms = gae.RunningMeanStd(shape=(3,))
    saved_args = dict(env_id="Pendulum-v1", obs_clip=1e9, norm_obs=False)
    policy = checkpoints.Policy(agent, obs_rms, saved_args, ppo_continuous)
    obs = np.random.default_rng(0).normal(size=(32, 3)) * 20
    first, second = policy.predict(obs), policy.predict(obs)
    np.testing.assert_array_equal(first, second)
    with torch.no_grad():
        agent.eval()
        expected = agent.actor_mean(torch.tensor(obs, dtype=torch.float32).clamp(-5, 5)).numpy()
    np.testing.assert_allclose(first, expected, rtol=1e-6)
    assert policy.agent is not agent


# ---------------------------------------------------------------------------------------------------------------------
# What autograd leaves alone stays alone, on both paths
# ---------------------------------------------------------------------------------------------------------------------
class DetachingAgent(ppo_continuous.Agent):
    """An Agent whose log-std can be detached (a flag set during the run) and whose critic's first layer can run under
    torch.no_grad()."""

    detach_logstd = False
    critic_features_fixed = False

    def get_value(self, x):
        if self.critic_features_fixed:
            with torch.no_grad():
                x = self.critic[1](self.critic[0](x))
            return self.critic[2:](x).squeeze(-1)
        return super().get_value(x)

    def get_distribution(self, x):
        if not self.detach_logstd:
            return super().get_distribution(x)
        mean = self.actor_mean(x)
        std = self.actor_logstd.detach().expand_as(mean).exp()
        return Independent(Normal(mean, std, validate_args=False), 1, validate_args=False)


def update_once(learner, args, iteration: int, seed: int = 0) -> None:
    torch.manual_seed(seed)
    _, problem = ppo_continuous.ppo_update(learner, random_batch(256, 5, 2, seed), args, SETTINGS, iteration)
    assert problem is None, problem


def snapshot(agent) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in agent.named_parameters()}


@pytest.mark.slow
@pytest.mark.parametrize("compiled", [True, False])
def test_a_frozen_layer_keeps_its_values_and_one_frozen_mid_run_stops_from_that_update(compiled):
    agent = perturbed_agent(5, 2)
    agent.critic[0].requires_grad_(False)  # fixed random features
    learner, args = learner_with(agent, compile=compiled)
    assert (learner.fast.compiled is not None) == compiled
    start = snapshot(agent)
    update_once(learner, args, 1)
    after = snapshot(agent)
    for name in ("critic.0.weight", "critic.0.bias"):
        assert torch.equal(after[name], start[name]), name
    assert not torch.equal(after["critic.2.weight"], start["critic.2.weight"])
    agent.actor_mean[2].requires_grad_(False)  # frozen at iteration 2: no step from that update on, Adam's moments too
    update_once(learner, args, 2, seed=1)
    frozen = snapshot(agent)
    assert torch.equal(frozen["actor_mean.2.weight"], after["actor_mean.2.weight"])
    assert not torch.equal(frozen["actor_mean.0.weight"], after["actor_mean.0.weight"])
    agent.actor_mean[2].requires_grad_(True)  # and unfrozen: it trains again
    update_once(learner, args, 3, seed=2)
    assert not torch.equal(snapshot(agent)["actor_mean.2.weight"], frozen["actor_mean.2.weight"])
    assert learner.fast.switches == [], learner.fast.used


@pytest.mark.slow
@pytest.mark.parametrize("compiled", [True, False])
def test_a_detached_part_gets_no_adam_or_weight_decay_step(compiled):
    """The log-std detached by a flag from the second update, and a critic layer under no_grad: loss.backward() would
    leave their .grad None, so AdamW steps neither (not even its weight decay)."""
    agent = DetachingAgent(5, 2)
    agent.critic_features_fixed = True
    args = ppo_continuous.Args(num_envs=1, num_steps=256, num_minibatches=4, update_epochs=2, compile=compiled)
    ppo_continuous.validate_args(args)
    learner = ppo_continuous.make_learner(args, agent, torch.device("cpu"))
    learner.optimizer = torch.optim.AdamW(agent.parameters(), lr=1e-3, weight_decay=0.5)
    ppo_continuous.start_fast_paths(learner, args)
    assert (learner.fast.compiled is not None) == compiled
    start = snapshot(agent)
    update_once(learner, args, 1)
    after = snapshot(agent)
    assert torch.equal(after["critic.0.weight"], start["critic.0.weight"])
    assert not torch.equal(after["actor_logstd"], start["actor_logstd"])  # it trains until the flag is set
    agent.detach_logstd = True
    update_once(learner, args, 2, seed=1)
    assert torch.equal(snapshot(agent)["actor_logstd"], after["actor_logstd"])
    assert torch.equal(snapshot(agent)["critic.0.weight"], start["critic.0.weight"])


@pytest.mark.slow
def test_a_tensor_the_optimizer_holds_outside_the_agents_parameters_trains_on_both_paths():
    """A plain tensor leaf on the Agent (not a registered Parameter) that scales the critic's output, handed to the
    optimizer: it is trained, and the same way compiled and eagerly."""
    trained = []
    for compiled in (True, False):
        agent = perturbed_agent(5, 2)
        agent.__class__ = ScaledCriticAgent
        agent.value_scale = torch.ones((), requires_grad=True)
        learner, args = learner_with(agent, compile=compiled)
        learner.optimizer.add_param_group({"params": [agent.value_scale]})
        update_once(learner, args, 1)
        assert agent.value_scale.item() != 1.0
        trained.append(agent.value_scale.item())
    assert trained[0] == pytest.approx(trained[1], rel=1e-4)


class ScaledCriticAgent(ppo_continuous.Agent):
    def get_value(self, x):
        return super().get_value(x) * self.value_scale


# ---------------------------------------------------------------------------------------------------------------------
# The compile rule: the flags decide, never the cache
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("flags", "compiles"),
    [
        ({"total_timesteps": 10**6}, True),  # CleanRL's HalfCheetah command: 488 iterations x 10 x 32
        ({"total_timesteps": 2048 * 2}, False),  # a quick try: 2 iterations
        ({"num_steps": 8, "update_epochs": 1, "num_minibatches": 1, "at_the_rule": 0}, True),
        ({"num_steps": 8, "update_epochs": 1, "num_minibatches": 1, "at_the_rule": -1}, False),
    ],
)
def test_the_compile_rule_counts_gradient_steps_from_the_flags_alone(flags, compiles):
    """A run compiles by default when iterations x epochs x minibatches reach COMPILE_PAYS_AFTER_STEPS, and says why
    not otherwise; --compile and --no-compile (parsed as the command line gives them) force either way."""
    from command_line import optional_switches

    flags = dict(flags)
    if "at_the_rule" in flags:  # one iteration of one gradient step more or less than the rule's count
        flags["total_timesteps"] = 8 * (fast_paths.COMPILE_PAYS_AFTER_STEPS + flags.pop("at_the_rule"))
    args = ppo_continuous.Args(env_id="Pendulum-v1", **flags)
    ppo_continuous.validate_args(args)
    steps = args.num_iterations * args.update_epochs * args.num_minibatches
    assert (steps >= fast_paths.COMPILE_PAYS_AFTER_STEPS) == compiles
    reason = fast_paths.compile_pays(args)
    assert (reason is None) == compiles
    if reason:
        assert reason.startswith(f"{steps:,} gradient steps, under the ") and "--compile forces it" in reason
    argv = ["--compile", "--env-id", "Pendulum-v1", "--no-compile", "--compile", "True", "--quiet", "--compile"]
    written = ["--compile", "True", "--env-id", "Pendulum-v1", "--compile", "False", "--compile", "True", "--quiet"]
    assert optional_switches(argv, ppo_continuous.Args) == [*written, "--compile", "True"]
    assert optional_switches(["--no-fast-path", "--no-norm-obs"], ppo_continuous.Args) == [
        "--no-fast-path",
        "--no-norm-obs",
    ]


@pytest.mark.slow
def test_the_same_command_trains_the_same_run_with_an_empty_or_a_warm_compile_cache(tmp_path):
    """One command, run first with an empty TORCHINDUCTOR_CACHE_DIR and then with the cache it left, trains the same
    run, every TensorBoard scalar equal (charts/SPS aside): with the rule (this short run trains eagerly both times)
    and with --compile (the graph built, then loaded)."""
    from tests.conftest import SMALL, run_ppo, tensorboard_events

    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor_cache")}
    runs = {}
    for flags in ([], ["--compile"]):
        for cache in ("cold", "warm"):
            name = f"{'compiled' if flags else 'rule'}_{cache}"
            args = ["--env-id", "Pendulum-v1", *SMALL, "--total-timesteps", "1024", *flags, "--run-name", name]
            result = run_ppo(args, tmp_path, env=env)
            assert result.returncode == 0, result.stderr[-2000:]
            events = tensorboard_events(tmp_path / "runs" / name)
            tags = [tag for tag in events.Tags()["scalars"] if tag != "charts/SPS"]
            runs[name] = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in tags}
            summary = (tmp_path / "runs" / name / "summary.json").read_text()
            assert ('"gradient": "torch.compile' in summary) == bool(flags), summary
    assert runs["rule_cold"] == runs["rule_warm"]
    assert runs["compiled_cold"] == runs["compiled_warm"]
