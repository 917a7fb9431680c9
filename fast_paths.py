"""Fast paths: accelerators of ppo_continuous.py's plain path that prove themselves equal to it when a run starts.

ppo_continuous.py holds the one definition of everything that learns: the network and the policy's distribution
(`Agent`), the loss (`gae.ppo_loss`), the optimizer (`make_learner`) and the two functions the hot loops call, acting
(`TorchActor`) and one minibatch's loss and gradients (`loss_and_gradients`, autograd). For 64-unit MLPs PyTorch's
per-op overhead, not arithmetic, sets the speed of both loops, so two accelerators may stand in for them:

- `NumpyActor` for `TorchActor`: the actor net walked layer by layer and mirrored in numpy (a layer it cannot mirror
  runs in torch), with the Gaussian's state-independent log-std.
- `StackedUpdate` for `loss_and_gradients` and `optimizer.step()`: the actor's and the critic's layers stacked in pairs
  (one batched matmul runs a layer of both), all parameters and all gradients in one flat buffer each, the backward
  written out from gae.ppo_loss(with_grads=True)'s d loss / d log-prob and d loss / d value through the Gaussian head,
  the linear layers and the activations whose derivative it knows, and Adam's step as torch.optim.Adam computes it.

`choose_fast_paths` runs before the first rollout, on the run's own agent, optimizer and loss settings. Each
accelerator must first fit (a network it can mirror or stack, the optimizer it reproduces), then match the plain path on
random inputs: actions' means and stds, log-probabilities and entropies for acting; values, the loss and the whole
gradient on a synthetic minibatch that takes every branch of the loss for the update. One that does not fit or does not
match steps aside with one line naming the part and the reason, and the run uses the plain path for that part. So an
edit to Agent, ppo_loss or make_learner always runs as written: on a fast path that equals it, or on the plain path.

The loop around these functions (shuffling, minibatches, gradient clipping, early stopping) is the same code on both
paths: the parameters and gradients that StackedUpdate keeps in its flat buffers are the Agent's own, as views.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from gae import LOG_SQRT_2PI, PPOLoss, ppo_loss

# A fast path matches when each value it computes differs from the plain path's by at most this fraction of that
# value's largest magnitude (see compare). Both compute in float32, whose rounding (about 1e-7 relative) accumulates
# over a few layers and a minibatch's sums to around 1e-6; a real difference in the math (another activation, an extra
# loss term) is orders of magnitude larger.
TOLERANCE = 1e-4


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
    Gaussian with the state-independent log-std `agent.actor_logstd` (or a categorical for discrete actions). Built from
    the sampler's copy of the Agent whenever new weights arrive."""

    def __init__(self, agent: nn.Module):
        if not isinstance(getattr(agent, "actor_mean", None), nn.Sequential):
            raise DoesNotFit("Agent.actor_mean is not an nn.Sequential to mirror")
        self.layers = [numpy_layer(module) for module in agent.actor_mean]
        self.discrete = agent.discrete
        if not self.discrete:
            logstd = getattr(agent, "actor_logstd", None)
            if not isinstance(logstd, torch.Tensor) or logstd.dim() != 2 or logstd.shape[0] != 1:
                raise DoesNotFit("Agent has no state-independent actor_logstd of shape (1, action_dim)")
            self.logstd = logstd.detach().cpu().double().numpy().reshape(-1)
            self.std = np.exp(self.logstd)
            self.logprob_offset = self.logstd.sum() + len(self.logstd) * LOG_SQRT_2PI

    def actor(self, obs: np.ndarray) -> np.ndarray:
        """The actor net's output: the Gaussian's mean, or the logits."""
        for layer in self.layers:
            obs = layer(obs)
        return obs

    def act(self, obs: np.ndarray, noise: np.ndarray) -> np.ndarray:
        """Actions for a batch of observations, drawn with the rollout's `noise`: standard normal (N, action_dim) for
        a Gaussian, uniform (N, 1) for a categorical."""
        out = self.actor(obs)
        if self.discrete:
            return categorical_draw(log_softmax(out.astype(np.float64)), noise)
        return out + self.std * noise

    def log_prob(self, obs: np.ndarray, actions: np.ndarray, noise: np.ndarray) -> np.ndarray:
        """Log-probabilities of the actions `act` drew (any leading shape). For the Gaussian they follow from the
        noise alone, so a rollout computes them once, after its loop."""
        if not self.discrete:
            return -0.5 * (noise * noise).sum(axis=-1) - self.logprob_offset
        log_probs = log_softmax(self.actor(obs).astype(np.float64))
        return np.take_along_axis(log_probs, actions[..., None].astype(np.int64), axis=-1)[..., 0]

    def entropy(self, obs: np.ndarray) -> np.ndarray:
        if not self.discrete:
            return np.full(obs.shape[:-1], (0.5 + LOG_SQRT_2PI + self.logstd).sum())
        log_probs = log_softmax(self.actor(obs).astype(np.float64))
        return -(np.exp(log_probs) * log_probs).sum(axis=-1)

    def best_action(self, obs: np.ndarray) -> np.ndarray:
        """The distribution's mode: the mean, or the most likely action."""
        out = self.actor(obs)
        return out.argmax(axis=-1) if self.discrete else out


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def categorical_draw(log_probs: np.ndarray, uniform: np.ndarray) -> np.ndarray:
    """Inverse-CDF sampling: the first action whose cumulative probability exceeds the uniform draw."""
    cumulative = np.exp(log_probs).cumsum(axis=-1)
    index = (cumulative < uniform * cumulative[..., -1:]).sum(axis=-1)
    return np.minimum(index, log_probs.shape[-1] - 1)


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
    if getattr(agent, "discrete", False):
        raise DoesNotFit("discrete actions take autograd")
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


class StackedUpdate:
    """loss_and_gradients and optimizer.step() for the Agent's two MLPs and a torch.optim.Adam, in few ops.

    The Agent's parameters and their .grad become views into flat buffers laid out as the stacked layers, so the Agent
    stays the plain nn.Module that acts, is saved and loaded, and the loop's clip_gradients clips the flat gradient
    buffer. Adam's learning rate, betas and eps are read from the optimizer's param group at every step, so schedules
    reach it."""

    def __init__(self, agent: nn.Module, optimizer: torch.optim.Optimizer):
        self.linear, self.activations = stacked_layers(agent)
        self.group = adam_settings(optimizer, agent)
        self.agent = agent
        self.steps = 0
        actor = agent.actor_mean
        self.shapes = [(2, actor[i].out_features, actor[i].in_features) for i in self.linear]
        self.shapes = [s for shape in self.shapes for s in (shape, (2, 1, shape[1]))] + [(1, actor[-1].out_features)]
        device, size = agent.actor_logstd.device, sum(int(np.prod(shape)) for shape in self.shapes)
        self.params, self.grads, self.exp_avg, self.exp_avg_sq = (torch.zeros(size, device=device) for _ in range(4))
        self.stacked, self.stacked_grads = self.unflatten(self.params), self.unflatten(self.grads)
        self.output_grads: dict[int, torch.Tensor] = {}
        self.minus_one = torch.tensor(-1.0, device=device)
        self.all_tanh = all(type(a) is nn.Tanh for a in self.activations)
        views, grad_views = self.agent_views(self.params), self.agent_views(self.grads)
        with torch.no_grad():
            for name, param in agent.named_parameters():
                views[name].copy_(param)
                param.data = views[name]
                param.grad = grad_views[name]
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
            if self.all_tanh:  # tanh(u) = 2 sigmoid(2u) - 1, the 2u from the matmul itself: torch's CPU tanh is dearer
                u = None
                h = torch.add(
                    self.minus_one, torch.baddbmm(bias, h, weight.mT, beta=2.0, alpha=2.0).sigmoid_(), alpha=2
                )
            else:
                u = torch.baddbmm(bias, h, weight.mT)
                h = self.activations[k](u)
            pre_activations.append(u)
        inputs.append(h)
        return inputs, pre_activations, torch.baddbmm(layers[-1], h, layers[-2].mT)

    def loss_and_gradients(self, minibatch: dict, **loss_kwargs) -> PPOLoss:
        """gae.ppo_loss of a minibatch, with its gradient left in the Agent's .grad (the flat gradient buffer)."""
        with torch.no_grad():
            return self.analytic_backward(minibatch, loss_kwargs)

    def analytic_backward(self, minibatch: dict, loss_kwargs: dict) -> PPOLoss:
        """The forward pass keeping each layer's input, then the chain rule written out, from the loss's gradient with
        respect to the log-probabilities and values down to every weight."""
        logstd = self.stacked[-1]
        inputs, pre_activations, out = self.forward(minibatch["obs"])
        inv_std, logstd_sum = torch.exp(-logstd), logstd.sum()
        z = (minibatch["actions"] - out[0]) * inv_std  # the action's standardized noise
        z_squared = z * z
        new_logprob = z_squared.sum(1).mul_(-0.5).sub_(logstd_sum + logstd.shape[1] * LOG_SQRT_2PI)
        entropy = (logstd_sum + logstd.shape[1] * (0.5 + LOG_SQRT_2PI)).expand(len(z))  # the same for every sample
        stats = ppo_loss(
            new_logprob,
            minibatch["logprobs"],
            minibatch["advantages"],
            out[1, :, 0],
            minibatch["values"],
            minibatch["returns"],
            entropy,
            behaviour_logprob=minibatch.get("behaviour_logprobs"),
            with_grads=True,
            **loss_kwargs,
        )
        *layer_grads, logstd_grad = self.stacked_grads
        d_out = self.output_grad_buffer(len(z))
        # d log pi / d mean = z / std and d log pi / d logstd = z^2 - 1, per sample; the entropy's d / d logstd is 1
        torch.mul(z * inv_std, stats.logprob_grad[:, None], out=d_out[0])
        d_out[1, :, 0] = stats.value_grad
        torch.mm(stats.logprob_grad[None], z_squared - 1.0, out=logstd_grad)
        if loss_kwargs.get("ent_coef"):
            logstd_grad.sub_(loss_kwargs["ent_coef"])
        for k in reversed(range(len(self.linear))):
            weight, weight_grad, bias_grad = self.stacked[2 * k], layer_grads[2 * k], layer_grads[2 * k + 1]
            torch.bmm(d_out.mT, inputs[k], out=weight_grad)
            torch.sum(d_out, 1, keepdim=True, out=bias_grad)
            if k > 0:  # back through the layer, then through the activation below it
                d_out = torch.bmm(d_out, weight)
                h = inputs[k]
                if self.all_tanh:
                    d_out = torch.addcmul(d_out, d_out * h, h, value=-1.0)
                else:
                    activation = self.activations[k - 1]
                    d_out = d_out * DERIVATIVES[type(activation)](activation, pre_activations[k - 1], h)
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
    the optimizer. `used` says it in words, for summary.json and TensorBoard."""

    acting: bool = False
    update: StackedUpdate | None = None
    used: dict[str, str] = field(default_factory=dict)

    def table(self) -> str:
        """`used` as a markdown table, for TensorBoard's text tab."""
        return "|part|runs on|\n|-|-|\n" + "\n".join(f"|{part}|{way}|" for part, way in self.used.items())


def as_float64(x) -> torch.Tensor:
    x = torch.tensor(x) if isinstance(x, np.ndarray) else torch.as_tensor(x)
    return x.detach().double().cpu()


def compare(fast, plain) -> tuple[bool, float]:
    """Whether each fast value agrees with its plain counterpart within TOLERANCE of that counterpart's own largest
    magnitude (floored at a thousandth of the largest over all of them, so that float noise in a near-zero tensor is
    no mismatch), and the largest absolute difference."""
    pairs = [(as_float64(f), as_float64(p)) for f, p in zip(fast, plain, strict=True)]
    if any(f.shape != p.shape for f, p in pairs):
        return False, float("inf")
    differences = [float((f - p).abs().max()) if p.numel() else 0.0 for f, p in pairs]
    scales = [float(p.abs().max()) if p.numel() else 0.0 for _, p in pairs]
    floor = max(1e-6, 1e-3 * max(scales, default=0.0))
    agree = all(d <= TOLERANCE * max(scale, floor) for d, scale in zip(differences, scales))
    return agree and all(np.isfinite(differences)), max(differences, default=0.0)


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
        numpy_actor = NumpyActor(cpu_agent)
        obs = torch.randn(rows, obs_dim, generator=generator)
        with torch.no_grad():
            dist = cpu_agent.get_distribution(obs)
            if agent.discrete:
                actions = torch.randint(act_dim, (rows,), generator=generator)
                plain = [dist.logits.log_softmax(-1), dist.log_prob(actions), dist.entropy()]
                all_log_probs = log_softmax(numpy_actor.actor(obs.numpy()).astype(np.float64))
                fast = [all_log_probs, numpy_actor.log_prob(obs.numpy(), actions.numpy(), None)]
            else:
                noise = torch.randn(rows, act_dim, generator=generator)
                actions = dist.mean + dist.stddev * noise
                plain = [dist.mean, dist.stddev, dist.log_prob(actions), dist.entropy()]
                fast = [numpy_actor.actor(obs.numpy()), np.broadcast_to(numpy_actor.std, (rows, act_dim))]
                fast.append(numpy_actor.log_prob(obs.numpy(), actions.numpy(), noise.numpy()))
            fast.append(numpy_actor.entropy(obs.numpy()))
    except DoesNotFit as e:
        return f"the network does not fit it ({e})"
    except Exception as e:  # noqa: BLE001 (any network that the plain path runs must not end the run here)
        return f"mirroring Agent failed ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})"
    agree, difference = compare(fast, plain)
    if not agree:
        return f"it differs from Agent.get_distribution (max difference {difference:.3g})"
    return None


def synthetic_minibatch(agent: nn.Module, obs_dim: int, clip_coef: float, decoupled: bool, rows: int = 64) -> dict:
    """Observations, actions and targets around the agent's own outputs that take every branch of the loss: ratios
    inside and outside the clip on both sides, both signs of advantage, value steps inside and outside the value
    clip, and (decoupled) importance weights on both sides of 1."""
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
    if decoupled:
        # importance weights pi_old / pi_behaviour on both sides of 1, and past --max-is-weight's default cap
        weights = torch.tensor([0.2, 0.8, 1.3, 150.0]).repeat(rows // 4 + 1)[:rows]
        minibatch["behaviour_logprobs"] = minibatch["logprobs"] - weights.log()
    return {key: value.to(device) for key, value in minibatch.items()}


def check_update(agent, optimizer, obs_dim: int, loss_settings: list[dict], decoupled: bool, plain) -> str | None:
    """None when the fast update computes what the plain path does, else why not. `plain`: ppo_continuous.py's
    (loss_and_gradients, clip_gradients), which run on the plain path and are compared against here."""
    plain_loss_and_gradients, clip_gradients = plain
    try:
        adam_settings(optimizer, agent)  # the run's optimizer; the copy's layers are checked by StackedUpdate
        plain_agent = perturbed_copy(agent)
        fast_agent = copy.deepcopy(plain_agent)
        fast = StackedUpdate(fast_agent, torch.optim.Adam(fast_agent.parameters(), **adam_options(optimizer)))
    except DoesNotFit as e:
        return f"the network or optimizer does not fit it ({e})"
    except Exception as e:  # noqa: BLE001
        return f"stacking Agent failed ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})"
    worst = (0.0, "")
    try:
        for loss_kwargs in loss_settings:
            minibatch = synthetic_minibatch(plain_agent, obs_dim, loss_kwargs["clip_coef"], decoupled)
            plain_optimizer = torch.optim.SGD(plain_agent.parameters(), lr=0.0)  # only its zero_grad is used
            plain_stats = plain_loss_and_gradients(plain_agent, plain_optimizer, minibatch, **loss_kwargs)
            fast_stats = fast.loss_and_gradients(minibatch, **loss_kwargs)
            _, _, plain_values = plain_agent.evaluate(minibatch["obs"], minibatch["actions"])
            fast_values = fast.forward(minibatch["obs"])[2][1, :, 0]
            fields = ("loss", "policy_loss", "value_loss", "entropy", "ratio")
            compared = {
                "value": ([fast_values], [plain_values.detach()]),
                "loss": ([getattr(fast_stats, f) for f in fields], [getattr(plain_stats, f).detach() for f in fields]),
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
        return f"running it failed ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})"
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


def adam_options(optimizer: torch.optim.Optimizer) -> dict:
    group = optimizer.param_groups[0]
    return dict(lr=float(group["lr"]), betas=group["betas"], eps=group["eps"])


def choose_fast_paths(
    agent, optimizer, loss_settings: list[dict], decoupled: bool, enabled: bool, plain
) -> tuple[FastPaths, list[str]]:
    """Check each fast path against the plain path on perturbed copies of the run's agent and its optimizer, with each
    of the run's loss settings; returns which parts run fast, and one line for each part that steps aside. `plain`:
    ppo_continuous.py's (loss_and_gradients, clip_gradients). With enabled=False (--no-fast-path) nothing is checked."""
    plain_acting = "torch (Agent.get_distribution)"
    plain_update = f"autograd (loss.backward()) and torch.optim.{type(optimizer).__name__}"
    if not enabled:
        return FastPaths(False, None, {"acting": plain_acting, "update": plain_update}), []
    lines = []
    # The checks run the user's code, which may draw random numbers (dropout, say): the run's streams must not move
    device = next(agent.parameters()).device
    numpy_state = np.random.get_state()  # noqa: NPY002 (the global stream a user's code may draw from)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        acting_problem = check_acting(agent, agent.obs_dim, agent.act_dim)
        update_problem = check_update(agent, optimizer, agent.obs_dim, loss_settings, decoupled, plain)
    np.random.set_state(numpy_state)  # noqa: NPY002
    update = None
    if update_problem is None:
        try:
            update = StackedUpdate(agent, optimizer)
        except Exception as e:  # noqa: BLE001 (a resumed optimizer state that does not fit, say)
            update_problem = (
                f"building it failed ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})"
            )
    if acting_problem:
        lines.append(f"fast acting off: {acting_problem}; acting with torch through Agent.get_distribution")
    if update_problem:
        optimizer_name = f"torch.optim.{type(optimizer).__name__}"
        lines.append(f"fast update off: {update_problem}; training with loss.backward() and {optimizer_name}")
    used = {
        "acting": plain_acting if acting_problem else "numpy (NumpyActor, checked against Agent.get_distribution)",
        "update": plain_update if update_problem else "StackedUpdate (checked against autograd and torch.optim.Adam)",
    }
    return FastPaths(acting_problem is None, update, used), lines
