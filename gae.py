"""The math that ppo_continuous.py and dppo_ray.py share: GAE, the clipped PPO loss and its diagnostics,
and the running statistics used to normalize observations and scale rewards.

Every function here has a unit test against a hand-computed or independent reference (tests/test_gae.py).
Nothing else in the repository re-implements these formulas.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch


# ---------------------------------------------------------------------------------------------------------------------
# Generalized Advantage Estimation
# ---------------------------------------------------------------------------------------------------------------------
def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminations: torch.Tensor,
    truncations: torch.Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE(gamma, lambda) over a rollout of shape (T, N): T time steps of N parallel envs.

    `next_values[t]` is V of the *real* successor state of step t. For a step that was cut by the time limit this is
    V(final observation), so truncation bootstraps; a termination never does (its successor value is ignored). The
    backward recursion stops at every episode end, terminated or truncated, so advantages never leak across episodes.

    Returns (advantages, returns) with returns = advantages + values.
    """
    if not (rewards.shape == values.shape == next_values.shape == terminations.shape == truncations.shape):
        raise ValueError("compute_gae: all inputs must have the same (T, N) shape")
    # The recursion is inherently sequential in T; numpy float64 keeps it exact and is ~10x cheaper per step than
    # launching torch ops on tiny tensors.
    r = rewards.detach().cpu().double().numpy()
    v = values.detach().cpu().double().numpy()
    nv = next_values.detach().cpu().double().numpy()
    term = terminations.detach().cpu().double().numpy()
    episode_ended = np.maximum(term, truncations.detach().cpu().double().numpy())

    deltas = r + gamma * nv * (1.0 - term) - v
    decay = gamma * gae_lambda * (1.0 - episode_ended)
    advantages = np.zeros_like(deltas)
    running = np.zeros_like(deltas[0])
    for t in reversed(range(deltas.shape[0])):
        running = deltas[t] + decay[t] * running
        advantages[t] = running
    advantages_t = torch.as_tensor(advantages, dtype=values.dtype, device=values.device)
    return advantages_t, advantages_t + values


# ---------------------------------------------------------------------------------------------------------------------
# The clipped PPO objective
# ---------------------------------------------------------------------------------------------------------------------
class PPOLoss(NamedTuple):
    loss: torch.Tensor  # the scalar to minimize
    policy_loss: torch.Tensor
    value_loss: torch.Tensor
    entropy: torch.Tensor
    old_approx_kl: torch.Tensor  # mean(-log r), the naive KL estimator
    approx_kl: torch.Tensor  # mean((r - 1) - log r), the unbiased low-variance "k3" estimator
    clipfrac: torch.Tensor  # share of samples whose ratio left [1 - clip, 1 + clip]


def ppo_loss(
    new_logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    new_values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    entropy: torch.Tensor,
    *,
    clip_coef: float,
    clip_vloss: bool,
    ent_coef: float,
    vf_coef: float,
    norm_adv: bool = True,
    behaviour_logprob: torch.Tensor | None = None,
    max_is_weight: float = 1.0,
) -> PPOLoss:
    """Clipped surrogate + (optionally clipped) value loss - entropy bonus, for one minibatch.

    `old_logprob` is the policy the clip is anchored to. In plain PPO it is also the policy that collected the data.
    For stale data (dppo_ray.py --stale-correction decoupled) pass the collecting policy as `behaviour_logprob`: the
    objective becomes decoupled PPO (Hilton et al. 2021), in which w = pi_old / pi_behaviour, truncated at
    `max_is_weight` as in V-trace, corrects for the staleness and the clip stays anchored to the recent `old_logprob`.
    """
    if norm_adv and advantages.numel() > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)

    logratio = new_logprob - old_logprob
    ratio = logratio.exp()
    surrogate = torch.max(-advantages * ratio, -advantages * ratio.clamp(1.0 - clip_coef, 1.0 + clip_coef))
    if behaviour_logprob is not None:
        is_weight = (old_logprob - behaviour_logprob).exp().clamp(max=max_is_weight)
        surrogate = surrogate * is_weight.detach()
    policy_loss = surrogate.mean()

    if clip_vloss:
        values_clipped = old_values + (new_values - old_values).clamp(-clip_coef, clip_coef)
        value_loss = 0.5 * torch.max((new_values - returns) ** 2, (values_clipped - returns) ** 2).mean()
    else:
        value_loss = 0.5 * ((new_values - returns) ** 2).mean()

    entropy_mean = entropy.mean()
    loss = policy_loss - ent_coef * entropy_mean + vf_coef * value_loss

    with torch.no_grad():
        old_approx_kl = (-logratio).mean()
        approx_kl = ((ratio - 1.0) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > clip_coef).float().mean()
    return PPOLoss(loss, policy_loss, value_loss, entropy_mean, old_approx_kl, approx_kl, clipfrac)


def explained_variance(y_pred: np.ndarray, y_true: np.ndarray) -> float:
    """1 - Var[y_true - y_pred] / Var[y_true]: 1 is a perfect value function, 0 is no better than a constant,
    negative is worse than a constant. NaN when the targets have no variance."""
    var_true = np.var(y_true)
    return float("nan") if var_true == 0 else float(1.0 - np.var(y_true - y_pred) / var_true)


# ---------------------------------------------------------------------------------------------------------------------
# Running statistics for normalization (part of the policy: saved in checkpoints, frozen at evaluation)
# ---------------------------------------------------------------------------------------------------------------------
class RunningMeanStd:
    """Mean and variance of a stream of vectors, merged batch by batch with Chan et al.'s parallel formula.

    The same merge combines statistics gathered by several processes (dppo_ray.py's actors send their deltas)."""

    def __init__(self, shape: tuple[int, ...] = (), epsilon: float = 1e-4):
        self.mean = np.zeros(shape, dtype=np.float64)
        self.var = np.ones(shape, dtype=np.float64)
        # A tiny prior count keeps the first merge well defined, as in OpenAI baselines and gymnasium.
        self.count = epsilon

    def update(self, batch: np.ndarray) -> None:
        """Merge a batch of shape (B, *shape). Rows containing NaN or inf are left out, so one bad observation
        cannot poison the statistics for the rest of the run."""
        batch = np.asarray(batch, dtype=np.float64)
        if not np.isfinite(batch).all():
            batch = batch[np.isfinite(batch.reshape(batch.shape[0], -1)).all(axis=1)]
        count = batch.shape[0]
        if count > 0:
            # sum/count rather than np.mean/np.var: this runs every env step, and their Python wrappers cost more
            # than the arithmetic on these small arrays.
            batch_mean = batch.sum(axis=0) / count
            self.update_from_moments(batch_mean, np.square(batch - batch_mean).sum(axis=0) / count, count)

    def update_from_moments(self, batch_mean: np.ndarray, batch_var: np.ndarray, batch_count: float) -> None:
        if batch_count <= 0:
            return
        delta = batch_mean - self.mean
        total = self.count + batch_count
        self.mean = self.mean + delta * batch_count / total
        m2 = self.var * self.count + batch_var * batch_count + delta**2 * self.count * batch_count / total
        self.var = m2 / total
        self.count = total

    def normalize(self, x: np.ndarray, clip: float, epsilon: float = 1e-8) -> np.ndarray:
        return np.clip((x - self.mean) / np.sqrt(self.var + epsilon), -clip, clip)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Tensors only, so that checkpoints load with torch.load(weights_only=True)."""
        return {
            "mean": torch.from_numpy(np.array(self.mean, dtype=np.float64)),
            "var": torch.from_numpy(np.array(self.var, dtype=np.float64)),
            "count": torch.tensor(self.count, dtype=torch.float64),
        }

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        mean, var = state["mean"].double().numpy(), state["var"].double().numpy()
        if mean.shape != self.mean.shape or var.shape != self.var.shape:
            raise ValueError(f"normalizer shape {tuple(mean.shape)} does not match {tuple(self.mean.shape)}")
        self.mean, self.var, self.count = mean.copy(), var.copy(), float(state["count"])


class RewardScaler:
    """Divides rewards by the running std of the discounted return, as in the PPO implementation details
    (Engstrom et al. 2020; CleanRL's NormalizeReward), then clips. The return accumulator restarts after every
    episode end, terminated or truncated."""

    def __init__(self, num_envs: int, gamma: float, clip: float = 10.0, epsilon: float = 1e-8):
        self.return_rms = RunningMeanStd(shape=())
        self.discounted_return = np.zeros(num_envs, dtype=np.float64)
        self.gamma, self.clip, self.epsilon = gamma, clip, epsilon

    def __call__(self, rewards: np.ndarray, episode_ended: np.ndarray, update: bool = True) -> np.ndarray:
        """Scale a rollout of rewards of shape (T, N) (or one step, shape (N,)). The statistics first take in the
        discounted returns of the whole rollout, then every reward of it is divided by the same std."""
        rewards = np.asarray(rewards, dtype=np.float64)
        steps, ended = np.atleast_2d(rewards), np.atleast_2d(episode_ended)
        returns = np.empty_like(steps)
        for t in range(steps.shape[0]):
            self.discounted_return = self.discounted_return * self.gamma + steps[t]
            returns[t] = self.discounted_return
            # A non-finite reward passes through (the numerical guard rejects its batch) but must not poison the
            # statistics of the episodes that follow.
            self.discounted_return[ended[t] | ~np.isfinite(self.discounted_return)] = 0.0
        if update:
            self.return_rms.update(returns.reshape(-1))  # skips non-finite entries
        return np.clip(rewards / np.sqrt(self.return_rms.var + self.epsilon), -self.clip, self.clip)
