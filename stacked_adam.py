"""The update's fast path: Adam over the PPO agent's parameters, laid out so that a minibatch costs few ops, and for
Box actions the backward pass written out.

A 64-unit MLP's update spends its time on PyTorch's per-op overhead, not on arithmetic, so everything here cuts ops:
- The actor's and the critic's layers are stacked in pairs, so one torch.baddbmm runs a layer of both nets (the
  critic's 1-unit output layer is padded with zeros to the actor's width; its padding gets no gradient and stays 0).
- All parameters live in one flat buffer and all gradients in another: the gradient clip is one norm and Adam's step
  five ops on one tensor. No torch.optim object is built (its first use imports torch._dynamo, 1.3 s of start-up).
- Box actions skip autograd: `analytic_backward` keeps the hidden layers of the forward pass and applies the chain rule
  by hand, from gae.ppo_loss's d loss / d log-prob and d loss / d value through the Gaussian head and both nets (about
  40 ops a minibatch against autograd's 150). Discrete actions keep autograd through `evaluate`.

The Agent's parameters become views into the buffer, so the Agent stays the plain nn.Module that acts, is saved and
loaded, and always holds the current weights. Nothing here changes the math: tests/test_ppo_continuous.py checks the
written-out gradients against autograd, and the forward pass, gradients and Adam steps of a whole ppo_update against
the plain Agent with clip_grad_norm_ and torch.optim.Adam; benchmarks/iteration_profile.py times the two (HalfCheetah,
0.62 against 1.61 ms per minibatch).
"""

from __future__ import annotations

import numpy as np
import torch

from gae import LOG_SQRT_2PI, PPOLoss, ppo_loss
from run_utils import UsageError


class StackedAdam:
    """Adam with CleanRL's eps (1e-5) for ppo_continuous.Agent, and the Agent's evaluate on the stacked layout."""

    def __init__(self, agent, lr: float, eps: float = 1e-5, betas: tuple[float, float] = (0.9, 0.999)):
        in_dim, width, out_dim = (
            agent.critic[0].in_features,
            agent.critic[0].out_features,
            agent.actor_mean[4].out_features,
        )
        shapes = [(2, width, in_dim), (2, 1, width), (2, width, width), (2, 1, width), (2, out_dim, width)]
        shapes += [(2, 1, out_dim)] + ([] if agent.discrete else [(1, out_dim)])
        self.agent, self.lr, self.eps, self.betas, self.steps, self.shapes = agent, lr, eps, betas, 0, shapes
        device, size = agent.critic[0].weight.device, sum(int(np.prod(shape)) for shape in shapes)
        self.params, self.grads, self.exp_avg, self.exp_avg_sq = (torch.zeros(size, device=device) for _ in range(4))
        self.stacked, self.stacked_grads = self.unflatten(self.params), self.unflatten(self.grads)
        self.analytic, self.output_grads = not agent.discrete, {}
        self.minus_one = torch.tensor(-1.0, device=device)
        for leaf, grad in zip(self.stacked, self.stacked_grads):
            leaf.requires_grad_(True)
            leaf.grad = grad  # backward accumulates into the flat gradient buffer in place
        with torch.no_grad():
            for (name, param), view in zip(agent.named_parameters(), self.agent_views(self.params), strict=True):
                if param.shape != view.shape:  # a network changed by hand
                    raise UsageError(
                        f"stacked_adam.py fits the Agent's two-hidden-layer MLPs, not {name} {tuple(param.shape)}: "
                        "for another network use torch.optim.Adam (plain_update in benchmarks/iteration_profile.py)"
                    )
                view.copy_(param)
                param.data = view

    def unflatten(self, flat: torch.Tensor) -> list[torch.Tensor]:
        sizes = [int(np.prod(shape)) for shape in self.shapes]
        return [part.view(shape) for part, shape in zip(flat.split(sizes), self.shapes)]

    def agent_views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Views of `flat` (laid out like the parameters) shaped as the Agent's parameters, in their order: the
        actor's log-std, the critic (net 1 of each stacked pair), then the actor (net 0)."""
        w1, b1, w2, b2, w3, b3, *logstd = self.unflatten(flat)
        critic = [w1[1], b1[1, 0], w2[1], b2[1, 0], w3[1, :1], b3[1, 0, :1]]
        return logstd + critic + [w1[0], b1[0, 0], w2[0], b2[0, 0], w3[0], b3[0, 0]]

    def evaluate(self, x: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Agent.evaluate, both nets at once."""
        w1, b1, w2, b2, w3, b3, *logstd = self.stacked
        h = torch.tanh(torch.baddbmm(b1, x.expand(2, *x.shape), w1.mT))
        h = torch.tanh(torch.baddbmm(b2, h, w2.mT))
        out = torch.baddbmm(b3, h, w3.mT)
        return (*self.agent.action_terms(out[0], logstd[0] if logstd else None, action), out[1, :, 0])

    def loss_and_gradients(self, obs, actions, old_logprob, advantages, old_values, returns, **loss_kwargs) -> PPOLoss:
        """gae.ppo_loss of a minibatch, with its gradient left in the flat gradient buffer. Box actions take the
        analytic backward below; discrete actions (or self.analytic = False) take autograd through self.evaluate."""
        if not self.analytic:
            new_logprob, entropy, new_value = self.evaluate(obs, actions)
            stats = ppo_loss(
                new_logprob, old_logprob, advantages, new_value, old_values, returns, entropy, **loss_kwargs
            )
            self.zero_grad()
            stats.loss.backward()
            return stats
        with torch.no_grad():
            return self.analytic_backward(obs, actions, old_logprob, advantages, old_values, returns, loss_kwargs)

    def analytic_backward(self, obs, actions, old_logprob, advantages, old_values, returns, loss_kwargs) -> PPOLoss:
        """The forward pass of evaluate, keeping the hidden layers, then the chain rule written out: about 40 ops a
        minibatch against autograd's 150 (tests/test_ppo_continuous.py checks it against autograd)."""
        w1, b1, w2, b2, w3, b3, logstd = self.stacked
        x = obs.expand(2, *obs.shape)
        # tanh(u) = 2 sigmoid(2u) - 1, with the 2u from the matmul itself: torch's CPU tanh costs 3x its sigmoid
        h1 = torch.add(self.minus_one, torch.baddbmm(b1, x, w1.mT, beta=2.0, alpha=2.0).sigmoid_(), alpha=2.0)
        h2 = torch.add(self.minus_one, torch.baddbmm(b2, h1, w2.mT, beta=2.0, alpha=2.0).sigmoid_(), alpha=2.0)
        out = torch.baddbmm(b3, h2, w3.mT)
        inv_std, logstd_sum = torch.exp(-logstd), logstd.sum()
        z = (actions - out[0]) * inv_std  # the action's standardized noise
        z_squared = z * z
        new_logprob = z_squared.sum(1).mul_(-0.5).sub_(logstd_sum + logstd.shape[1] * LOG_SQRT_2PI)
        entropy = logstd_sum + logstd.shape[1] * (0.5 + LOG_SQRT_2PI)  # the same for every sample
        stats = ppo_loss(
            new_logprob, old_logprob, advantages, out[1, :, 0], old_values, returns, entropy, **loss_kwargs,
            with_grads=True,
        )  # fmt: skip
        gw1, gb1, gw2, gb2, gw3, gb3, glogstd = self.stacked_grads
        d_out = self.output_grad_buffer(len(obs))
        # d log pi / d mean = z / std and d log pi / d logstd = z^2 - 1, per sample; the entropy's d / d logstd is 1
        torch.mul(z * inv_std, stats.logprob_grad[:, None], out=d_out[0])
        d_out[1, :, 0] = stats.value_grad
        torch.mm(stats.logprob_grad[None], z_squared - 1.0, out=glogstd)
        if loss_kwargs.get("ent_coef"):
            glogstd.sub_(loss_kwargs["ent_coef"])
        for w, gw, gb, h_in in ((w3, gw3, gb3, h2), (w2, gw2, gb2, h1), (w1, gw1, gb1, None)):
            torch.bmm(d_out.mT, x if h_in is None else h_in, out=gw)
            torch.sum(d_out, 1, keepdim=True, out=gb)
            if h_in is not None:  # back through the layer and its tanh (d tanh(u) / du = 1 - tanh(u)^2)
                d_out = torch.bmm(d_out, w)
                d_out = torch.addcmul(d_out, d_out * h_in, h_in, value=-1.0)
        return stats

    def output_grad_buffer(self, rows: int) -> torch.Tensor:
        """(2, rows, out_dim) for d loss / d outputs of both nets; the critic's padded columns stay 0. One buffer per
        minibatch size (an update has at most two)."""
        if rows not in self.output_grads:
            self.output_grads[rows] = torch.zeros(2, rows, self.shapes[4][1], device=self.params.device)
        return self.output_grads[rows]

    def zero_grad(self) -> None:
        self.grads.zero_()

    def clip_grad_norm(self, max_norm: float) -> float:
        """nn.utils.clip_grad_norm_ on the flat gradient; returns the norm before clipping (one sync: the guard reads
        it anyway, and the clip coefficient is then a Python float rather than three more tensor ops)."""
        norm = torch.linalg.vector_norm(self.grads).item()
        if norm > max_norm:  # below it the coefficient clamps to 1; a NaN norm falls through to the caller's guard
            self.grads.mul_(max_norm / (norm + 1e-6))
        return norm

    def step(self) -> None:
        """One Adam step, as torch.optim.Adam computes it (Kingma & Ba 2015, with eps outside the square root)."""
        (beta1, beta2), self.steps = self.betas, self.steps + 1
        self.exp_avg.lerp_(self.grads, 1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(self.grads, self.grads, value=1 - beta2)
        # torch's sqrt(v) / sqrt(1 - beta2^t) + eps, with sqrt(1 - beta2^t) moved into the step size: one op less
        root_correction = np.sqrt(1 - beta2**self.steps)
        denom = self.exp_avg_sq.sqrt().add_(self.eps * root_correction)
        self.params.addcdiv_(self.exp_avg, denom, value=-self.lr * root_correction / (1 - beta1**self.steps))

    def state_dict(self) -> dict:
        """torch.optim.Adam's format, one entry per Agent parameter, so checkpoints stay readable by either."""
        moments = zip(self.agent_views(self.exp_avg), self.agent_views(self.exp_avg_sq))
        state = {i: dict(step=torch.tensor(float(self.steps)), exp_avg=m.clone(), exp_avg_sq=v.clone())
                 for i, (m, v) in enumerate(moments)} if self.steps else {}  # fmt: skip
        group = dict(lr=self.lr, betas=self.betas, eps=self.eps, params=list(range(len(self.agent_views(self.params)))))
        return {"state": state, "param_groups": [group]}

    def load_state_dict(self, saved: dict) -> None:
        self.lr, state = float(saved["param_groups"][0]["lr"]), saved["state"]
        views = list(zip(self.agent_views(self.exp_avg), self.agent_views(self.exp_avg_sq)))
        if state and len(state) != len(views):
            raise ValueError(f"the optimizer state holds {len(state)} parameters, this network {len(views)}")
        with torch.no_grad():
            for i, (m, v) in enumerate(views):
                m.copy_(state[i]["exp_avg"] if state else 0.0)
                v.copy_(state[i]["exp_avg_sq"] if state else 0.0)
        self.steps = int(state[0]["step"]) if state else 0
