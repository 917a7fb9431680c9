"""The math that ppo_continuous.py and dppo_ray.py share: GAE, the clipped PPO loss and its diagnostics, the running
statistics used to normalize observations and scale rewards, and the numerical guard's per-sample checks.

Every function here is a pure function of arrays (or a small running statistic) with a unit test against a
hand-computed or independent reference (tests/test_gae.py). The scripts call these; apart from those references in the
tests, nothing in the repository re-implements these formulas.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

LOG_SQRT_2PI = 0.5 * np.log(2.0 * np.pi)  # the Gaussian log-density's constant, per action dimension


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
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE(gamma, lambda) over a rollout of shape (T, N): T time steps of N parallel envs.

    `next_values[t]` is V of the *real* successor state of step t. For a step that was cut by the time limit this is
    V(final observation), so truncation bootstraps; a termination never does (its successor value is ignored). The
    backward recursion stops at every episode end, terminated or truncated, so advantages never leak across episodes.

    `valid` (bool, (T, N)) marks the samples the numerical guard kept. A masked sample gets advantage 0 and is cut out
    of the recursion like an episode end: the step before it bootstraps from `next_values` (like a time-limit cut)
    when that value is finite, and from nothing (like a termination) when it is not. Any other non-finite
    `next_values` entry is treated the same way, so NaN never reaches a kept sample.

    Returns (advantages, returns) with returns = advantages + values.
    """
    if not (rewards.shape == values.shape == next_values.shape == terminations.shape == truncations.shape):
        raise ValueError("compute_gae: all inputs must have the same (T, N) shape")
    # The recursion is inherently sequential in T; numpy float64 keeps it exact and is far cheaper per step than
    # launching torch ops on tiny tensors.
    r = rewards.detach().cpu().double().numpy()
    v = values.detach().cpu().double().numpy()
    nv = next_values.detach().cpu().double().numpy()
    term = terminations.detach().cpu().numpy().astype(bool)
    ended = term | truncations.detach().cpu().numpy().astype(bool)
    keep = np.ones(r.shape, dtype=bool) if valid is None else valid.detach().cpu().numpy().astype(bool)

    no_bootstrap = term | ~np.isfinite(nv)
    successor_masked = np.zeros_like(keep)
    successor_masked[:-1] = ~keep[1:]
    cut = ended | successor_masked | ~np.isfinite(nv) | ~keep
    with np.errstate(invalid="ignore"):  # masked samples may hold NaN or inf; they are zeroed just below
        deltas = r + gamma * np.where(no_bootstrap, 0.0, nv) - v
    deltas = np.where(keep, deltas, 0.0)
    decay = gamma * gae_lambda * (1.0 - cut)
    advantages = np.zeros_like(deltas)
    running = np.zeros_like(deltas[0])
    for t in reversed(range(deltas.shape[0])):
        running = deltas[t] + decay[t] * running
        advantages[t] = running
    advantages_t = torch.as_tensor(advantages, dtype=values.dtype, device=values.device)
    return advantages_t, advantages_t + torch.where(torch.as_tensor(keep, device=values.device), values, 0.0)


# ---------------------------------------------------------------------------------------------------------------------
# The clipped PPO objective
# ---------------------------------------------------------------------------------------------------------------------
class PPOLoss(NamedTuple):
    loss: torch.Tensor  # the scalar to minimize
    policy_loss: torch.Tensor
    value_loss: torch.Tensor
    entropy: torch.Tensor
    logratio: torch.Tensor  # log(pi_new / pi_old) per sample
    ratio: torch.Tensor
    clip_coef: float

    # The diagnostics are computed when read: the update reads them once per epoch, not once per minibatch.
    @property
    def old_approx_kl(self) -> torch.Tensor:  # mean(-log r), the naive KL estimator
        return (-self.logratio.detach()).mean()

    @property
    def approx_kl(self) -> torch.Tensor:  # mean((r - 1) - log r), the unbiased low-variance "k3" estimator
        return ((self.ratio.detach() - 1.0) - self.logratio.detach()).mean()

    @property
    def clipfrac(self) -> torch.Tensor:  # share of samples whose ratio left [1 - clip, 1 + clip]
        return ((self.ratio.detach() - 1.0).abs() > self.clip_coef).float().mean()


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
    max_is_weight: float = 100.0,
) -> PPOLoss:
    """Clipped surrogate + (optionally clipped) value loss - entropy bonus, for one minibatch.

    `old_logprob` is the policy the clip is anchored to. In plain PPO it is also the policy that collected the data.
    For stale data (dppo_ray.py --stale-correction decoupled) pass the collecting policy as `behaviour_logprob`: the
    objective becomes decoupled PPO (Hilton et al. 2021), in which w = pi_old / pi_behaviour, truncated at
    `max_is_weight` as in V-trace, corrects for the staleness and the clip stays anchored to the recent `old_logprob`.

    This is the one definition of the loss: every gradient, compiled or eager, is autograd's through it, so an edit
    here trains on every path.
    """
    if norm_adv and advantages.numel() > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)

    logratio = new_logprob - old_logprob
    ratio = logratio.exp()
    neg_advantages = -advantages
    unclipped = neg_advantages * ratio
    clipped = neg_advantages * ratio.clamp(1.0 - clip_coef, 1.0 + clip_coef)
    surrogate = torch.max(unclipped, clipped)
    if behaviour_logprob is not None:
        is_weight = (old_logprob - behaviour_logprob).exp().clamp(max=max_is_weight).detach()
        surrogate = surrogate * is_weight
    policy_loss = surrogate.mean()

    error = new_values - returns
    if clip_vloss:
        step = new_values - old_values
        step_clipped = step.clamp(-clip_coef, clip_coef)
        squared, squared_clipped = error**2, (old_values + step_clipped - returns) ** 2
        value_loss = 0.5 * torch.max(squared, squared_clipped).mean()
    else:
        value_loss = 0.5 * (error**2).mean()

    entropy_mean = entropy.mean()
    loss = policy_loss + vf_coef * value_loss
    if ent_coef:  # CleanRL's default is 0: no entropy term in the graph then (fewer ops per minibatch, same gradient)
        loss = loss - ent_coef * entropy_mean
    return PPOLoss(loss, policy_loss, value_loss, entropy_mean, logratio, ratio, clip_coef)


def mean_clipfrac(ratios: list[torch.Tensor], clip_coef: float) -> float:
    """The mean over minibatches of PPOLoss.clipfrac, from their ratios, in a few ops for the whole update."""
    with torch.no_grad():
        flags = ((torch.cat(ratios) - 1.0).abs() > clip_coef).float()
        sizes = torch.tensor([len(r) for r in ratios], device=flags.device)
        minibatch = torch.repeat_interleave(torch.arange(len(ratios), device=flags.device), sizes)
        per_minibatch = torch.zeros(len(ratios), device=flags.device).index_add_(0, minibatch, flags) / sizes
        return per_minibatch.mean().item()


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

    The same merge combines statistics gathered by several processes (dppo_ray.py's actors send their moments)."""

    def __init__(self, shape: tuple[int, ...] = (), epsilon: float = 1e-4):
        self.mean = np.zeros(shape, dtype=np.float64)
        self.var = np.ones(shape, dtype=np.float64)
        # A tiny prior count keeps the first merge well defined, as in OpenAI baselines and gymnasium.
        self.count = epsilon

    def update(self, batch: np.ndarray) -> None:
        """Merge a batch of shape (B, *shape). Rows containing NaN or inf are left out, so one bad observation
        cannot poison the statistics for the rest of the run."""
        self.update_from_moments(*finite_moments(batch))

    def update_from_moments(self, batch_mean: np.ndarray, batch_var: np.ndarray, batch_count: float) -> None:
        """Merge moments computed elsewhere. Moments that are not finite are refused as a whole, so a process that
        did not filter its data cannot poison the statistics either."""
        if batch_count <= 0 or not (np.isfinite(batch_mean).all() and np.isfinite(batch_var).all()):
            return
        delta = batch_mean - self.mean
        total = self.count + batch_count
        self.mean = self.mean + delta * batch_count / total
        m2 = self.var * self.count + batch_var * batch_count + delta**2 * self.count * batch_count / total
        self.var = m2 / total
        self.count = total

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


def running_std(var: np.ndarray, epsilon: float = 1e-8) -> np.ndarray:
    """The std that a running variance normalizes by: sqrt(var + epsilon), where epsilon keeps an entry that never
    varied (var 0) from dividing by zero."""
    return np.sqrt(var + epsilon)


def finite_moments(batch: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """(mean, variance, count) over the rows of `batch` (shape (B, *shape)) that hold no NaN or inf."""
    batch = np.asarray(batch, dtype=np.float64)
    if not np.isfinite(batch).all():
        batch = batch[np.isfinite(batch.reshape(batch.shape[0], -1)).all(axis=1)]
    count = batch.shape[0]
    if count == 0:
        return np.zeros(batch.shape[1:]), np.zeros(batch.shape[1:]), 0
    # sum/count rather than np.mean/np.var: the Python wrappers of those cost more than the arithmetic here.
    mean = batch.sum(axis=0) / count
    return mean, np.square(batch - mean).sum(axis=0) / count, count


def normalize_obs(
    raw: np.ndarray,
    mean: np.ndarray | None,
    std: np.ndarray | None,
    clip: float,
    out: np.ndarray | None = None,
    fill: float = np.nan,
) -> np.ndarray:
    """(raw - mean) / std, clipped, as float32 (into `out` if given); None statistics leave the observation raw. A row
    holding NaN or inf becomes all `fill`: NaN for the guard to mask, 0 for the policy to act on. (minimum/maximum:
    np.clip's Python wrapper costs more than the arithmetic, and this runs every env step.)"""
    x = np.empty(raw.shape, np.float32) if out is None else out
    if mean is None:
        x[...] = raw
    else:
        np.divide(raw - mean, std, out=x, casting="same_kind")  # in float64, then rounded once
        np.minimum(np.maximum(x, -clip, out=x), clip, out=x)
    finite = np.isfinite(raw)
    if not finite.all():
        x[~finite.all(axis=-1)] = fill
    return x


class DiscountedReturn:
    """The running discounted return of each env, whose variance scales the rewards (Engstrom et al. 2020; CleanRL's
    NormalizeReward). It restarts after every episode end, terminated or truncated, and after a non-finite reward,
    which must not poison the episodes that follow. It lives with the envs (the sampler), so that it runs on without
    a gap whichever rollouts the learner keeps."""

    def __init__(self, num_envs: int, gamma: float):
        self.value = np.zeros(num_envs, dtype=np.float64)
        self.gamma = gamma

    def step(self, rewards: np.ndarray, episode_ended: np.ndarray) -> np.ndarray:
        """Take one step of rewards (N,); return the discounted returns before the restart."""
        self.value = self.value * self.gamma + rewards
        returns = self.value.copy()
        self.value[episode_ended | ~np.isfinite(self.value)] = 0.0
        return returns

    def run(self, rewards: np.ndarray, episode_ended: np.ndarray) -> np.ndarray:
        """`step` over a rollout's (T, N) rewards; returns (T, N)."""
        return np.stack([self.step(r, e) for r, e in zip(rewards, episode_ended)])


def scale_rewards(rewards: np.ndarray, return_rms: RunningMeanStd, clip: float, epsilon: float = 1e-8) -> np.ndarray:
    """Divide by the std of the discounted return, then clip to +-clip."""
    return np.clip(rewards / running_std(return_rms.var, epsilon), -clip, clip)


# ---------------------------------------------------------------------------------------------------------------------
# The numerical guard: drop bad samples, skip a batch only when little of it is usable
# ---------------------------------------------------------------------------------------------------------------------
def finite_samples(observations: np.ndarray, actions: np.ndarray, rewards: np.ndarray) -> np.ndarray:
    """Bool mask (T, N): the transitions whose observation, action and reward are all finite.
    observations (T, N, obs_dim), actions (T, N[, act_dim]), rewards (T, N)."""
    flat = observations.reshape(*rewards.shape, -1)
    ok = np.isfinite(flat).all(axis=-1) & np.isfinite(rewards)
    return ok & np.isfinite(actions.reshape(*rewards.shape, -1)).all(axis=-1)


def advantage_outliers(
    advantages: np.ndarray, returns: np.ndarray, valid: np.ndarray, max_abs: float, mad_factor: float = 1000.0
) -> np.ndarray:
    """Bool mask of the valid samples to drop: a non-finite advantage or return, a magnitude above `max_abs`, or an
    advantage more than `mad_factor` median absolute deviations from the median of the valid advantages (a robust
    scale that the outliers themselves cannot inflate, unlike the std). With a zero MAD only the absolute bound
    applies."""
    bad = valid & ~(np.isfinite(advantages) & np.isfinite(returns))
    bad |= valid & ~bad & ((np.abs(advantages) > max_abs) | (np.abs(returns) > max_abs))
    kept = advantages[valid & ~bad]
    if kept.size:
        median = np.median(kept)
        mad = np.median(np.abs(kept - median))
        if mad > 0:
            bad |= valid & ~bad & (np.abs(advantages - median) > mad_factor * mad)
    return bad


def too_few_samples(kept: int, size: int) -> str | None:
    """Why a batch of `size` samples is skipped when only `kept` are usable: under half of it; None otherwise."""
    if kept < size / 2:
        return f"only {kept} of {size} samples are usable (NaN/inf data or outlier advantages)"
    return None


def bad_step(loss: float, grad_norm: float, max_abs: float, epoch: int) -> str | None:
    """Why a minibatch's step must not be taken: a non-finite loss or one above `max_abs`, or a non-finite gradient
    norm, in words naming the epoch (counted from 0); None when the step may be taken."""
    if not math.isfinite(loss) or abs(loss) > max_abs:
        return f"loss {loss:.3g} in epoch {epoch + 1}"
    if not math.isfinite(grad_norm):
        return f"non-finite gradient in epoch {epoch + 1}"
    return None


def finished_episodes(
    rewards: np.ndarray, ended: np.ndarray, running_returns: np.ndarray, running_lengths: np.ndarray
) -> tuple[list[float], list[int]]:
    """Return and length of every episode that ended in a rollout ((steps, envs) rewards and ends), in the order they
    ended. `running_returns` and `running_lengths` (one per env, updated in place) carry the unfinished episodes' sums
    from one rollout to the next. (Once per rollout rather than two array updates per step.)"""
    returns, lengths = [], []
    start = np.zeros(rewards.shape[1], np.int64)
    for step, i in zip(*np.nonzero(ended)):
        returns.append(running_returns[i] + rewards[start[i] : step + 1, i].sum())
        lengths.append(running_lengths[i] + step + 1 - start[i])
        running_returns[i] = 0.0
        running_lengths[i] = 0
        start[i] = step + 1
    running_returns += [rewards[first:, i].sum() for i, first in enumerate(start)]
    running_lengths += len(rewards) - start
    return returns, lengths
