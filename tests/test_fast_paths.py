"""fast_paths.py's audit on the run's own data and its loss gradient: each check against an independent reference
(autograd through the Agent and gae.ppo_loss, or a hand-made case), each way a fast path steps aside with its
reason, and what the run does then (the update's audited minibatch, the samplers' acting audits, a rollout sampled
again with torch)."""

from __future__ import annotations

import copy
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

SETTINGS = dict(clip_coef=0.2, clip_vloss=True, ent_coef=0.0, vf_coef=0.5, norm_adv=True)
PLAIN = (ppo_continuous.PlainUpdate, ppo_continuous.clip_gradients)


def choose(capsys, agent, optimizer, loss_settings) -> tuple[fast_paths.FastPaths, list[str]]:
    """choose_fast_paths with the fast paths enabled, and the lines it printed (on stderr, each after the script's
    name)."""
    capsys.readouterr()
    fast = fast_paths.choose_fast_paths(agent, optimizer, loss_settings, True, PLAIN)
    return fast, printed(capsys)


def printed(capsys) -> list[str]:
    """The fast paths' lines printed since the last read, without the script's name before each."""
    prefix = f"{run_management.PROG}: "
    lines = capsys.readouterr().err.splitlines()
    assert all(line.startswith(prefix) for line in lines), lines
    return [line[len(prefix) :] for line in lines]


def update_args(batch_rows: int, **kw) -> ppo_continuous.Args:
    """Args for ppo_update on a batch of `batch_rows` samples: minibatch_size as validate_args computes it (the
    update's audited minibatch has that many rows, plus the batch's extreme observations)."""
    args = ppo_continuous.Args(**kw)
    args.minibatch_size = batch_rows // args.num_minibatches
    return args


STOCK_LOSS = gae.ppo_loss


def edit_loss(monkeypatch, loss) -> None:
    """A research edit of gae.ppo_loss, as both paths see it: gae's own (which the plain path calls) and any module
    that imported the name."""
    for module in (gae, fast_paths, ppo_continuous):
        if hasattr(module, "ppo_loss"):
            monkeypatch.setattr(module, "ppo_loss", loss)


def random_batch(n: int, obs_dim: int, act_dim: int, obs_scale: float = 1.0) -> dict:
    g = torch.Generator().manual_seed(3)
    batch = dict(obs=obs_scale * torch.randn(n, obs_dim, generator=g), actions=torch.randn(n, act_dim, generator=g))
    batch |= {k: torch.randn(n, generator=g) for k in ("advantages", "values", "returns")}
    return batch | dict(logprobs=torch.randn(n, generator=g) - 3, size=n, non_finite=0, outliers=0)


def loss_inputs(seed: int, n: int = 64, dtype=torch.float64) -> dict:
    """Per-sample inputs where the policy clip and the value clip are each active for some samples, not others."""
    rng = np.random.default_rng(seed)

    def t(scale=1.0):
        return torch.tensor(rng.normal(scale=scale, size=n), dtype=dtype)

    old_logprob, old_values = t(), t()
    minibatch = dict(logprobs=old_logprob, advantages=t(), values=old_values, returns=t())
    per_sample = (old_logprob + t(0.5), old_values + t(0.5), t().abs())
    return minibatch, per_sample


@pytest.mark.parametrize("clip_vloss", [False, True])
@pytest.mark.parametrize("norm_adv", [False, True])
@pytest.mark.parametrize("behaviour", [False, True])
@pytest.mark.parametrize("ent_coef", [0.0, 0.01])
def test_the_written_out_loss_gradient_equals_autograd_over_gae_ppo_loss(clip_vloss, norm_adv, behaviour, ent_coef):
    """written_loss_gradients against torch.autograd.grad of gae.ppo_loss itself, in float64, on data that takes both
    sides of both clips (and of decoupled PPO's weight cap)."""
    minibatch, (new_logprob, new_values, entropy) = loss_inputs(5)
    ratio_step = (new_logprob - minibatch["logprobs"]).exp() - 1
    for step in (ratio_step, new_values - minibatch["values"]):
        assert (step.abs() > 0.2).any() and (step.abs() < 0.2).any()
    if behaviour:
        minibatch["behaviour_logprobs"] = minibatch["logprobs"] + torch.tensor(np.linspace(-6, 1, 64))
    kw = SETTINGS | dict(clip_vloss=clip_vloss, norm_adv=norm_adv, ent_coef=ent_coef, vf_coef=0.7)
    leaves = [x.clone().requires_grad_() for x in (new_logprob, new_values, entropy)]
    reference = gae.ppo_loss(
        leaves[0],
        minibatch["logprobs"],
        minibatch["advantages"],
        leaves[1],
        minibatch["values"],
        minibatch["returns"],
        leaves[2],
        behaviour_logprob=minibatch.get("behaviour_logprobs"),
        **kw,
    )
    expected = torch.autograd.grad(reference.loss, leaves, allow_unused=True)
    stats = fast_paths.ppo_loss_of(new_logprob, new_values, entropy, minibatch, kw)
    written = fast_paths.written_loss_gradients(stats, minibatch, new_values, kw)
    derived = fast_paths.derived_loss_gradients(new_logprob, new_values, entropy, minibatch, kw)[1]
    for got in (written, derived):
        for g, e in zip(got, expected):
            if e is None:
                assert g is None or not g.any()
            else:
                np.testing.assert_allclose(g.numpy(), e.numpy(), atol=1e-12)
    assert (written[0] == 0).any() and (written[0] != 0).any()  # the policy clip cuts some samples' gradient


def test_the_written_out_value_gradient_follows_autograd_where_rounding_splits_the_tie():
    """Inside the value clip old + (new - old) is new up to rounding, which in float32 near 0 often makes the clipped
    square the larger: autograd then differentiates that branch, and so must the written-out gradient."""
    g = torch.Generator().manual_seed(0)
    old, new, returns = (0.1 * torch.randn(4096, generator=g) for _ in range(3))
    step = new - old
    rounded_up = ((old + step.clamp(-0.2, 0.2) - returns) ** 2 > (new - returns) ** 2) & (step.abs() < 0.2)
    assert rounded_up.sum() > 100
    zeros = torch.zeros(4096)
    minibatch = dict(logprobs=zeros, advantages=zeros, values=old, returns=returns)
    kw = SETTINGS | dict(norm_adv=False)
    stats = fast_paths.ppo_loss_of(zeros, new, zeros, minibatch, kw)
    written = fast_paths.written_loss_gradients(stats, minibatch, new, kw)[1]
    derived = fast_paths.derived_loss_gradients(zeros, new, zeros, minibatch, kw)[1][1]
    torch.testing.assert_close(written, derived, rtol=1e-4, atol=1e-9)


def dual_clip_loss(new_logprob, old_logprob, advantages, new_values, old_values, returns, entropy, **kw):
    """Dual-clip PPO (Ye et al. 2020) with a Huber value loss, as a researcher writes it into gae.ppo_loss."""
    clip_coef, vf_coef, ent_coef = kw["clip_coef"], kw["vf_coef"], kw["ent_coef"]
    if kw.get("norm_adv", True) and advantages.numel() > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    logratio = new_logprob - old_logprob
    ratio = logratio.exp()
    surrogate = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef))
    surrogate = torch.where(advantages < 0, torch.min(surrogate, -3.0 * advantages), surrogate)
    policy_loss = surrogate.mean()
    value_loss = torch.nn.functional.huber_loss(new_values, returns)
    entropy_mean = entropy.mean()
    loss = policy_loss + vf_coef * value_loss - ent_coef * entropy_mean
    return gae.PPOLoss(loss, policy_loss, value_loss, entropy_mean, logratio, ratio, clip_coef)


@pytest.mark.parametrize("ent_coef", [0.0, 0.02])
def test_an_edited_loss_keeps_the_stacked_update_and_trains_exactly_as_autograd(capsys, monkeypatch, ent_coef):
    """A loss edited in gae.ppo_loss is a function of its per-sample inputs: the stacked update derives its gradient
    by autograd (one line says so) and trains the same parameters as the plain path over a whole update."""
    edit_loss(monkeypatch, dual_clip_loss)
    args = update_args(256, update_epochs=3, num_minibatches=4, learning_rate=1e-3, ent_coef=ent_coef)
    agent = perturbed_agent(11, 3)
    reference = copy.deepcopy(agent)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    loss_kwargs = ppo_continuous.loss_settings(args, ent_coef)
    fast, lines = choose(capsys, agent, optimizer, [loss_kwargs])
    assert fast.update is not None and fast.update.derive_loss_gradient
    assert len(lines) == 1 and "is not the stock loss" in lines[0] and " off: " not in lines[0], lines
    assert fast.used["loss gradient"].startswith("derived by autograd")
    batch = random_batch(256, 11, 3)
    torch.manual_seed(7)
    stats, problem = ppo_continuous.ppo_update(
        ppo_continuous.Learner(agent, optimizer, None, None, fast), batch, args, loss_kwargs, 1
    )
    torch.manual_seed(7)
    plain_optimizer = torch.optim.Adam(reference.parameters(), lr=args.learning_rate, eps=1e-5)
    plain_learner = ppo_continuous.Learner(reference, plain_optimizer, None, None)
    plain_stats, plain_problem = ppo_continuous.ppo_update(plain_learner, batch, args, loss_kwargs, 1)
    assert problem is None and plain_problem is None and fast.switches == []
    for key, value in plain_stats.items():
        assert value == pytest.approx(stats[key], rel=1e-3, abs=1e-5), key
    for fast_param, plain_param in zip(agent.parameters(), reference.parameters()):
        torch.testing.assert_close(fast_param, plain_param, rtol=1e-4, atol=1e-5)


def test_a_loss_edit_that_binds_only_on_the_runs_data_moves_the_loss_gradient_to_autograd(capsys, monkeypatch):
    """An edit the start-up minibatch (64 rows) cannot see: the update's audited minibatch (a minibatch's worth of the
    batch, 256 rows) compares the written-out loss gradient with the derived one, finds it wrong, and the stacked
    update goes on with the derived gradient before any step, training what the plain path trains."""

    def edited(new_logprob, *rest, **kw):
        stats = STOCK_LOSS(new_logprob, *rest, **kw)
        if new_logprob.numel() > 100:  # only minibatches larger than the start-up check's
            return stats._replace(loss=stats.loss + 0.5 * (new_logprob - rest[0]).pow(2).mean())
        return stats

    edit_loss(monkeypatch, edited)
    args = update_args(512, update_epochs=2, num_minibatches=2, learning_rate=1e-3, ent_coef=0.0)
    agent = perturbed_agent(11, 3)
    reference = copy.deepcopy(agent)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    loss_kwargs = ppo_continuous.loss_settings(args, 0.0)
    fast, lines = choose(capsys, agent, optimizer, [loss_kwargs])
    assert lines == [] and not fast.update.derive_loss_gradient
    batch = random_batch(512, 11, 3)
    batch["logprobs"] = agent.evaluate(batch["obs"], batch["actions"])[0].detach() - 0.3  # a gradient to the edit
    torch.manual_seed(7)
    ppo_continuous.ppo_update(ppo_continuous.Learner(agent, optimizer, None, None, fast), batch, args, loss_kwargs, 4)
    assert fast.update is not None and fast.update.derive_loss_gradient
    assert [s["part"] for s in fast.switches] == ["loss gradient"] and fast.switches[0]["iteration"] == 4
    assert "log-probabilities" in fast.switches[0]["reason"]
    lines = printed(capsys)
    assert len(lines) == 1 and "at iteration 4 the written-out loss gradient" in lines[0], lines
    torch.manual_seed(7)
    plain_optimizer = torch.optim.Adam(reference.parameters(), lr=args.learning_rate, eps=1e-5)
    plain_learner = ppo_continuous.Learner(reference, plain_optimizer, None, None)
    ppo_continuous.ppo_update(plain_learner, batch, args, loss_kwargs, 4)
    for fast_param, plain_param in zip(agent.parameters(), reference.parameters()):
        torch.testing.assert_close(fast_param, plain_param, rtol=1e-4, atol=1e-5)


def test_a_gradient_hook_added_during_the_run_moves_the_update_to_autograd_before_a_wrong_step(capsys):
    """A hook the start-up check never saw (registered after it): the audit's plain side runs autograd through the
    live Agent, hooks included, so the audited minibatch differs; the update steps aside before stepping, with Adam's
    moments handed to torch.optim.Adam, and the whole update equals the plain path's."""
    args = update_args(256, update_epochs=2, num_minibatches=4, learning_rate=1e-3, ent_coef=0.0)
    agent = perturbed_agent(11, 3)
    reference = copy.deepcopy(agent)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    plain_optimizer = torch.optim.Adam(reference.parameters(), lr=args.learning_rate, eps=1e-5)
    loss_kwargs = ppo_continuous.loss_settings(args, 0.0)
    fast, _ = choose(capsys, agent, optimizer, [loss_kwargs])
    learner = ppo_continuous.Learner(agent, optimizer, None, None, fast)
    plain_learner = ppo_continuous.Learner(reference, plain_optimizer, None, None)
    batch = random_batch(256, 11, 3)
    for learner_ in (learner, plain_learner):
        torch.manual_seed(7)
        ppo_continuous.ppo_update(learner_, batch, args, loss_kwargs, 1)  # one update on the fast path, audited, equal
    assert fast.update is not None and fast.differences["update"] < fast_paths.TOLERANCE
    for model in (agent, reference):
        for p in model.parameters():
            p.register_hook(lambda g: g * 0.5)
    for learner_ in (learner, plain_learner):
        torch.manual_seed(8)
        ppo_continuous.ppo_update(learner_, batch, args, loss_kwargs, 2)
    assert fast.update is None and [s["iteration"] for s in fast.switches] == [2]
    assert "gradient of" in fast.switches[0]["reason"] and fast.used["update"].startswith("autograd")
    lines = printed(capsys)
    assert len(lines) == 1 and lines[0].startswith("fast update off at iteration 2: its gradient of"), lines
    for fast_param, plain_param in zip(agent.parameters(), reference.parameters()):
        torch.testing.assert_close(fast_param, plain_param, rtol=1e-4, atol=1e-5)
    for state, plain_state in zip(
        optimizer.state_dict()["state"].values(), plain_optimizer.state_dict()["state"].values()
    ):
        assert int(state["step"]) == int(plain_state["step"])
        torch.testing.assert_close(state["exp_avg"], plain_state["exp_avg"], rtol=1e-3, atol=1e-8)


class ClampedAgent(ppo_continuous.Agent):
    """An input clamp that binds only beyond 5: never on the start-up check's N(0, 1) observations."""

    def get_distribution(self, x):
        return super().get_distribution(x.clamp(-5, 5))

    def get_value(self, x):
        return super().get_value(x.clamp(-5, 5))


def test_the_acting_audit_catches_an_input_clamp_that_binds_only_on_real_observations():
    torch.manual_seed(0)
    agent = ClampedAgent(3, 1)
    assert fast_paths.check_acting(agent, 3, 1) is None  # the start-up check cannot see it
    actor = fast_paths.NumpyActor(agent)
    rng = np.random.default_rng(0)
    for scale, binds in ((1.0, False), (8.0, True)):
        obs = (rng.normal(size=(256, 2, 3)) * np.array([1.0, 1.0, scale])).astype(np.float32)
        obs = np.minimum(obs, 4.9) if not binds else obs
        noise = rng.normal(size=(256, 2, 1))
        actions = actor.act(obs, noise).astype(np.float32)
        logprobs = actor.log_prob(obs, actions, noise).astype(np.float32)
        relative, problem = fast_paths.audit_acting(actor, agent, obs, actions, logprobs)
        if binds:
            assert relative > fast_paths.TOLERANCE and problem.startswith("its mean differs from Agent"), problem
        else:
            assert relative < 1e-5 and problem is None


def test_a_log_std_floor_reached_later_is_caught_by_the_acting_audit():
    """A floor on the log-std that the start-up check's weights never reach: once training drives the log-std past
    it, the numpy actor's std (and so its log-probabilities) differ from the Agent's."""

    class FlooredAgent(ppo_continuous.Agent):
        def get_distribution(self, x):
            mean = self.actor_mean(x)
            std = self.actor_logstd.clamp(min=-1.0).expand_as(mean).exp()
            return Independent(Normal(mean, std), 1)

    torch.manual_seed(0)
    agent = FlooredAgent(3, 2)
    assert fast_paths.check_acting(agent, 3, 2) is None
    obs = np.random.default_rng(1).normal(size=(64, 1, 3)).astype(np.float32)
    noise = np.random.default_rng(2).normal(size=(64, 1, 2))
    for logstd, caught in ((-0.5, False), (-1.6, True)):
        with torch.no_grad():
            agent.actor_logstd.fill_(logstd)
        actor = fast_paths.NumpyActor(agent)
        actions = actor.act(obs, noise).astype(np.float32)
        _, problem = fast_paths.audit_acting(actor, agent, obs, actions, actor.log_prob(obs, actions, noise))
        assert (problem is not None) == caught, problem
    assert "std" in problem or "log-probability" in problem


@pytest.mark.parametrize(
    "state, parts, words",
    [
        ("dropout", {"acting", "update"}, "a random layer (Dropout) in critic.2"),
        ("gradient hook", {"update"}, "a gradient hook on actor_logstd and 12 more"),
        ("forward hook", {"acting", "update"}, "a forward hook on actor_mean.0"),
        ("optimizer hook", {"update"}, "an optimizer step hook"),
        ("buffer", {"update"}, "a buffer on scale"),
    ],
)
def test_state_a_fast_path_cannot_carry_means_the_plain_path_with_a_reason_in_words(capsys, state, parts, words):
    agent = perturbed_agent(5, 2)
    if state == "dropout":
        agent.critic.insert(2, torch.nn.Dropout(0.1))
        agent.actor_mean.insert(2, torch.nn.Dropout(0.1))
    if state == "gradient hook":
        for p in agent.parameters():
            p.register_hook(lambda g: g * 0.5)
    if state == "forward hook":
        agent.actor_mean[0].register_forward_hook(lambda module, inputs, output: output * 2)
    if state == "buffer":
        agent.register_buffer("scale", torch.ones(1))
    optimizer = torch.optim.Adam(agent.parameters(), eps=1e-5)
    if state == "optimizer hook":
        optimizer.register_step_post_hook(lambda opt, args, kwargs: None)
    found = fast_paths.uncarried_state(agent, optimizer)
    assert set(found) == parts and all(words in reason for reason in found.values()), found
    fast, lines = choose(capsys, agent, optimizer, [SETTINGS])
    assert fast.acting == ("acting" not in parts) and (fast.update is None) == ("update" in parts)
    assert len(lines) == len(parts) and all(words in line for line in lines), lines


def tanh_gaussian(agent: ppo_continuous.Agent, x: torch.Tensor):
    mean = agent.actor_mean(x)
    std = agent.actor_logstd.expand_as(mean).exp()
    return Independent(TransformedDistribution(Normal(mean, std), TanhTransform(cache_size=1)), 1)


def test_a_tanh_squashed_gaussian_steps_aside_naming_its_distribution_and_acts_with_tanh_of_the_mean(capsys):
    """Both fast paths step aside, each in a line naming the distribution; the mean action (checkpoints.
    distribution_mode, what evaluation and a saved policy's predict take) is tanh of the Gaussian's mean."""
    agent = perturbed_agent(5, 2)
    agent.get_distribution = lambda x: tanh_gaussian(agent, x)
    optimizer = torch.optim.Adam(agent.parameters(), eps=1e-5)
    fast, lines = choose(capsys, agent, optimizer, [SETTINGS])
    assert not fast.acting and fast.update is None and len(lines) == 2
    named = "returns Independent(TransformedDistribution(Normal)), not the diagonal Gaussian"
    assert all(named in line for line in lines), lines
    obs = np.random.default_rng(0).normal(size=(7, 5)).astype(np.float32)
    with torch.no_grad():
        action = checkpoints.distribution_mode(agent.get_distribution(torch.from_numpy(obs))).numpy()
        expected = torch.tanh(agent.actor_mean(torch.from_numpy(obs))).numpy()
    np.testing.assert_allclose(action, expected, rtol=1e-6)


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


def test_the_updates_audit_takes_a_minibatch_and_each_observations_extremes_and_catches_a_clamp_there(capsys):
    """FastPaths.audited_update audits the first `rows` samples of the batch and those holding each observation
    column's minimum and maximum, where an input clamp would bind: a clamp that binds on one sample far down the batch
    is caught there, and the update steps aside (None: the plain path) before any step, in one line."""
    torch.manual_seed(0)
    agent = ClampedAgent(11, 3)
    optimizer = torch.optim.Adam(agent.parameters(), lr=1e-3, eps=1e-5)
    loss_kwargs = dict(SETTINGS)
    fast, lines = choose(capsys, agent, optimizer, [loss_kwargs])
    assert fast.update is not None and lines == []  # the start-up check's N(0, 1) inputs never reach the clamp
    update = fast.update
    plain = ppo_continuous.PlainUpdate(agent, optimizer)
    batch = random_batch(256, 11, 3)
    audited = []
    original_audit = update.audit

    def spy(minibatch, kwargs, plain_update):
        audited.append(minibatch["obs"].clone())
        return original_audit(minibatch, kwargs, plain_update)

    update.audit = spy
    before = [p.detach().clone() for p in agent.parameters()]
    assert fast.audited_update(batch, 64, loss_kwargs, plain, 2) is update  # the clamp binds nowhere: the fast path
    assert fast.differences["update"] < fast_paths.TOLERANCE and fast.switches == []
    expected_rows = set(range(64)) | set(batch["obs"].argmin(0).tolist()) | set(batch["obs"].argmax(0).tolist())
    assert len(expected_rows) > 64
    seen = {tuple(row.tolist()) for row in audited[0]}
    assert seen == {tuple(batch["obs"][i].tolist()) for i in expected_rows} and len(audited[0]) == len(expected_rows)

    far = dict(batch, obs=batch["obs"].clone())
    far["obs"][200, 4] = 40.0  # one sample past the first 64, beyond the clamp: only the column's maximum shows it
    assert fast.audited_update(far, 64, loss_kwargs, plain, 3) is None
    assert fast.update is None and [(s["part"], s["iteration"]) for s in fast.switches] == [("update", 3)]
    reason = fast.switches[0]["reason"]
    assert "differs from autograd through Agent and ppo_loss on this minibatch" in reason, reason
    assert fast.differences["update"] > fast_paths.TOLERANCE
    assert fast.used["update"].startswith("autograd (loss.backward()) and torch.optim.Adam from iteration 3")
    assert printed(capsys) == [f"fast update off at iteration 3: {reason}; training with autograd from now on"]
    for p, p_before in zip(agent.parameters(), before):  # audited, not stepped
        torch.testing.assert_close(p.detach(), p_before, rtol=0, atol=0)
    difference = fast.differences["update"]
    assert fast.audited_update(batch, 64, loss_kwargs, plain, 4) is None  # stays plain, not audited again
    assert len(fast.switches) == 1 and len(audited) == 2 and fast.differences["update"] == difference


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

    problem = "its mean differs from Agent on this rollout's observations by 0.3 of its scale"
    fast.read_acting_audits([acting_rollout(1e-6), acting_rollout(0.3, problem), acting_rollout(0.2, "x")], 5, counters)
    assert not fast.acting and counters["discarded_rollouts"] == 2
    assert fast.differences["acting"] == pytest.approx(0.3)
    assert fast.switches == [
        {"part": "acting", "iteration": 5, "reason": f"{problem}; its rollout was discarded and sampled again"}
    ]
    assert fast.used["acting"].startswith(f"torch (Agent.get_distribution) from iteration 5: {problem}")
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
    """Sampler.rollout: a numpy actor that acted otherwise than Agent has its rollout discarded and sampled again with
    TorchActor (which the sampler then keeps). The rollout returned is the second sample, anchored to Agent (its
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
