"""fast_paths.py: the stacked update against the plain one (a whole ppo_update, the written-out backward for every
activation and depth, Adam and its saved state, the start-up check and what it refuses), the audit on the run's own
data and the loss gradient: each check against an independent reference (autograd through the Agent and
gae.ppo_loss, or a hand-made case), each way a fast path steps aside with its reason, and what the run does then (the
update's audited minibatch, the samplers' acting audits, a rollout sampled again with torch)."""

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


def choose(capsys, agent, optimizer, loss_settings, plain=PLAIN) -> tuple[fast_paths.FastPaths, list[str]]:
    """choose_fast_paths with the fast paths enabled, checked against `plain` (the plain update and gradient clip),
    and the lines it printed (on stderr, each after the script's name)."""
    capsys.readouterr()
    fast = fast_paths.choose_fast_paths(agent, optimizer, loss_settings, True, plain)
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


def fast_update_for(agent: ppo_continuous.Agent, lr: float = 1e-3) -> tuple[torch.optim.Adam, fast_paths.FastPaths]:
    optimizer = torch.optim.Adam(agent.parameters(), lr=lr, eps=1e-5)
    return optimizer, fast_paths.FastPaths(True, fast_paths.StackedUpdate(agent, optimizer))


def test_stacked_update_computes_what_the_plain_update_computes():
    """StackedUpdate runs both nets with batched matmuls over one flat buffer and steps Adam by hand: the same
    parameters as the plain path (autograd and torch.optim.Adam) over a whole ppo_update, within float noise (several
    epochs, so Adam's moments, its bias correction and the gradient clip are exercised too)."""
    args = ppo_continuous.Args(update_epochs=3, num_minibatches=4, learning_rate=1e-3, max_grad_norm=0.5)
    agent = perturbed_agent(11, 3, False)
    reference = copy.deepcopy(agent)
    optimizer, fast = fast_update_for(agent, args.learning_rate)
    batch = random_batch(256, 11, 3)
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
    fast, lines = choose(capsys, agent, optimizer, settings)
    assert fast.update is None and fast.acting  # LayerNorm included: numpy runs that one layer in torch
    assert len(lines) == 1 and lines[0].startswith("fast update off:") and reason in lines[0]


def test_the_start_up_check_catches_a_fast_path_that_drifts_from_the_definition(monkeypatch, capsys):
    """The check compares numbers, not shapes: a wrong derivative in the written-out backward, or a gradient clip
    edited to treat tensors one by one, makes the update step aside; a numpy actor that no longer mirrors the Agent
    makes acting step aside; so does an Adam step without its bias correction."""
    agent = perturbed_agent(5, 2, False)
    optimizer = torch.optim.Adam(agent.parameters(), eps=1e-5)
    settings = [dict(clip_coef=0.2, clip_vloss=True, ent_coef=0.0, vf_coef=0.5, norm_adv=True)]
    fast, lines = choose(capsys, agent, optimizer, settings)
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
        checked = (ppo_continuous.PlainUpdate, per_tensor_clip) if drift == "clip" else PLAIN
        with monkeypatch.context() as m:
            if drift == "derivative":
                m.setitem(fast_paths.DERIVATIVES, torch.nn.ReLU, lambda module, u, h: torch.ones_like(u))
            if drift == "actor":
                m.setattr(fast_paths, "numpy_layer", lambda module: fast_paths.torch_layer(torch.nn.Tanh()))
            if drift == "adam":
                m.setattr(fast_paths.StackedUpdate, "step", step_without_bias_correction)
            fast, lines = choose(capsys, agent, optimizer, settings, checked)
        if drift == "actor":
            assert not fast.acting and len(lines) == 1 and lines[0].startswith("fast acting off: it differs")
        else:
            assert fast.update is None and len(lines) == 1 and "differs from autograd" in lines[0], lines
            assert ("Adam step" in lines[0]) == (drift == "adam"), lines


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
