"""Fast paths: accelerators of ppo_continuous.py's plain path, audited against it at start-up and on the run's own data.

ppo_continuous.py holds the one definition of everything that learns: the network and the policy's distribution
(`Agent`), the loss (`gae.ppo_loss`), the optimizer (`make_learner`) and the two things the hot loops call, acting
(`TorchActor`) and one minibatch's gradient step (`PlainUpdate`: autograd, then the optimizer). For 64-unit MLPs
PyTorch's per-op overhead, not arithmetic, sets the speed of both loops, so two accelerators may stand in for them,
each with the same methods as the plain one, chosen once when the weights arrive (acting) or the update starts:

- `NumpyActor` for `TorchActor`: the actor net walked layer by layer and mirrored in numpy (a layer it cannot mirror
  runs in torch), with the Gaussian's state-independent log-std.
- `StackedUpdate` for `PlainUpdate`: the actor's and the critic's layers stacked in pairs
  (one batched matmul runs a layer of both), all parameters and all gradients in one flat buffer each, gae.ppo_loss
  computed on the stacked forward's outputs and its gradient with respect to them (the new log-probabilities, values
  and entropies) taken by autograd over ppo_loss itself, or from `written_loss_gradients` while ppo_loss is the stock
  loss; from there the backward written out through the Gaussian head, the linear layers and the activations whose
  derivative it knows, and Adam's step as torch.optim.Adam computes it.

`choose_fast_paths` runs before the first rollout, on the run's own agent, optimizer and loss settings. Each
accelerator must first fit (a network it can mirror or stack, the optimizer it reproduces, nothing a copy cannot carry:
random layers, hooks, buffers), then match the plain path on random inputs: actions' means and stds, log-probabilities
and entropies for acting; values, the loss and the whole gradient on a synthetic minibatch that takes every branch of
the loss for the update. Then the audit runs on the run's own data for as long as a fast path is on: every rollout's
acting against the Agent on that rollout's observations (`audit_acting`), and a minibatch of every update's batch
against autograd through the live Agent and gae.ppo_loss before its first step (`FastPaths.audited_update`). One that
does not fit or does not match steps aside with one line naming the part and the reason, and the run uses the plain
path for that part from then on. So an edit to Agent, ppo_loss or make_learner runs as written: on a fast path that
equals it, or on the plain path.

The loop around these functions (shuffling, minibatches, gradient clipping, early stopping) is the same code on both
paths: the parameters and gradients that StackedUpdate keeps in its flat buffers are the Agent's own, as views.
"""

from __future__ import annotations

import copy
import itertools
import sys
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.distributions import Distribution, Independent, Normal

from gae import LOG_SQRT_2PI, PPOLoss, ppo_loss
from run_management import PROG, first_line

LOSS_GRADIENT_WRITTEN = "written out for the stock gae.ppo_loss (audited against autograd over it)"
LOSS_GRADIENT_DERIVED = "derived by autograd over gae.ppo_loss's per-sample inputs"

# The loss's fields that the checks compare, besides the gradient
LOSS_FIELDS = ("loss", "policy_loss", "value_loss", "entropy", "ratio")

# A fast path matches when each value it computes differs from the plain path's by at most this fraction of that
# value's largest magnitude (see compare). Both compute in float32, whose rounding (about 1e-7 relative) accumulates
# over a few layers and a minibatch's sums to around 1e-6; a real difference in the math (another activation, an extra
# loss term) is orders of magnitude larger.
TOLERANCE = 1e-4


def say(line: str) -> None:
    """A fast path's one line (why it stepped aside), on stderr."""
    print(f"{PROG}: {line}", file=sys.stderr)


class DoesNotFit(Exception):
    """The network or optimizer is not one this fast path can run; the message says why."""


# ---------------------------------------------------------------------------------------------------------------------
# Acting: the actor net in numpy
# ---------------------------------------------------------------------------------------------------------------------
def sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (np.tanh(0.5 * x) + 1.0)  # the same function, without exp's overflow for large |x|


def numpy_layer(module: nn.Module):
    """A numpy function computing `module`, for the layers of an MLP; a layer it cannot mirror runs in torch."""
    if isinstance(module, nn.Linear):
        weight = module.weight.detach().cpu().numpy().T.copy()
        bias = None if module.bias is None else module.bias.detach().cpu().numpy().copy()
        return (lambda x: x @ weight) if bias is None else (lambda x: x @ weight + bias)
    if type(module) is nn.Tanh:
        return np.tanh
    if type(module) is nn.ReLU:
        return lambda x: np.maximum(x, 0.0)
    if type(module) is nn.LeakyReLU:
        slope = module.negative_slope
        return lambda x: np.where(x > 0, x, slope * x)
    if type(module) is nn.ELU:
        alpha = module.alpha
        return lambda x: np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0.0)))
    if type(module) is nn.SiLU:
        return lambda x: x * sigmoid(x)
    if type(module) is nn.Sigmoid:
        return sigmoid
    if type(module) is nn.Identity:
        return lambda x: x
    return torch_layer(module)


def torch_layer(module: nn.Module):
    """`module` called from numpy: its own code, on the CPU."""
    module = copy.deepcopy(module).cpu()

    def run(x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return module(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))).numpy()

    return run


class NumpyActor:
    """TorchActor's fast path: the Agent's actor net (`agent.actor_mean`, an nn.Sequential) mirrored in numpy, and a
    Gaussian with the state-independent log-std `agent.actor_logstd`. Built from the sampler's copy of the Agent
    whenever new weights arrive."""

    def __init__(self, agent: nn.Module):
        if not isinstance(getattr(agent, "actor_mean", None), nn.Sequential):
            raise DoesNotFit("Agent.actor_mean is not an nn.Sequential to mirror")
        self.layers = [numpy_layer(module) for module in agent.actor_mean]
        logstd = getattr(agent, "actor_logstd", None)
        if not isinstance(logstd, torch.Tensor) or logstd.dim() != 2 or logstd.shape[0] != 1:
            raise DoesNotFit("Agent has no state-independent actor_logstd of shape (1, action_dim)")
        self.logstd = logstd.detach().cpu().double().numpy().reshape(-1)
        self.std = np.exp(self.logstd)
        self.logprob_offset = self.logstd.sum() + len(self.logstd) * LOG_SQRT_2PI

    def actor(self, obs: np.ndarray) -> np.ndarray:
        """The actor net's output: the Gaussian's mean."""
        for layer in self.layers:
            obs = layer(obs)
        return obs

    def act(self, obs: np.ndarray, noise: np.ndarray) -> np.ndarray:
        """Actions for a batch of observations, drawn with the rollout's standard normal `noise` (N, action_dim)."""
        return self.actor(obs) + self.std * noise

    def log_prob(self, obs: np.ndarray, actions: np.ndarray, noise: np.ndarray) -> np.ndarray:
        """Log-probabilities of the actions `act` drew (any leading shape). They follow from the noise alone, so a
        rollout computes them once, after its loop."""
        return -0.5 * (noise * noise).sum(axis=-1) - self.logprob_offset

    def entropy(self, obs: np.ndarray) -> np.ndarray:
        return np.full(obs.shape[:-1], (0.5 + LOG_SQRT_2PI + self.logstd).sum())


# ---------------------------------------------------------------------------------------------------------------------
# The update: both nets stacked, the backward written out, Adam by hand
# ---------------------------------------------------------------------------------------------------------------------
# Activations the written-out backward knows: d activation(u) / du from the pre-activation u and the output h.
DERIVATIVES = {
    nn.Tanh: lambda module, u, h: 1.0 - h * h,
    nn.ReLU: lambda module, u, h: (u > 0).to(u.dtype),
    nn.LeakyReLU: lambda module, u, h: torch.where(u > 0, 1.0, module.negative_slope).to(u.dtype),
    nn.ELU: lambda module, u, h: torch.where(u > 0, 1.0, h + module.alpha).to(u.dtype),
    nn.SiLU: lambda module, u, h: torch.sigmoid(u) * (1.0 + u * (1.0 - torch.sigmoid(u))),
    nn.Sigmoid: lambda module, u, h: h * (1.0 - h),
    nn.Identity: lambda module, u, h: torch.ones_like(u),
}


def stacked_layers(agent: nn.Module) -> tuple[list[int], list[nn.Module]]:
    """The positions of the Linear layers in agent.actor_mean and agent.critic, and the activation after each hidden
    one; DoesNotFit unless both nets are MLPs of the same shape and activations, and the Agent has no other
    parameter than theirs and actor_logstd."""
    actor, critic = getattr(agent, "actor_mean", None), getattr(agent, "critic", None)
    if not isinstance(actor, nn.Sequential) or not isinstance(critic, nn.Sequential):
        raise DoesNotFit("Agent.actor_mean and Agent.critic must be nn.Sequential MLPs")
    for name, net in (("actor_mean", actor), ("critic", critic)):
        for module in net:
            if not isinstance(module, nn.Linear) and type(module) not in DERIVATIVES:
                raise DoesNotFit(f"{type(module).__name__} in {name}: a layer it cannot stack")
    if len(actor) != len(critic) or len(actor) % 2 == 0:
        raise DoesNotFit("the actor and the critic are not MLPs of the same depth")
    linear = list(range(0, len(actor), 2))
    activations = []
    for i, (a, c) in enumerate(zip(actor, critic)):
        if i % 2 == 0:
            if not (
                isinstance(a, nn.Linear) and isinstance(c, nn.Linear) and a.bias is not None and c.bias is not None
            ):
                raise DoesNotFit(f"layer {i} is {type(a).__name__} / {type(c).__name__}, not Linear with a bias")
            if a.in_features != c.in_features or (i != len(actor) - 1 and a.out_features != c.out_features):
                raise DoesNotFit(f"layer {i} of the actor and of the critic have different widths")
        elif type(a) is not type(c) or type(a) not in DERIVATIVES or repr(a) != repr(c):
            raise DoesNotFit(f"{type(a).__name__} in actor_mean, whose derivative it does not know")
        else:
            activations.append(a)
    if critic[-1].out_features != 1 or critic[-1].out_features > actor[-1].out_features:
        raise DoesNotFit("the critic does not end in one output")
    if any(p.dtype != torch.float32 for p in agent.parameters()):
        raise DoesNotFit("the Agent's parameters are not float32")
    if any(True for _ in agent.buffers()):
        raise DoesNotFit("the Agent has buffers, which the stacked layers do not carry")
    expected = {f"{net}.{i}.{p}" for net in ("actor_mean", "critic") for i in linear for p in ("weight", "bias")}
    names = {name for name, _ in agent.named_parameters()}
    logstd = getattr(agent, "actor_logstd", None)
    if names != expected | {"actor_logstd"} or tuple(logstd.shape) != (1, actor[-1].out_features):
        others = sorted(names - expected - {"actor_logstd"}) or ["no actor_logstd of shape (1, action_dim)"]
        raise DoesNotFit(f"the Agent's parameters are not two MLPs and actor_logstd ({', '.join(others[:3])})")
    return linear, activations


def adam_settings(optimizer: torch.optim.Optimizer, agent: nn.Module) -> dict:
    """The optimizer's param group, when it is a torch.optim.Adam over all the Agent's parameters that StackedUpdate
    reproduces; DoesNotFit otherwise."""
    if type(optimizer) is not torch.optim.Adam:
        raise DoesNotFit(f"make_learner built {type(optimizer).__name__}, and it reproduces only torch.optim.Adam")
    if len(optimizer.param_groups) != 1:
        raise DoesNotFit("the optimizer has several parameter groups")
    group = optimizer.param_groups[0]
    if {id(p) for p in group["params"]} != {id(p) for p in agent.parameters()}:
        raise DoesNotFit("the optimizer does not hold exactly the Agent's parameters")
    for option in ("weight_decay", "amsgrad", "maximize", "decoupled_weight_decay", "capturable", "differentiable"):
        if group.get(option):
            raise DoesNotFit(f"Adam's {option} is set, which it does not reproduce")
    return group


def ppo_loss_of(new_logprob, new_values, entropy, minibatch: dict, loss_kwargs: dict) -> PPOLoss:
    """gae.ppo_loss of a minibatch, given the network's per-sample outputs."""
    return ppo_loss(
        new_logprob,
        minibatch["logprobs"],
        minibatch["advantages"],
        new_values,
        minibatch["values"],
        minibatch["returns"],
        entropy,
        behaviour_logprob=minibatch.get("behaviour_logprobs"),
        **loss_kwargs,
    )


def derived_loss_gradients(new_logprob, new_values, entropy, minibatch: dict, loss_kwargs: dict) -> tuple:
    """gae.ppo_loss and, by autograd, its gradient with respect to its per-sample inputs (each None where the loss
    does not depend on it): whatever ppo_loss computes from these, this is its gradient."""
    per_sample = [x.detach().clone().requires_grad_() for x in (new_logprob, new_values, entropy)]
    with torch.enable_grad():
        stats = ppo_loss_of(*per_sample, minibatch, loss_kwargs)
        grads = torch.autograd.grad(stats.loss, per_sample, allow_unused=True)
    return stats, grads


def written_loss_gradients(stats: PPOLoss, minibatch: dict, new_values: torch.Tensor, loss_kwargs: dict) -> tuple:
    """derived_loss_gradients' gradients, written out for gae.ppo_loss as it ships (CleanRL's loss, and decoupled
    PPO's weight): autograd over a minibatch's 64-element vectors costs more than the rest of its update
    (benchmarks/results/README.md), so the stock loss keeps this fast path of its own. It is used only while it
    equals the derived gradient, at start-up on a minibatch that takes every branch of the loss and on the first
    minibatch of every update; an edited ppo_loss makes it step aside for derived_loss_gradients."""
    n = len(new_values)
    advantages = minibatch["advantages"]
    if loss_kwargs.get("norm_adv", True) and n > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    clip_coef = loss_kwargs["clip_coef"]
    # d/d log pi of -A r is -A r. The max passes it on where the unclipped term is the larger (inside the clip range
    # the two are equal, and autograd's halves of a tie add up to the whole); the clamped term has none.
    unclipped = -advantages * stats.ratio
    clipped = -advantages * stats.ratio.clamp(1.0 - clip_coef, 1.0 + clip_coef)
    logprob_grad = unclipped * (unclipped >= clipped) * (1.0 / n)
    behaviour = minibatch.get("behaviour_logprobs")
    if behaviour is not None:
        max_is_weight = loss_kwargs.get("max_is_weight", 100.0)
        logprob_grad = logprob_grad * (minibatch["logprobs"] - behaviour).exp().clamp(max=max_is_weight)
    error = new_values - minibatch["returns"]
    if loss_kwargs["clip_vloss"]:  # the clipped term has a gradient only inside the clip, where it equals the other
        step = new_values - minibatch["values"]
        step_clipped = step.clamp(-clip_coef, clip_coef)
        squared, squared_clipped = error**2, (minibatch["values"] + step_clipped - minibatch["returns"]) ** 2
        value_grad = error * ((squared >= squared_clipped) | (step == step_clipped)) * (loss_kwargs["vf_coef"] / n)
    else:
        value_grad = error * (loss_kwargs["vf_coef"] / n)
    ent_coef = loss_kwargs["ent_coef"]
    entropy_grad = torch.full_like(new_values, -ent_coef / n) if ent_coef else None
    return logprob_grad, value_grad, entropy_grad


def loss_gradient_pairs(written: tuple, derived: tuple, like: torch.Tensor) -> dict[str, tuple]:
    """written_loss_gradients' and derived_loss_gradients' vectors side by side, by name, for worst_of (a gradient
    that is None, the loss not depending on that input, is zeros)."""
    zeros = torch.zeros_like(like)
    names = ("log-probabilities", "values", "entropies")
    return {
        f"gradient with respect to the {name}": (zeros if w is None else w, zeros if d is None else d)
        for name, w, d in zip(names, written, derived)
    }


class StackedUpdate:
    """PlainUpdate (loss_and_gradients, gradients, step) for the Agent's two MLPs and a torch.optim.Adam, in few ops.

    The Agent's parameters and their .grad become views into flat buffers laid out as the stacked layers, so the Agent
    stays the plain nn.Module that acts, is saved and loaded, and the loop's clip_gradients clips the flat gradient
    buffer. Adam's learning rate, betas and eps are read from the optimizer's param group at every step, so schedules
    reach it."""

    def __init__(self, agent: nn.Module, optimizer: torch.optim.Optimizer, derive_loss_gradient: bool = False):
        self.linear, self.activations = stacked_layers(agent)
        self.group = adam_settings(optimizer, agent)
        self.agent = agent
        self.optimizer = optimizer  # takes the Adam moments back if this update steps aside
        self.steps = 0
        # d loss / d (log-probability, value, entropy): autograd over gae.ppo_loss, or written_loss_gradients while
        # ppo_loss is the stock loss (see there)
        self.derive_loss_gradient = derive_loss_gradient
        self.last_per_sample: tuple = ()
        actor = agent.actor_mean
        self.shapes = [(2, actor[i].out_features, actor[i].in_features) for i in self.linear]
        self.shapes = [s for shape in self.shapes for s in (shape, (2, 1, shape[1]))] + [(1, actor[-1].out_features)]
        device, size = agent.actor_logstd.device, sum(int(np.prod(shape)) for shape in self.shapes)
        self.params, self.grads, self.exp_avg, self.exp_avg_sq = (torch.zeros(size, device=device) for _ in range(4))
        self.stacked, self.stacked_grads = self.unflatten(self.params), self.unflatten(self.grads)
        self.output_grads: dict[int, torch.Tensor] = {}
        views, self.grad_views = self.agent_views(self.params), self.agent_views(self.grads)
        with torch.no_grad():
            for name, param in agent.named_parameters():
                views[name].copy_(param)
                param.data = views[name]
                param.grad = self.grad_views[name]
        if optimizer.state:  # a resumed run: the optimizer holds the checkpoint's moments
            self.load_state_dict(optimizer.state_dict())

    def unflatten(self, flat: torch.Tensor) -> list[torch.Tensor]:
        sizes = [int(np.prod(shape)) for shape in self.shapes]
        return [part.view(shape) for part, shape in zip(flat.split(sizes), self.shapes)]

    def agent_views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views of `flat` (laid out like the parameters) shaped as the Agent's parameters, by name. Net 0 of each
        stacked pair is the actor, net 1 the critic, whose 1-unit output layer is padded to the actor's width."""
        *layers, logstd = self.unflatten(flat)
        views = {"actor_logstd": logstd}
        for k, i in enumerate(self.linear):
            weight, bias = layers[2 * k], layers[2 * k + 1]
            last = k == len(self.linear) - 1
            views[f"actor_mean.{i}.weight"], views[f"actor_mean.{i}.bias"] = weight[0], bias[0, 0]
            views[f"critic.{i}.weight"] = weight[1, :1] if last else weight[1]
            views[f"critic.{i}.bias"] = bias[1, 0, :1] if last else bias[1, 0]
        return views

    def forward(self, obs: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
        """Both nets at once: the inputs of each linear layer, the pre-activations of each hidden one, and the
        outputs (2, rows, out): the actor's mean, and the critic's value in column 0."""
        *layers, _ = self.stacked
        h = obs.expand(2, *obs.shape)
        inputs, pre_activations = [], []
        for k in range(len(self.linear) - 1):
            weight, bias = layers[2 * k], layers[2 * k + 1]
            inputs.append(h)
            u = torch.baddbmm(bias, h, weight.mT)
            h = self.activations[k](u)
            pre_activations.append(u)
        inputs.append(h)
        return inputs, pre_activations, torch.baddbmm(layers[-1], h, layers[-2].mT)

    def loss_and_gradients(self, minibatch: dict, **loss_kwargs) -> PPOLoss:
        """gae.ppo_loss of a minibatch, with its gradient left in the Agent's .grad (the flat gradient buffer)."""
        with torch.no_grad():
            return self.analytic_backward(minibatch, loss_kwargs)

    def gradients(self) -> list[torch.Tensor]:
        """What the loop's gradient clip scales: the one flat buffer that the Agent's .grad are views of."""
        return [self.grads]

    def audit(self, minibatch: dict, loss_kwargs: dict, plain_update) -> tuple:
        """One minibatch on both paths: this stacked update, and `plain_update` (ppo_continuous.py's PlainUpdate:
        autograd through the live Agent, its hooks included, and gae.ppo_loss). Returns (statistics, largest relative
        difference, reason, loss_reason).

        loss_reason: while the loss's gradient is written out, it is first compared with the derived one on this
        minibatch; where they differ (an edited ppo_loss), the gradient is derived from now on and loss_reason says
        why. reason None: the paths agree (or both are non-finite, for the guard) and the fast gradient is in the flat
        buffer. Otherwise the plain statistics are returned, with the plain gradient in the parameters' .grad."""
        fast_stats = self.loss_and_gradients(minibatch, **loss_kwargs)
        loss_reason = None
        if not self.derive_loss_gradient:
            new_logprob, new_values, _ = self.last_per_sample
            written = written_loss_gradients(fast_stats, minibatch, new_values, loss_kwargs)
            _, derived = derived_loss_gradients(*self.last_per_sample, minibatch, loss_kwargs)
            pairs = loss_gradient_pairs(written, derived, new_logprob)
            _, loss_reason = worst_of(pairs, "autograd over gae.ppo_loss")
            if loss_reason is not None:
                self.derive_loss_gradient = True
                fast_stats = self.loss_and_gradients(minibatch, **loss_kwargs)
        fast_grads = self.grads.clone()
        plain_stats = plain_update.loss_and_gradients(minibatch, **loss_kwargs)
        named = list(self.agent.named_parameters())
        plain_grads = {name: p.grad.clone() if p.grad is not None else torch.zeros_like(p) for name, p in named}
        fast_views = self.agent_views(fast_grads)
        against = "autograd through Agent and ppo_loss on this minibatch"
        # The losses are means of terms of order one (normalized advantages times ratios near 1), so their float
        # noise is of that order even where the mean is near zero: a least scale of 1 for them.
        losses = {f: (getattr(fast_stats, f).detach(), getattr(plain_stats, f).detach()) for f in LOSS_FIELDS[:-1]}
        compared = {"ratio": (fast_stats.ratio.detach(), plain_stats.ratio.detach())}
        compared |= {f"gradient of {name}": (fast_views[name], plain_grads[name]) for name, _ in named}
        relative, reason = max(worst_of(losses, against, floor=1.0), worst_of(compared, against), key=lambda r: r[0])
        everything = list(losses.values()) + list(compared.values())
        fast_finite = bool(torch.isfinite(torch.cat([fast.reshape(-1) for fast, _ in everything])).all())
        plain_finite = bool(torch.isfinite(torch.cat([plain.reshape(-1) for _, plain in everything])).all())
        if reason is None or not (fast_finite or plain_finite):
            self.grads.copy_(fast_grads)
            for name, param in named:
                param.grad = self.grad_views[name]
            return fast_stats, relative, None, loss_reason
        for name, param in named:
            param.grad = plain_grads[name]
        return plain_stats, relative, reason, loss_reason

    def analytic_backward(self, minibatch: dict, loss_kwargs: dict) -> PPOLoss:
        """The forward pass keeping each layer's input; gae.ppo_loss and its gradient with respect to its per-sample
        inputs (the new log-probabilities, values and entropies); then the network's chain rule written out from
        there down to every weight."""
        logstd = self.stacked[-1]
        inputs, pre_activations, out = self.forward(minibatch["obs"])
        inv_std, logstd_sum = torch.exp(-logstd), logstd.sum()
        z = (minibatch["actions"] - out[0]) * inv_std  # the action's standardized noise
        z_squared = z * z
        new_logprob = z_squared.sum(1).mul_(-0.5).sub_(logstd_sum + logstd.shape[1] * LOG_SQRT_2PI)
        entropy = (logstd_sum + logstd.shape[1] * (0.5 + LOG_SQRT_2PI)).expand(len(z))  # the same for every sample
        self.last_per_sample = (new_logprob, out[1, :, 0], entropy)
        if self.derive_loss_gradient:
            stats, (logprob_grad, value_grad, entropy_grad) = derived_loss_gradients(
                *self.last_per_sample, minibatch, loss_kwargs
            )
        else:
            stats = ppo_loss_of(*self.last_per_sample, minibatch, loss_kwargs)
            logprob_grad, value_grad, entropy_grad = written_loss_gradients(stats, minibatch, out[1, :, 0], loss_kwargs)
        *layer_grads, logstd_grad = self.stacked_grads
        d_out = self.output_grad_buffer(len(z))
        # d log pi / d mean = z / std and d log pi / d logstd = z^2 - 1, per sample; d entropy / d logstd = 1
        if logprob_grad is None:
            d_out[0].zero_()
            logstd_grad.zero_()
        else:
            torch.mul(z * inv_std, logprob_grad[:, None], out=d_out[0])
            torch.mm(logprob_grad[None], z_squared - 1.0, out=logstd_grad)
        if entropy_grad is not None:
            logstd_grad.add_(entropy_grad.sum())
        if value_grad is None:
            d_out[1, :, 0] = 0.0
        else:
            d_out[1, :, 0] = value_grad
        for k in reversed(range(len(self.linear))):
            weight, weight_grad, bias_grad = self.stacked[2 * k], layer_grads[2 * k], layer_grads[2 * k + 1]
            torch.bmm(d_out.mT, inputs[k], out=weight_grad)
            torch.sum(d_out, 1, keepdim=True, out=bias_grad)
            if k > 0:  # back through the layer, then through the activation below it
                d_out = torch.bmm(d_out, weight)
                activation = self.activations[k - 1]
                d_out = d_out * DERIVATIVES[type(activation)](activation, pre_activations[k - 1], inputs[k])
        return stats

    def output_grad_buffer(self, rows: int) -> torch.Tensor:
        """(2, rows, out_dim) for d loss / d outputs of both nets; the critic's padded columns stay 0. One buffer per
        minibatch size (an update has at most two)."""
        if rows not in self.output_grads:
            self.output_grads[rows] = torch.zeros(2, rows, self.shapes[-2][2], device=self.params.device)
        return self.output_grads[rows]

    def step(self) -> None:
        """One Adam step, as torch.optim.Adam computes it (Kingma & Ba 2015, with eps outside the square root)."""
        lr, (beta1, beta2), eps = float(self.group["lr"]), self.group["betas"], self.group["eps"]
        self.steps += 1
        self.exp_avg.lerp_(self.grads, 1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(self.grads, self.grads, value=1 - beta2)
        # torch's sqrt(v) / sqrt(1 - beta2^t) + eps, with sqrt(1 - beta2^t) moved into the step size: one op less
        root_correction = np.sqrt(1 - beta2**self.steps)
        denom = self.exp_avg_sq.sqrt().add_(eps * root_correction)
        self.params.addcdiv_(self.exp_avg, denom, value=-lr * root_correction / (1 - beta1**self.steps))

    def names_in_optimizer_order(self) -> list[str]:
        """The Agent's parameter names in the order of the optimizer's param group, which torch.optim's state_dict
        numbers them by."""
        names = {id(param): name for name, param in self.agent.named_parameters()}
        return [names[id(param)] for param in self.group["params"]]

    def state_dict(self) -> dict:
        """torch.optim.Adam's format, one entry per Agent parameter in the optimizer's order, so that a checkpoint
        resumes on either path."""
        order = self.names_in_optimizer_order()
        exp_avg, exp_avg_sq = self.agent_views(self.exp_avg), self.agent_views(self.exp_avg_sq)
        state = {}
        if self.steps:
            for i, name in enumerate(order):
                step = torch.tensor(float(self.steps))
                state[i] = dict(step=step, exp_avg=exp_avg[name].clone(), exp_avg_sq=exp_avg_sq[name].clone())
        group = {key: value for key, value in self.group.items() if key != "params"}
        return {"state": state, "param_groups": [group | {"params": list(range(len(order)))}]}

    def load_state_dict(self, saved: dict) -> None:
        order = self.names_in_optimizer_order()
        state = saved["state"]
        if state and len(state) != len(order):
            raise ValueError(f"the optimizer state holds {len(state)} parameters, this network {len(order)}")
        exp_avg, exp_avg_sq = self.agent_views(self.exp_avg), self.agent_views(self.exp_avg_sq)
        with torch.no_grad():
            for i, name in enumerate(order):
                exp_avg[name].copy_(state[i]["exp_avg"] if state else 0.0)
                exp_avg_sq[name].copy_(state[i]["exp_avg_sq"] if state else 0.0)
        self.steps = int(state[0]["step"]) if state else 0
        self.group["lr"] = float(saved["param_groups"][0]["lr"])


# ---------------------------------------------------------------------------------------------------------------------
# The start-up check
# ---------------------------------------------------------------------------------------------------------------------
@dataclass
class FastPaths:
    """Which part runs which way: `acting` True for NumpyActor, `update` the StackedUpdate or None for autograd with
    the optimizer. `used` says it in words, for summary.json and TensorBoard; `differences` holds the latest audit's
    largest relative difference of each part, and `switches` each part that stepped aside during the run."""

    acting: bool = False
    update: StackedUpdate | None = None
    used: dict[str, str] = field(default_factory=dict)
    differences: dict[str, float] = field(default_factory=dict)
    switches: list[dict] = field(default_factory=list)

    def table(self) -> str:
        """`used` as a markdown table, for TensorBoard's text tab."""
        return "|part|runs on|\n|-|-|\n" + "\n".join(f"|{part}|{way}|" for part, way in self.used.items())

    def step_aside(self, part: str, iteration: int, reason: str) -> None:
        """Move `part` ("acting", "update", or the update's "loss gradient") to the plain path for the rest of the run,
        as the audit found it to differ at `iteration`, and say so in one line. The update hands its Adam moments to
        the optimizer."""
        self.switches.append({"part": part, "iteration": iteration, "reason": reason})
        if part == "loss gradient":  # the stacked update stays on, with the gradient derived from ppo_loss
            self.update.derive_loss_gradient = True
            self.used[part] = f"{LOSS_GRADIENT_DERIVED} from iteration {iteration}: {reason}"
            then = "the loss's gradient is derived by autograd from now on"
            say(f"fast update: at iteration {iteration} the written-out loss gradient: {reason}; {then}")
            return
        if part == "acting":
            self.acting = False
            plain = "torch (Agent.get_distribution)"
        else:
            optimizer = self.update.optimizer
            optimizer.load_state_dict(self.update.state_dict())
            self.update = None
            self.used.pop("loss gradient", None)
            plain = f"autograd (loss.backward()) and torch.optim.{type(optimizer).__name__}"
        self.used[part] = f"{plain} from iteration {iteration}: {reason}"
        then = "acting with torch through Agent.get_distribution" if part == "acting" else "training with autograd"
        say(f"fast {part} off at iteration {iteration}: {reason}; {then} from now on")

    def audited_update(self, batch: dict, rows: int, loss_kwargs: dict, plain_update, iteration: int):
        """The update for this batch: the StackedUpdate, once it has matched `plain_update` (autograd through the live
        Agent and gae.ppo_loss) on a minibatch of the batch, before its first step; or None, for the plain path. The
        minibatch: the first `rows` samples and those with each observation's extremes, where a clamp would bind."""
        if self.update is None:
            return None
        obs = batch["obs"]
        audited = torch.unique(
            torch.cat([torch.arange(min(rows, len(obs)), device=obs.device), obs.argmin(0), obs.argmax(0)])
        )
        minibatch = {key: value[audited] for key, value in batch.items() if isinstance(value, torch.Tensor)}
        _, difference, reason, loss_reason = self.update.audit(minibatch, loss_kwargs, plain_update)
        self.differences["update"] = difference
        if loss_reason is not None:
            self.step_aside("loss gradient", iteration, loss_reason)
        if reason is not None:
            self.step_aside("update", iteration, reason)
        return self.update

    def read_acting_audits(self, rollouts: list[dict], iteration: int, counters: dict) -> None:
        """The samplers' audits of their numpy actors (audit_acting, on each rollout's own observations). A rollout
        whose actor acted otherwise than Agent was not trained on: the sampler sampled it again acting with torch
        (sampling again keeps PPO's ratio anchored to the policy that acted; rescoring the actions with Agent would
        not). Then acting moves to torch for the rest of the run, and the discarded rollouts are counted."""
        audits = [float(r["acting_audit"]) for r in rollouts if np.isfinite(r["acting_audit"])]
        if audits:
            self.differences["acting"] = max(audits)
        problems = [str(r["acting_problem"]) for r in rollouts if str(r["acting_problem"])]
        counters["discarded_rollouts"] += len(problems)
        if problems and self.acting:
            self.step_aside("acting", iteration, f"{problems[0]}; its rollout was discarded and sampled again")

    def scalars(self) -> dict[str, float]:
        """What TensorBoard records of the fast paths each iteration, under audit/."""
        scalars = {"audit/fast_acting": float(self.acting), "audit/fast_update": float(self.update is not None)}
        return scalars | {f"audit/{part}_difference": value for part, value in self.differences.items()}


def as_float64(x) -> torch.Tensor:
    x = torch.tensor(x) if isinstance(x, np.ndarray) else torch.as_tensor(x)
    return x.detach().double().cpu()


def compare(fast, plain) -> tuple[bool, float]:
    """Whether each fast value agrees with its plain counterpart within TOLERANCE of that counterpart's own largest
    magnitude (floored at a thousandth of the largest over all of them, so that float noise in a near-zero tensor is
    no mismatch), and the largest absolute difference."""
    relatives, differences = relative_differences(fast, plain)
    agree = all(r <= TOLERANCE for r in relatives)
    return agree, max(differences, default=0.0)


def relative_differences(fast, plain, floor: float = 0.0) -> tuple[list[float], list[float]]:
    """Each pair's largest difference as a fraction of its scale (what TOLERANCE bounds; inf for a non-finite
    difference or a shape mismatch), and each pair's largest absolute difference. `floor`: a least scale."""
    pairs = [(as_float64(f), as_float64(p)) for f, p in zip(fast, plain, strict=True)]
    if any(f.shape != p.shape for f, p in pairs):
        return [float("inf")] * len(pairs), [float("inf")] * len(pairs)
    differences = [float((f - p).abs().max()) if p.numel() else 0.0 for f, p in pairs]
    scales = [float(p.abs().max()) if p.numel() else 0.0 for _, p in pairs]
    floor = max(floor, 1e-6, 1e-3 * max((x for x in scales if np.isfinite(x)), default=0.0))
    relatives = [d / max(scale, floor) if np.isfinite(d) else float("inf") for d, scale in zip(differences, scales)]
    return relatives, differences


# ---------------------------------------------------------------------------------------------------------------------
# The audit, on the run's own data: every rollout's acting, and the first minibatch of every update
# ---------------------------------------------------------------------------------------------------------------------
def audit_acting(actor: NumpyActor, agent: nn.Module, obs: np.ndarray, actions: np.ndarray, logprobs: np.ndarray):
    """NumpyActor against the Agent it mirrors, on a rollout's observations as they were acted on: the means and stds
    against Agent.get_distribution, and the log-probabilities the
    rollout stored against Agent.evaluate's. Returns the largest difference as a fraction of its value's scale, and
    what differed when that is beyond float noise (None otherwise)."""
    flat_obs = obs.reshape(-1, obs.shape[-1])
    flat_actions = actions.reshape(len(flat_obs), *actions.shape[obs.ndim - 1 :])
    with torch.no_grad():
        obs_tensor = torch.from_numpy(flat_obs)
        dist = agent.get_distribution(obs_tensor)
        plain_logprob = agent.evaluate(obs_tensor, torch.from_numpy(flat_actions))[0]
        compared = {"mean": (actor.actor(flat_obs), dist.mean)}
        compared["std"] = (np.ascontiguousarray(np.broadcast_to(actor.std, dist.stddev.shape)), dist.stddev)
        compared["log-probability of the actions taken"] = (logprobs.reshape(-1), plain_logprob)
    return worst_of(compared, "Agent on this rollout's observations")


def worst_of(compared: dict[str, tuple], against: str, floor: float = 0.0) -> tuple[float, str | None]:
    """The largest relative difference over named (fast, plain) pairs, compared as one group (see compare; `floor`:
    a least scale), and a reason naming the worst pair when it is beyond float noise (None otherwise)."""
    fast, plain = [f for f, _ in compared.values()], [p for _, p in compared.values()]
    relatives, _ = relative_differences(fast, plain, floor)
    worst = int(np.argmax(relatives))
    if relatives[worst] <= TOLERANCE:
        return relatives[worst], None
    return relatives[
        worst
    ], f"its {list(compared)[worst]} differs from {against} by {relatives[worst]:.3g} of its scale"


def name_some(kind: str, names: list[str]) -> str:
    return f"{kind} on {names[0]}" + (f" and {len(names) - 1} more" if len(names) > 1 else "")


RANDOM_LAYERS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)


def uncarried_state(agent: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, str]:
    """What the fast paths cannot carry, by the part it touches ("acting", "update"), in words: a random layer, a
    module's or a tensor's hook (a copy of the agent drops tensor hooks, and neither numpy nor the written-out
    backward runs any hook), an optimizer's step hook, a buffer. Such a part runs the plain way."""
    from torch.nn.modules import module as module_globals
    from torch.optim import optimizer as optimizer_globals

    found: dict[str, str] = {}

    def add(parts: tuple[str, ...], reason: str) -> None:
        for part in parts:
            found.setdefault(part, reason)

    modules = list(agent.named_modules())
    for name, module in modules:
        if isinstance(module, RANDOM_LAYERS):
            add(("acting", "update"), f"a random layer ({type(module).__name__}) in {name or 'Agent'}")
    forward = [name or "Agent" for name, m in modules if m._forward_hooks or m._forward_pre_hooks]
    if forward:
        add(("update",), name_some("a forward hook", forward))
        # the samplers act with Agents of their own, built from the weights: no hook reaches them on either path
        add(("acting",), name_some("a forward hook", forward) + ", which the samplers' own copies of Agent do not have")
    backward = [name or "Agent" for name, m in modules if m._backward_hooks or m._backward_pre_hooks]
    if backward:
        add(("update",), name_some("a backward hook", backward))
    if any(
        getattr(module_globals, f"_global_{kind}_hooks", None)
        for kind in ("forward", "forward_pre", "backward", "backward_pre")
    ):
        add(("acting", "update"), "a global module hook (torch.nn.modules.module.register_module_*_hook)")
    hooked = [
        n for n, p in agent.named_parameters() if p._backward_hooks or getattr(p, "_post_accumulate_grad_hooks", None)
    ]
    if hooked:
        add(("update",), name_some("a gradient hook", hooked))
    step_hooks = [getattr(optimizer, f"_optimizer_step_{when}_hooks", None) for when in ("pre", "post")]
    step_hooks += [getattr(optimizer_globals, f"_global_optimizer_{when}_hooks", None) for when in ("pre", "post")]
    if any(step_hooks):
        add(("update",), "an optimizer step hook")
    buffers = [name for name, _ in agent.named_buffers()]
    if buffers:
        add(("update",), name_some("a buffer", buffers) + " (the stacked layers carry parameters only)")
    return found


def describe(dist: Distribution) -> str:
    inner = getattr(dist, "base_dist", None)
    return type(dist).__name__ + (f"({describe(inner)})" if isinstance(inner, Distribution) else "")


def require_diagonal_gaussian(dist: Distribution) -> None:
    """DoesNotFit unless the policy is the diagonal Gaussian that the fast paths compute."""
    gaussian = isinstance(dist, Independent) and type(dist.base_dist) is Normal and dist.reinterpreted_batch_ndims == 1
    if not gaussian:
        raise DoesNotFit(
            f"Agent.get_distribution returns {describe(dist)}, not the diagonal Gaussian (Independent(Normal, 1)) "
            "it computes"
        )


def perturbed_copy(agent: nn.Module) -> nn.Module:
    """A copy of the agent with every parameter moved by random noise: at the initial weights the actor's means are
    near 0 and its log-std is 0, where an edit such as a tanh on the mean or a clamp on the std changes nothing; the
    check must see the network where it will train."""
    copied = copy.deepcopy(agent)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for param in copied.parameters():
            param.add_(0.3 * torch.randn(param.shape, generator=generator).to(param.device, param.dtype))
    return copied


def check_acting(agent: nn.Module, obs_dim: int, act_dim: int, rows: int = 64) -> str | None:
    """None when NumpyActor computes what Agent.get_distribution defines, else why not."""
    generator = torch.Generator().manual_seed(0)
    try:
        cpu_agent = perturbed_copy(agent).cpu()
        obs = torch.randn(rows, obs_dim, generator=generator)
        with torch.no_grad():
            dist = cpu_agent.get_distribution(obs)
            require_diagonal_gaussian(dist)
            numpy_actor = NumpyActor(cpu_agent)
            again = cpu_agent.get_distribution(obs)
            if not torch.equal(dist.mean, again.mean):
                raise DoesNotFit("Agent.get_distribution gives two answers for one input (a random layer)")
            noise = torch.randn(rows, act_dim, generator=generator)
            actions = dist.mean + dist.stddev * noise
            plain = [dist.mean, dist.stddev, dist.log_prob(actions), dist.entropy()]
            fast = [
                numpy_actor.actor(obs.numpy()),
                np.ascontiguousarray(np.broadcast_to(numpy_actor.std, (rows, act_dim))),
            ]
            fast.append(numpy_actor.log_prob(obs.numpy(), actions.numpy(), noise.numpy()))
            fast.append(numpy_actor.entropy(obs.numpy()))
    except DoesNotFit as e:
        return f"the network does not fit it ({e})"
    except Exception as e:  # noqa: BLE001 (any network that the plain path runs must not end the run here)
        return f"mirroring Agent failed ({failure(e)})"
    agree, difference = compare(fast, plain)
    if not agree:
        return f"it differs from Agent.get_distribution (max difference {difference:.3g})"
    return None


def synthetic_minibatch(agent: nn.Module, obs_dim: int, clip_coef: float, behaviour: bool, rows: int = 64) -> dict:
    """Observations, actions and targets around the agent's own outputs that take every branch of the loss: ratios
    inside and outside the clip on both sides, both signs of advantage, value steps inside and outside the value
    clip, and (`behaviour`: the decoupled loss's behaviour log-probabilities) importance weights on both sides of 1."""
    generator = torch.Generator().manual_seed(1)
    device = next(agent.parameters()).device
    obs = torch.randn(rows, obs_dim, generator=generator)
    noise = torch.randn(rows, agent.actor_logstd.shape[1], generator=generator)
    with torch.no_grad():
        dist = agent.get_distribution(obs.to(device))
        actions = (dist.mean + dist.stddev * noise.to(device)).cpu()
        new_logprob, _, new_value = agent.evaluate(obs.to(device), actions.to(device))
    # Seven ratios (an odd count, so that each meets both signs of advantage), far outside the clip too
    ratios = torch.tensor([0.02, 1 - 2 * clip_coef, 1 - clip_coef / 2, 1.0, 1 + clip_coef / 2, 1 + 2 * clip_coef, 6.0])
    ratio = ratios.clamp(min=0.01).repeat(rows // len(ratios) + 1)[:rows]
    sign = torch.tensor([1.0, -1.0]).repeat(rows // 2 + 1)[:rows]
    value_steps = torch.tensor([2.0, 0.5, -0.5, -2.0]).repeat(rows // 4 + 1)[:rows] * clip_coef
    minibatch = dict(obs=obs, actions=actions, logprobs=new_logprob.cpu() - ratio.log())
    minibatch["advantages"] = sign * (0.5 + torch.rand(rows, generator=generator))
    minibatch["values"] = new_value.cpu() - value_steps
    minibatch["returns"] = new_value.cpu() + torch.randn(rows, generator=generator)
    if behaviour:
        # importance weights pi_old / pi_behaviour on both sides of 1, and past --max-is-weight's default cap
        weights = torch.tensor([0.2, 0.8, 1.3, 150.0]).repeat(rows // 4 + 1)[:rows]
        minibatch["behaviour_logprobs"] = minibatch["logprobs"] - weights.log()
    return {key: value.to(device) for key, value in minibatch.items()}


def check_loss_gradient(agent, obs_dim: int, loss_settings: list[dict]) -> str | None:
    """None when written_loss_gradients equals the gradient derived from gae.ppo_loss on a minibatch that takes every
    branch of the loss, with each of the run's loss settings; else why not (an edited ppo_loss)."""
    try:
        plain_agent = perturbed_copy(agent)
        with torch.no_grad():
            require_diagonal_gaussian(plain_agent.get_distribution(torch.zeros(1, obs_dim, device=device_of(agent))))
        worst = (0.0, None)
        for loss_kwargs, behaviour in itertools.product(loss_settings, (False, True)):
            minibatch = synthetic_minibatch(plain_agent, obs_dim, loss_kwargs["clip_coef"], behaviour)
            with torch.no_grad():
                new_logprob, entropy, new_values = plain_agent.evaluate(minibatch["obs"], minibatch["actions"])
                stats = ppo_loss_of(new_logprob, new_values, entropy, minibatch, loss_kwargs)
                written = written_loss_gradients(stats, minibatch, new_values, loss_kwargs)
            _, derived = derived_loss_gradients(new_logprob, new_values, entropy, minibatch, loss_kwargs)
            pairs = loss_gradient_pairs(written, derived, new_logprob)
            relative, reason = worst_of(pairs, "the written-out one of the stock loss")
            if reason is not None and relative >= worst[0]:
                worst = (relative, reason)
    except DoesNotFit:
        return None  # check_update says why the update does not fit
    except Exception as e:  # noqa: BLE001
        return f"running it failed ({failure(e)})"
    return worst[1]


def check_update(
    agent, optimizer, obs_dim: int, loss_settings: list[dict], plain, derive_loss_gradient: bool
) -> str | None:
    """None when the fast update computes what the plain path does, else why not. `plain`: ppo_continuous.py's
    (PlainUpdate, clip_gradients), which run on the plain path and are compared against here."""
    plain_update_type, clip_gradients = plain
    try:
        adam_settings(optimizer, agent)  # the run's optimizer; the copy's layers are checked by StackedUpdate
        plain_agent = perturbed_copy(agent)
        with torch.no_grad():
            require_diagonal_gaussian(plain_agent.get_distribution(torch.zeros(1, obs_dim, device=device_of(agent))))
        fast_agent = copy.deepcopy(plain_agent)
        fast_optimizer = torch.optim.Adam(fast_agent.parameters(), **adam_options(optimizer))
        fast = StackedUpdate(fast_agent, fast_optimizer, derive_loss_gradient)
    except DoesNotFit as e:
        return f"the network or optimizer does not fit it ({e})"
    except Exception as e:  # noqa: BLE001
        return f"stacking Agent failed ({failure(e)})"
    worst = (0.0, "")
    try:
        for loss_kwargs, behaviour in itertools.product(loss_settings, (False, True)):
            minibatch = synthetic_minibatch(plain_agent, obs_dim, loss_kwargs["clip_coef"], behaviour)
            plain_optimizer = torch.optim.SGD(plain_agent.parameters(), lr=0.0)  # only its zero_grad is used
            plain_stats = plain_update_type(plain_agent, plain_optimizer).loss_and_gradients(minibatch, **loss_kwargs)
            fast_stats = fast.loss_and_gradients(minibatch, **loss_kwargs)
            _, _, plain_values = plain_agent.evaluate(minibatch["obs"], minibatch["actions"])
            fast_values = fast.forward(minibatch["obs"])[2][1, :, 0]
            compared = {
                "value": ([fast_values], [plain_values.detach()]),
                "loss": (
                    [getattr(fast_stats, f) for f in LOSS_FIELDS],
                    [getattr(plain_stats, f).detach() for f in LOSS_FIELDS],
                ),
                "gradient": (
                    [p.grad for p in fast_agent.parameters()],
                    [p.grad if p.grad is not None else torch.zeros_like(p) for p in plain_agent.parameters()],
                ),
            }
            # The loop's gradient clip sees the flat buffer on the fast path and the parameters' .grad on the plain
            # one: it must treat them alike, also when it clips (a gradient scaled up to well past any norm bound).
            for scale_up in (1.0, 1e6):
                fast_grads = [fast.grads.clone() * scale_up]
                plain_grads = [p.grad.clone() * scale_up for p in plain_agent.parameters() if p.grad is not None]
                fast_norm, plain_norm = clip_gradients(fast_grads, 0.5), clip_gradients(plain_grads, 0.5)
                views = fast.agent_views(fast_grads[0])
                fast_clipped = [views[name] for name, p in plain_agent.named_parameters() if p.grad is not None]
                compared[f"clipped gradient (x{scale_up:g})"] = (fast_clipped, plain_grads)
                compared[f"gradient norm (x{scale_up:g})"] = ([torch.tensor(fast_norm)], [torch.tensor(plain_norm)])
            for what, (fast_values_, plain_values_) in compared.items():
                agree, difference = compare(fast_values_, plain_values_)
                if not agree and difference >= worst[0]:
                    worst = (difference, what)
        step_agrees, step_difference = check_adam_steps(fast, plain_agent, optimizer)
        if not step_agrees and step_difference >= worst[0]:
            worst = (step_difference, "Adam step")
    except Exception as e:  # noqa: BLE001
        return f"running it failed ({failure(e)})"
    if worst[1]:
        return f"it differs from autograd through Agent and ppo_loss (max {worst[1]} difference {worst[0]:.3g})"
    return None


def check_adam_steps(
    fast: StackedUpdate, plain_agent: nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[bool, float]:
    """StackedUpdate.step against Adam as torch.optim.Adam documents it, written out here in float64 with the run's
    lr, betas and eps (torch.optim.Adam.step itself would import torch._dynamo, seconds of start-up; the tests compare
    StackedUpdate with it directly). Two steps from the same gradients (the plain agent's last ones, then those
    doubled); the parameter changes are compared, each against its own scale. It runs last: it spends the copy."""
    options = adam_options(optimizer)
    lr, (beta1, beta2), eps = options["lr"], options["betas"], options["eps"]
    fast_grads = fast.agent_views(fast.grads)
    expected_changes = []
    for param in plain_agent.parameters():
        grad = as_float64(param.grad if param.grad is not None else torch.zeros_like(param))
        exp_avg, exp_avg_sq, change = (torch.zeros_like(grad) for _ in range(3))
        for step, scale in enumerate((1.0, 2.0), start=1):
            exp_avg = beta1 * exp_avg + (1 - beta1) * grad * scale
            exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * (grad * scale) ** 2
            corrected_sq = exp_avg_sq / (1 - beta2**step)
            change = change - lr * (exp_avg / (1 - beta1**step)) / (corrected_sq.sqrt() + eps)
        expected_changes.append(change)
    # Adam's step does not depend on the parameters (no weight decay): starting them at 0 makes the change exact in
    # float32, where a difference of parameters near 1 would lose the step's low digits.
    fast.params.zero_()
    for scale in (1.0, 2.0):
        with torch.no_grad():
            for name, param in plain_agent.named_parameters():
                fast_grads[name].copy_(param.grad * scale if param.grad is not None else torch.zeros_like(param))
        fast.step()
    fast_params = fast.agent_views(fast.params)
    fast_changes = [fast_params[name] for name, _ in plain_agent.named_parameters()]
    return compare(fast_changes, expected_changes)


def failure(e: Exception) -> str:
    """An exception in a few words: its type and the first line of its message."""
    message = first_line(e)[:120] if str(e).strip() else "no message"
    return f"{type(e).__name__}: {message}"


def device_of(agent: nn.Module) -> torch.device:
    return next(agent.parameters()).device


def adam_options(optimizer: torch.optim.Optimizer) -> dict:
    group = optimizer.param_groups[0]
    return dict(lr=float(group["lr"]), betas=group["betas"], eps=group["eps"])


def choose_fast_paths(agent, optimizer, loss_settings: list[dict], enabled: bool, plain) -> FastPaths:
    """Check each fast path against the plain path on perturbed copies of the run's agent and its optimizer, with each
    of the run's loss settings; returns which parts run fast, and says in one line why each part that steps aside
    does. `plain`: ppo_continuous.py's (PlainUpdate, clip_gradients). With enabled=False (--no-fast-path) nothing is
    checked."""
    plain_acting = "torch (Agent.get_distribution)"
    plain_update = f"autograd (loss.backward()) and torch.optim.{type(optimizer).__name__}"
    if not enabled:
        return FastPaths(False, None, {"acting": plain_acting, "update": plain_update})
    lines = []
    uncarried = uncarried_state(agent, optimizer)
    # The checks run the user's code, which may draw random numbers (dropout, say): the run's streams must not move
    device = next(agent.parameters()).device
    numpy_state = np.random.get_state()  # noqa: NPY002 (the global stream a user's code may draw from)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        acting_problem = uncarried.get("acting") or check_acting(agent, agent.obs_dim, agent.act_dim)
        loss_problem = None if "update" in uncarried else check_loss_gradient(agent, agent.obs_dim, loss_settings)
        derive = loss_problem is not None
        update_problem = uncarried.get("update") or check_update(
            agent, optimizer, agent.obs_dim, loss_settings, plain, derive
        )
    np.random.set_state(numpy_state)  # noqa: NPY002
    update = None
    if update_problem is None:
        if derive:
            lines.append(
                f"fast update: gae.ppo_loss is not the stock loss ({loss_problem}); its gradient is derived by autograd"
            )
        try:
            update = StackedUpdate(agent, optimizer, derive)
        except Exception as e:  # noqa: BLE001 (a resumed optimizer state that does not fit, say)
            update_problem = f"building it failed ({failure(e)})"
    if acting_problem:
        lines.append(f"fast acting off: {acting_problem}; acting with torch through Agent.get_distribution")
    if update_problem:
        optimizer_name = f"torch.optim.{type(optimizer).__name__}"
        lines.append(f"fast update off: {update_problem}; training with loss.backward() and {optimizer_name}")
    used = {
        "acting": plain_acting if acting_problem else "numpy (NumpyActor, audited against Agent.get_distribution)",
        "update": plain_update if update_problem else "StackedUpdate (audited against autograd and torch.optim.Adam)",
    }
    if update is not None:
        used["loss gradient"] = LOSS_GRADIENT_DERIVED if derive else LOSS_GRADIENT_WRITTEN
    for line in lines:
        say(line)
    return FastPaths(acting_problem is None, update, used)
