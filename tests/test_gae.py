"""Unit tests for gae.py against hand-computed numbers and independent plain-Python references."""

from __future__ import annotations

import io
import math
import sys

import numpy as np
import pytest
import torch

from tests.conftest import REPO

sys.path.insert(0, str(REPO))  # gae.py lives at the repository root

from gae import (
    DiscountedReturn,
    RunningMeanStd,
    advantage_outliers,
    bad_step,
    compute_gae,
    explained_variance,
    finished_episodes,
    finite_moments,
    finite_samples,
    mean_clipfrac,
    normalize_obs,
    ppo_loss,
    scale_rewards,
    too_few_samples,
)
from run_management import health_warnings  # the advice Monitor prints; tested here with the math it reads

GAMMA, LAM = 0.9, 0.8  # gamma * lambda = 0.72


def col(xs, dtype=torch.float64):
    """A (T, 1) tensor from a list of T numbers."""
    return torch.tensor(xs, dtype=dtype).reshape(-1, 1)


def gae(r, v, nv, term, trunc, gamma=GAMMA, lam=LAM):
    return compute_gae(r, v, nv, term, trunc, gamma, lam)


# =====================================================================================================================
# compute_gae: hand-computed cases
# =====================================================================================================================
# Shared T=4, N=1 rollout for cases (a) and (b):
#   rewards     = [1.0, 0.0, 2.0, 1.0]
#   values      = [0.5, 1.0, 0.0, 2.0]
#   next_values = [1.0, 5.0, 2.0, 3.0]   (nv[0] = v[1], nv[2] = v[3]; nv[1] = 5 is V of step 1's real successor)
R4 = [1.0, 0.0, 2.0, 1.0]
V4 = [0.5, 1.0, 0.0, 2.0]
NV4 = [1.0, 5.0, 2.0, 3.0]


def test_gae_termination_mid_rollout():
    # Termination at t=1: no bootstrap at t=1, and the recursion stops there.
    #   d0 = 1 + 0.9*1.0 - 0.5 = 1.4
    #   d1 = 0 + 0 (terminated) - 1.0 = -1.0
    #   d2 = 2 + 0.9*2.0 - 0.0 = 3.8
    #   d3 = 1 + 0.9*3.0 - 2.0 = 1.7
    #   A3 = 1.7
    #   A2 = 3.8 + 0.72*1.7 = 5.024
    #   A1 = -1.0                        (episode end: nothing from t=2 leaks in)
    #   A0 = 1.4 + 0.72*(-1.0) = 0.68    (same episode as t=1)
    #   returns = A + V = [1.18, 0.0, 5.024, 3.7]
    adv, ret = gae(col(R4), col(V4), col(NV4), col([0, 1, 0, 0]), col([0, 0, 0, 0]))
    torch.testing.assert_close(adv, col([0.68, -1.0, 5.024, 1.7]))
    torch.testing.assert_close(ret, col([1.18, 0.0, 5.024, 3.7]))


def test_gae_termination_ignores_successor_value():
    # Whatever next_values holds at a terminated step, it must not matter.
    term, trunc = col([0, 1, 0, 0]), col([0, 0, 0, 0])
    a1, _ = gae(col(R4), col(V4), col(NV4), term, trunc)
    a2, _ = gae(col(R4), col(V4), col([1.0, -1234.0, 2.0, 3.0]), term, trunc)
    torch.testing.assert_close(a1, a2, rtol=0, atol=0)


def test_gae_truncation_mid_rollout():
    # Truncation at t=1: bootstraps from nv[1] = V(final obs) = 5, but the recursion still stops there.
    #   d1 = 0 + 0.9*5.0 - 1.0 = 3.5     (other deltas as in the termination case)
    #   A3 = 1.7
    #   A2 = 5.024
    #   A1 = 3.5                         (t=2 starts a new episode: A2 does not leak into A1)
    #   A0 = 1.4 + 0.72*3.5 = 3.92       (t=0 is in the same episode as t=1, so it does get A1)
    #   returns = [4.42, 4.5, 5.024, 3.7]
    adv, ret = gae(col(R4), col(V4), col(NV4), col([0, 0, 0, 0]), col([0, 1, 0, 0]))
    torch.testing.assert_close(adv, col([3.92, 3.5, 5.024, 1.7]))
    torch.testing.assert_close(ret, col([4.42, 4.5, 5.024, 3.7]))


def test_gae_truncation_bootstrap_value_matters():
    # d(A1)/d(nv[1]) = gamma, d(A0)/d(nv[1]) = gamma * gamma*lambda, later steps unaffected.
    trunc, term = col([0, 1, 0, 0]), col([0, 0, 0, 0])
    a1, _ = gae(col(R4), col(V4), col(NV4), term, trunc)
    a2, _ = gae(col(R4), col(V4), col([1.0, 6.0, 2.0, 3.0]), term, trunc)
    torch.testing.assert_close(a2 - a1, col([0.9 * 0.72, 0.9, 0.0, 0.0]))


def test_gae_termination_and_truncation_at_last_step_two_envs():
    # T=3, N=2. Both envs share rewards/values/next_values; env 0 terminates at t=2, env 1 is truncated at t=2.
    #   r = [1, 2, 3], v = [1, 1, 1], nv = [1, 1, 10]
    #   d0 = 1 + 0.9*1 - 1 = 0.9, d1 = 2 + 0.9*1 - 1 = 1.9 for both envs
    # env 0 (terminated): d2 = 3 + 0 - 1 = 2
    #   A2 = 2, A1 = 1.9 + 0.72*2 = 3.34, A0 = 0.9 + 0.72*3.34 = 3.3048
    # env 1 (truncated):  d2 = 3 + 0.9*10 - 1 = 11
    #   A2 = 11, A1 = 1.9 + 0.72*11 = 9.82, A0 = 0.9 + 0.72*9.82 = 7.9704
    r = torch.tensor([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]], dtype=torch.float64)
    v = torch.ones(3, 2, dtype=torch.float64)
    nv = torch.tensor([[1.0, 1.0], [1.0, 1.0], [10.0, 10.0]], dtype=torch.float64)
    term = torch.tensor([[0, 0], [0, 0], [1, 0]], dtype=torch.float64)
    trunc = torch.tensor([[0, 0], [0, 0], [0, 1]], dtype=torch.float64)
    adv, ret = gae(r, v, nv, term, trunc)
    expected = torch.tensor([[3.3048, 7.9704], [3.34, 9.82], [2.0, 11.0]], dtype=torch.float64)
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected + 1.0)


def test_gae_no_episode_end_bootstraps_from_last_next_value():
    # T=3, N=1, no ends. r = [1, 0, 1], v = [0.5, 0.5, 0.5], nv = [0.5, 0.5, 2.0]
    #   d0 = 1 + 0.45 - 0.5 = 0.95
    #   d1 = 0 + 0.45 - 0.5 = -0.05
    #   d2 = 1 + 0.9*2.0 - 0.5 = 2.3
    #   A2 = 2.3, A1 = -0.05 + 0.72*2.3 = 1.606, A0 = 0.95 + 0.72*1.606 = 2.10632
    zeros = col([0, 0, 0])
    adv, ret = gae(col([1.0, 0.0, 1.0]), col([0.5, 0.5, 0.5]), col([0.5, 0.5, 2.0]), zeros, zeros)
    torch.testing.assert_close(adv, col([2.10632, 1.606, 2.3]))
    torch.testing.assert_close(ret, col([2.60632, 2.106, 2.8]))
    # Raising nv[-1] by 1 raises A_t by gamma * (gamma*lambda)^(2-t): [0.9*0.72^2, 0.9*0.72, 0.9]
    adv2, _ = gae(col([1.0, 0.0, 1.0]), col([0.5, 0.5, 0.5]), col([0.5, 0.5, 3.0]), zeros, zeros)
    torch.testing.assert_close(adv2 - adv, col([0.46656, 0.648, 0.9]))


def test_gae_terminated_and_truncated_same_step_does_not_bootstrap():
    # A step flagged both terminated and truncated is terminal: no bootstrap. d0 = 1 - 0.5 = 0.5
    adv, _ = gae(col([1.0]), col([0.5]), col([100.0]), col([1]), col([1]))
    torch.testing.assert_close(adv, col([0.5]))


# =====================================================================================================================
# compute_gae: independent reference on random data
# =====================================================================================================================
def reference_gae(r, v, nv, term, trunc, gamma, lam):
    """A_t = sum_{k=0}^{K} (gamma*lambda)^k delta_{t+k}, K = steps to the first episode end at or after t
    (or to the end of the rollout). Plain Python floats, nested lists."""
    T, N = len(r), len(r[0])
    adv = [[0.0] * N for _ in range(T)]
    for n in range(N):
        deltas = []
        for t in range(T):
            boot = 0.0 if term[t][n] else gamma * nv[t][n]
            deltas.append(r[t][n] + boot - v[t][n])
        for t in range(T):
            total, weight = 0.0, 1.0
            for s in range(t, T):
                total += weight * deltas[s]
                if term[s][n] or trunc[s][n]:
                    break
                weight *= gamma * lam
            adv[t][n] = total
    ret = [[adv[t][n] + v[t][n] for n in range(N)] for t in range(T)]
    return adv, ret


def reference_lambda_return(r, v, nv, term, trunc, gamma, lam):
    """The lambda-return form, computed forward per step:
    G_t^lambda = (1-lambda) sum_{n>=1} lambda^{n-1} G_t^(n) + tail, with n-step returns G_t^(n) truncated at the
    episode end (the last available n-step return takes the remaining weight). Assumes nv[t] = v[t+1] inside an
    episode, which is what makes it equal to GAE."""
    T, N = len(r), len(r[0])
    out = [[0.0] * N for _ in range(T)]
    for n in range(N):
        for t in range(T):
            # n-step returns G_t^(k), k = 1..K, K = steps to episode end or to rollout end
            nstep, disc_reward, disc = [], 0.0, 1.0
            for s in range(t, T):
                disc_reward += disc * r[s][n]
                disc *= gamma
                ended = term[s][n] or trunc[s][n]
                boot = 0.0 if term[s][n] else disc * nv[s][n]
                nstep.append(disc_reward + boot)
                if ended:
                    break
            K = len(nstep)
            g = sum((1 - lam) * lam ** (k - 1) * nstep[k - 1] for k in range(1, K)) + lam ** (K - 1) * nstep[K - 1]
            out[t][n] = g
    return out


def random_rollout(seed, T=37, N=5, p_term=0.06, p_trunc=0.06, consistent=True):
    rng = np.random.default_rng(seed)
    r = rng.normal(size=(T, N))
    v = rng.normal(size=(T, N))
    term = rng.random((T, N)) < p_term
    trunc = rng.random((T, N)) < p_trunc
    nv = rng.normal(size=(T, N))  # successor values; where consistent, copy v[t+1] inside an episode
    if consistent:
        for t in range(T - 1):
            for n in range(N):
                if not (term[t, n] or trunc[t, n]):
                    nv[t, n] = v[t + 1, n]
    return r, v, nv, term, trunc


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.9, 0.8), (0.5, 0.3)])
def test_gae_matches_explicit_sum_reference(seed, gamma, lam):
    r, v, nv, term, trunc = random_rollout(seed, consistent=False)
    assert term.any() and trunc.any() and (term & trunc).sum() >= 0
    adv, ret = compute_gae(
        torch.tensor(r, dtype=torch.float32),
        torch.tensor(v, dtype=torch.float32),
        torch.tensor(nv, dtype=torch.float32),
        torch.tensor(term),
        torch.tensor(trunc),
        gamma,
        lam,
    )
    ref_adv, ref_ret = reference_gae(r.tolist(), v.tolist(), nv.tolist(), term.tolist(), trunc.tolist(), gamma, lam)
    np.testing.assert_allclose(adv.numpy(), np.array(ref_adv), atol=1e-5, rtol=0)
    np.testing.assert_allclose(ret.numpy(), np.array(ref_ret), atol=1e-5, rtol=0)


@pytest.mark.parametrize("seed", range(4))
def test_gae_returns_match_lambda_return_reference(seed):
    gamma, lam = 0.97, 0.9
    r, v, nv, term, trunc = random_rollout(seed + 100, consistent=True)
    _, ret = compute_gae(*(torch.tensor(x, dtype=torch.float64) for x in (r, v, nv, term, trunc)), gamma, lam)
    ref = reference_lambda_return(r.tolist(), v.tolist(), nv.tolist(), term.tolist(), trunc.tolist(), gamma, lam)
    np.testing.assert_allclose(ret.numpy(), np.array(ref), atol=1e-5, rtol=0)


def test_gae_episode_end_flags_per_env_are_independent():
    # An end in env 0 must not affect env 1.
    r, v, nv, term, trunc = random_rollout(7, T=10, N=2, p_term=0.0, p_trunc=0.0)

    def t(x):
        return torch.tensor(x, dtype=torch.float64)

    adv_a, _ = compute_gae(t(r), t(v), t(nv), t(term), t(trunc), 0.9, 0.8)
    term[4, 0] = True
    adv_b, _ = compute_gae(t(r), t(v), t(nv), t(term), t(trunc), 0.9, 0.8)
    torch.testing.assert_close(adv_a[:, 1], adv_b[:, 1], rtol=0, atol=0)
    assert not torch.allclose(adv_a[:5, 0], adv_b[:5, 0])
    torch.testing.assert_close(adv_a[5:, 0], adv_b[5:, 0], rtol=0, atol=0)


# =====================================================================================================================
# compute_gae: gamma / lambda edge cases
# =====================================================================================================================
@pytest.mark.parametrize("seed", range(3))
def test_gae_lambda_zero_is_one_step_td(seed):
    gamma = 0.9
    r, v, nv, term, trunc = random_rollout(seed, p_term=0.2, p_trunc=0.2, consistent=False)
    adv, ret = compute_gae(*(torch.tensor(x, dtype=torch.float64) for x in (r, v, nv, term, trunc)), gamma, 0.0)
    td = r + gamma * nv * (~term) - v
    np.testing.assert_allclose(adv.numpy(), td, atol=1e-12)
    np.testing.assert_allclose(ret.numpy(), r + gamma * nv * (~term), atol=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_gae_lambda_one_no_ends_is_monte_carlo_plus_bootstrap(seed):
    gamma = 0.95
    r, v, nv, term, trunc = random_rollout(seed, T=20, N=3, p_term=0.0, p_trunc=0.0, consistent=True)
    adv, ret = compute_gae(*(torch.tensor(x, dtype=torch.float64) for x in (r, v, nv, term, trunc)), gamma, 1.0)
    T = r.shape[0]
    for t in range(T):
        mc = sum(gamma ** (k - t) * r[k] for k in range(t, T)) + gamma ** (T - t) * nv[T - 1]
        np.testing.assert_allclose(ret[t].numpy(), mc, atol=1e-10)
        np.testing.assert_allclose(adv[t].numpy(), mc - v[t], atol=1e-10)


def test_gae_gamma_zero_is_reward_minus_value():
    r, v, nv, term, trunc = random_rollout(3, p_term=0.1, p_trunc=0.1, consistent=False)
    adv, _ = compute_gae(*(torch.tensor(x, dtype=torch.float64) for x in (r, v, nv, term, trunc)), 0.0, 0.95)
    np.testing.assert_allclose(adv.numpy(), r - v, atol=1e-12)


# =====================================================================================================================
# compute_gae: validation, dtype, device
# =====================================================================================================================
@pytest.mark.parametrize("which", range(5))
@pytest.mark.parametrize("bad_shape", [(4, 3), (4, 1), (1, 2), (4,)])  # the last three would silently broadcast
def test_gae_shape_mismatch_raises(which, bad_shape):
    args = [torch.zeros(4, 2) for _ in range(5)]
    args[which] = torch.zeros(bad_shape)
    with pytest.raises(ValueError, match="same"):
        compute_gae(*args, 0.99, 0.95)


def test_gae_transposed_shape_raises():
    args = [torch.zeros(4, 2) for _ in range(4)] + [torch.zeros(2, 4)]
    with pytest.raises(ValueError):
        compute_gae(*args, 0.99, 0.95)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gae_output_dtype_and_device_follow_values(dtype):
    r, v, nv, term, trunc = random_rollout(0, T=6, N=2)
    adv, ret = compute_gae(
        torch.tensor(r, dtype=torch.float64),  # deliberately different from values' dtype
        torch.tensor(v, dtype=dtype),
        torch.tensor(nv, dtype=torch.float64),
        torch.tensor(term),  # bool flags are accepted
        torch.tensor(trunc).float(),
        0.9,
        0.8,
    )
    assert adv.dtype == dtype and ret.dtype == dtype
    assert adv.device == ret.device == torch.device("cpu")
    assert adv.shape == ret.shape == (6, 2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gae_cuda_output_on_values_device():
    r, v, nv, term, trunc = random_rollout(0, T=6, N=2)
    cpu = [torch.tensor(x, dtype=torch.float32) for x in (r, v, nv, term, trunc)]
    adv_cpu, ret_cpu = compute_gae(*cpu, 0.9, 0.8)
    adv, ret = compute_gae(*(x.cuda() for x in cpu), 0.9, 0.8)
    assert adv.is_cuda and ret.is_cuda
    torch.testing.assert_close(adv.cpu(), adv_cpu)
    torch.testing.assert_close(ret.cpu(), ret_cpu)


def test_gae_does_not_modify_inputs():
    r, v, nv, term, trunc = random_rollout(1, T=8, N=3)
    tensors = [torch.tensor(x, dtype=torch.float32) for x in (r, v, nv, term, trunc)]
    copies = [x.clone() for x in tensors]
    compute_gae(*tensors, 0.9, 0.8)
    for a, b in zip(tensors, copies, strict=True):
        assert torch.equal(a, b)


# =====================================================================================================================
# ppo_loss
# =====================================================================================================================
def loss_kwargs(**over):
    kw = {"clip_coef": 0.2, "clip_vloss": False, "ent_coef": 0.0, "vf_coef": 0.5, "norm_adv": False}
    kw.update(over)
    return kw


def zeros_like_values(B):
    z = torch.zeros(B, dtype=torch.float64)
    return {"new_values": z, "old_values": z, "returns": z, "entropy": z}


@pytest.mark.parametrize("norm_adv", [False, True])
def test_ppo_ratio_one_first_minibatch(norm_adv):
    B = 8
    g = torch.Generator().manual_seed(0)
    old = torch.randn(B, generator=g, dtype=torch.float64)
    new = old.clone().requires_grad_(True)
    adv = torch.randn(B, generator=g, dtype=torch.float64) + 0.7
    out = ppo_loss(new, old, adv, **zeros_like_values(B), **loss_kwargs(norm_adv=norm_adv))
    assert out.clipfrac.item() == 0.0
    assert out.approx_kl.item() == 0.0
    assert out.old_approx_kl.item() == 0.0
    if norm_adv:
        a = (adv - adv.mean()) / (adv.std() + 1e-8)
        assert abs(out.policy_loss.item()) < 1e-12
    else:
        a = adv
        assert out.policy_loss.item() == pytest.approx(-adv.mean().item(), abs=1e-12)
    torch.testing.assert_close(out.policy_loss, -a.mean())
    out.policy_loss.backward()
    torch.testing.assert_close(new.grad, -a / B)  # clip inactive at ratio 1: full gradient


def test_ppo_norm_adv_uses_unbiased_std_and_skips_single_sample():
    adv = torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64)
    lp = torch.zeros(3, dtype=torch.float64)
    # ratio 1 -> policy_loss = -mean(adv_n); check the scale through the gradient: -adv_n / B
    new = lp.clone().requires_grad_(True)
    ppo_loss(new, lp, adv, **zeros_like_values(3), **loss_kwargs(norm_adv=True)).policy_loss.backward()
    mean, std = 7.0 / 3.0, math.sqrt(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2) / 2)
    expected = -((np.array([1.0, 2.0, 4.0]) - mean) / (std + 1e-8)) / 3
    np.testing.assert_allclose(new.grad.numpy(), expected, atol=1e-12)
    # a single sample is not normalized (its std is undefined)
    out = ppo_loss(
        torch.zeros(1, dtype=torch.float64),
        torch.zeros(1, dtype=torch.float64),
        torch.tensor([3.0], dtype=torch.float64),
        **zeros_like_values(1),
        **loss_kwargs(norm_adv=True),
    )
    assert out.policy_loss.item() == pytest.approx(-3.0)


def test_ppo_clipping_hand_computed():
    # clip_coef = 0.2, no normalization, B = 5
    #   i  A    r     -A*r   -A*clip(r)   max    clip active?  d loss/d logp_i = -A*r/B if unclipped else 0
    #   0  +1   1.5   -1.5   -1.2         -1.2   yes           0
    #   1  -1   0.5   +0.5   +0.8         +0.8   yes           0
    #   2  +1   0.5   -0.5   -0.8         -0.5   no            -0.5/5 = -0.1
    #   3  -1   1.5   +1.5   +1.2         +1.5   no            +1.5/5 = +0.3
    #   4  +2   1.1   -2.2   -2.2         -2.2   no (inside)   -2.2/5 = -0.44
    # policy_loss = (-1.2 + 0.8 - 0.5 + 1.5 - 2.2) / 5 = -0.32
    # clipfrac = 4/5 (samples 0-3 have |r - 1| > 0.2, whether or not the clip is active)
    ratios = torch.tensor([1.5, 0.5, 0.5, 1.5, 1.1], dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, 2.0], dtype=torch.float64)
    old = torch.tensor([-1.0, -2.0, 0.0, 0.3, -0.7], dtype=torch.float64)
    new = (old + ratios.log()).detach().requires_grad_(True)
    out = ppo_loss(new, old, adv, **zeros_like_values(5), **loss_kwargs())
    assert out.policy_loss.item() == pytest.approx(-0.32, abs=1e-12)
    assert out.clipfrac.item() == pytest.approx(0.8)
    out.policy_loss.backward()
    np.testing.assert_allclose(new.grad.numpy(), [0.0, 0.0, -0.1, 0.3, -0.44], atol=1e-12)


def test_ppo_clipfrac_counts_and_boundary():
    # clipfrac = share of samples with |r - 1| > clip (strictly). Ratios: 1, 1.3, 0.7, 1.05, 1.5, 0.5
    old = torch.zeros(6, dtype=torch.float64)
    new = torch.tensor([1.0, 1.3, 0.7, 1.05, 1.5, 0.5], dtype=torch.float64).log()
    ones = torch.ones(6, dtype=torch.float64)

    def clipfrac(c):
        return ppo_loss(new, old, ones, **zeros_like_values(6), **loss_kwargs(clip_coef=c)).clipfrac.item()

    assert clipfrac(0.1) == pytest.approx(4 / 6)  # all but r = 1 and r = 1.05
    assert clipfrac(0.4) == pytest.approx(2 / 6)  # 1.5 and 0.5
    # exp(log 1.5) - 1 and exp(log 0.5) - 1 are exactly +-0.5 in float64: on the boundary, not counted
    assert (new.exp() - 1.0).abs()[4:].tolist() == [0.5, 0.5]
    assert clipfrac(0.5) == 0.0


def test_ppo_kl_estimators():
    rng = np.random.default_rng(3)
    old_np = rng.normal(size=64)
    new_np = old_np + rng.normal(scale=0.3, size=64)
    adv = torch.tensor(rng.normal(size=64))
    out = ppo_loss(torch.tensor(new_np), torch.tensor(old_np), adv, **zeros_like_values(64), **loss_kwargs())
    logr = [n - o for n, o in zip(new_np.tolist(), old_np.tolist(), strict=True)]
    k3 = sum((math.exp(x) - 1.0) - x for x in logr) / len(logr)
    k1 = sum(-x for x in logr) / len(logr)
    assert out.approx_kl.item() == pytest.approx(k3, abs=1e-12)
    assert out.old_approx_kl.item() == pytest.approx(k1, abs=1e-12)
    assert out.approx_kl.item() > 0.0
    assert not out.approx_kl.requires_grad and not out.clipfrac.requires_grad


def test_ppo_value_loss_unclipped():
    nv = torch.tensor([0.5, 0.1, 0.5, 2.0], dtype=torch.float64)
    ret = torch.tensor([1.0, 1.0, 0.4, -1.0], dtype=torch.float64)
    z = torch.zeros(4, dtype=torch.float64)
    out = ppo_loss(z, z, z, nv, z + 100.0, ret, z, **loss_kwargs(clip_vloss=False))
    # 0.5 * (0.25 + 0.81 + 0.01 + 9) / 4 = 1.25875   (old_values is irrelevant without clipping)
    assert out.value_loss.item() == pytest.approx(1.25875, abs=1e-12)


def test_ppo_value_loss_clipped_hand_computed():
    # clip_coef = 0.2
    #   i  old  new  ret   new-old  v_clip  (new-ret)^2  (v_clip-ret)^2  max    grad d/dnew = 0.5*2*(.)/4 on max branch
    #   0  0    0.5  1.0   +0.5     0.2     0.25         0.64            0.64   0 (clipped branch, clamp saturated)
    #   1  0    0.1  1.0   +0.1     0.1     0.81         0.81            0.81   (0.1-1)/4 = -0.225
    #   2  1    0.5  0.4   -0.5     0.8     0.01         0.16            0.16   0 (clipped branch)
    #   3  0    0.5  -1.0  +0.5     0.2     2.25         1.44            2.25   (0.5+1)/4 = 0.375
    # value_loss = 0.5 * (0.64 + 0.81 + 0.16 + 2.25) / 4 = 0.4825
    old_v = torch.tensor([0.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    new_v = torch.tensor([0.5, 0.1, 0.5, 0.5], dtype=torch.float64, requires_grad=True)
    ret = torch.tensor([1.0, 1.0, 0.4, -1.0], dtype=torch.float64)
    z = torch.zeros(4, dtype=torch.float64)
    out = ppo_loss(z, z, z, new_v, old_v, ret, z, **loss_kwargs(clip_vloss=True))
    assert out.value_loss.item() == pytest.approx(0.4825, abs=1e-12)
    out.value_loss.backward()
    np.testing.assert_allclose(new_v.grad.numpy(), [0.0, -0.225, 0.0, 0.375], atol=1e-12)
    # unclipped, the same inputs give 0.5 * (0.25 + 0.81 + 0.01 + 2.25) / 4 = 0.415
    out = ppo_loss(z, z, z, new_v, old_v, ret, z, **loss_kwargs(clip_vloss=False))
    assert out.value_loss.item() == pytest.approx(0.415, abs=1e-12)


def test_ppo_total_loss_combination():
    rng = np.random.default_rng(5)
    B = 16

    def t():
        return torch.tensor(rng.normal(size=B))

    old, adv, new_v, old_v, ret = t(), t(), t(), t(), t()
    new = old + 0.3 * t()
    ent = torch.tensor(rng.uniform(0.5, 2.0, size=B))
    out = ppo_loss(new, old, adv, new_v, old_v, ret, ent, **loss_kwargs(clip_vloss=True, ent_coef=0.01, vf_coef=0.7))
    assert out.entropy.item() == pytest.approx(ent.mean().item(), abs=1e-12)
    assert out.loss.item() == pytest.approx(
        out.policy_loss.item() - 0.01 * ent.mean().item() + 0.7 * out.value_loss.item(), abs=1e-12
    )
    # and the components themselves, computed independently in numpy
    r = np.exp(new.numpy() - old.numpy())
    a = adv.numpy()
    pg = np.mean(np.maximum(-a * r, -a * np.clip(r, 0.8, 1.2)))
    vc = old_v.numpy() + np.clip(new_v.numpy() - old_v.numpy(), -0.2, 0.2)
    vl = 0.5 * np.mean(np.maximum((new_v.numpy() - ret.numpy()) ** 2, (vc - ret.numpy()) ** 2))
    assert out.policy_loss.item() == pytest.approx(pg, abs=1e-12)
    assert out.value_loss.item() == pytest.approx(vl, abs=1e-12)
    assert out.loss.item() == pytest.approx(pg - 0.01 * ent.numpy().mean() + 0.7 * vl, abs=1e-12)


def _random_ppo_inputs(seed, B=32):
    rng = np.random.default_rng(seed)

    def t(scale=1.0):
        return torch.tensor(rng.normal(scale=scale, size=B))

    old = t()
    inputs = {
        "new_logprob": old + t(0.3),
        "old_logprob": old,
        "advantages": t(),
        "new_values": t(),
        "old_values": t(),
        "returns": t(),
        "entropy": t().abs(),
    }
    return inputs, rng


@pytest.mark.parametrize("norm_adv", [False, True])
def test_ppo_behaviour_equal_to_old_is_plain_ppo(norm_adv):
    inputs, _ = _random_ppo_inputs(11)
    kw = loss_kwargs(clip_vloss=True, ent_coef=0.01, norm_adv=norm_adv)
    plain = ppo_loss(**inputs, **kw)
    dec = ppo_loss(**inputs, **kw, behaviour_logprob=inputs["old_logprob"].clone(), max_is_weight=1.0)
    for a, b in zip(plain, dec, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-14)


@pytest.mark.parametrize("max_is_weight", [1.0, 2.0])
def test_ppo_behaviour_weights_policy_loss(max_is_weight):
    inputs, rng = _random_ppo_inputs(12)
    B = inputs["old_logprob"].shape[0]
    behav = (inputs["old_logprob"] + torch.tensor(rng.normal(scale=0.8, size=B))).requires_grad_(True)
    new = inputs["new_logprob"].detach().clone().requires_grad_(True)
    inputs["new_logprob"] = new
    kw = loss_kwargs(clip_vloss=True, ent_coef=0.01, vf_coef=0.5)
    out = ppo_loss(**inputs, **kw, behaviour_logprob=behav, max_is_weight=max_is_weight)

    old_np, behav_np = inputs["old_logprob"].numpy(), behav.detach().numpy()
    w = np.minimum(np.exp(old_np - behav_np), max_is_weight)
    assert (w < max_is_weight).any() and (np.exp(old_np - behav_np) > max_is_weight).any()  # both regimes exercised
    r = np.exp(new.detach().numpy() - old_np)
    a = inputs["advantages"].numpy()
    unclipped = (r >= 0.8) & (r <= 1.2) | ((a > 0) & (r < 0.8)) | ((a < 0) & (r > 1.2))
    per_sample = np.maximum(-a * r, -a * np.clip(r, 0.8, 1.2))
    assert out.policy_loss.item() == pytest.approx(np.mean(w * per_sample), abs=1e-12)
    plain = ppo_loss(**{**inputs, "new_logprob": new.detach()}, **kw)
    assert out.policy_loss.item() != pytest.approx(plain.policy_loss.item(), abs=1e-6)
    # value loss, entropy and diagnostics are unweighted
    for name in ("value_loss", "entropy", "approx_kl", "old_approx_kl", "clipfrac"):
        torch.testing.assert_close(getattr(out, name), getattr(plain, name), rtol=0, atol=0)

    out.loss.backward()
    # the IS weight is a constant: no gradient flows to the behaviour log-probs
    assert behav.grad is None
    # d policy_loss / d new_logprob_i = -w_i * A_i * r_i / B where the clip is inactive, else 0
    np.testing.assert_allclose(new.grad.numpy(), np.where(unclipped, -w * a * r / B, 0.0), atol=1e-12)


def test_mean_clipfrac_is_the_mean_of_the_minibatches_clipfracs():
    """Minibatches of unequal size (the guard dropped samples): the mean of per-minibatch fractions, not the pooled
    fraction."""
    ratios = [torch.tensor([1.0, 1.5, 0.7]), torch.tensor([1.1, 1.0, 1.0, 1.0, 1.3, 0.9])]
    expected = np.mean([2 / 3, 1 / 6])
    assert mean_clipfrac(ratios, 0.2) == pytest.approx(expected)
    for r in ratios:  # and each agrees with PPOLoss.clipfrac
        z = torch.zeros(len(r))
        one = ppo_loss(r.log(), z, z, z, z, z, z, **loss_kwargs())
        assert one.clipfrac.item() == pytest.approx(mean_clipfrac([r], 0.2))


# =====================================================================================================================
# explained_variance
# =====================================================================================================================
def test_explained_variance_perfect():
    y = np.array([1.0, -2.0, 3.5, 0.25])
    assert explained_variance(y, y) == 1.0


def test_explained_variance_constant_mean_prediction_is_zero():
    y = np.array([1.0, -2.0, 3.5, 0.25, 7.0])
    assert explained_variance(np.full_like(y, y.mean()), y) == pytest.approx(0.0, abs=1e-12)


def test_explained_variance_constant_targets_is_nan():
    assert math.isnan(explained_variance(np.array([0.0, 1.0, 2.0]), np.full(3, 2.0)))


def test_explained_variance_hand_computed():
    # y_true = [1, 2, 3, 4], var = 1.25; y_pred = [1, 2, 3, 5], residual = [0, 0, 0, -1],
    # var(residual) = 0.25 - 0.0625 = 0.1875 -> 1 - 0.1875/1.25 = 0.85
    assert explained_variance(np.array([1.0, 2.0, 3.0, 5.0]), np.array([1.0, 2.0, 3.0, 4.0])) == pytest.approx(0.85)
    # worse than a constant is negative: y_pred = [4, 3, 2, 1], residual = [-3, -1, 1, 3], var = 5 -> 1 - 4 = -3
    assert explained_variance(np.array([4.0, 3.0, 2.0, 1.0]), np.array([1.0, 2.0, 3.0, 4.0])) == pytest.approx(-3.0)


# =====================================================================================================================
# RunningMeanStd
# =====================================================================================================================
def moments_with_prior(x, prior_count=1e-4):
    """Mean and variance of the data plus a pseudo-sample of weight `prior_count` at mean 0, variance 1 (the
    RunningMeanStd initial state), as weighted first and second moments."""
    x = np.asarray(x, dtype=np.float64)
    total = x.shape[0] + prior_count
    mean = x.sum(axis=0) / total
    second = ((x**2).sum(axis=0) + prior_count * 1.0) / total
    return mean, second - mean**2, total


@pytest.mark.parametrize("shape", [(), (3,), (2, 2)])
def test_rms_matches_numpy_on_concatenation(shape):
    rng = np.random.default_rng(0)
    batches = [rng.normal(loc=2.0, scale=3.0, size=(int(rng.integers(1, 40)), *shape)) for _ in range(6)]
    rms = RunningMeanStd(shape=shape)
    for b in batches:
        rms.update(b)
    data = np.concatenate(batches)
    mean, var, count = moments_with_prior(data)
    np.testing.assert_allclose(rms.mean, mean, atol=1e-8, rtol=0)
    np.testing.assert_allclose(rms.var, var, atol=1e-8, rtol=0)
    assert rms.count == pytest.approx(count, abs=1e-9)
    # the prior is tiny: plain numpy moments agree up to ~prior/N
    np.testing.assert_allclose(rms.mean, data.mean(axis=0), atol=1e-4)
    np.testing.assert_allclose(rms.var, data.var(axis=0), atol=1e-3)
    # without a prior the moments are exactly numpy's
    rms0 = RunningMeanStd(shape=shape, epsilon=0.0)
    for b in batches:
        rms0.update(b)
    np.testing.assert_allclose(rms0.mean, data.mean(axis=0), atol=1e-10, rtol=0)
    np.testing.assert_allclose(rms0.var, data.var(axis=0), atol=1e-10, rtol=0)


def test_rms_initial_state():
    rms = RunningMeanStd(shape=(2,))
    np.testing.assert_array_equal(rms.mean, [0.0, 0.0])
    np.testing.assert_array_equal(rms.var, [1.0, 1.0])
    assert rms.count == 1e-4


def test_rms_merge_moments_equals_single_instance():
    rng = np.random.default_rng(1)
    batches = [rng.normal(loc=-1.0, scale=2.0, size=(n, 3)) for n in (5, 17, 9, 30)]
    single = RunningMeanStd(shape=(3,))
    for b in batches:
        single.update(b)
    a = RunningMeanStd(shape=(3,))
    b_ = RunningMeanStd(shape=(3,), epsilon=0.0)  # a worker's delta carries no second prior
    a.update(batches[0])
    a.update(batches[1])
    b_.update(batches[2])
    b_.update(batches[3])
    a.update_from_moments(b_.mean, b_.var, b_.count)
    np.testing.assert_allclose(a.mean, single.mean, atol=1e-12, rtol=0)
    np.testing.assert_allclose(a.var, single.var, atol=1e-12, rtol=0)
    assert a.count == pytest.approx(single.count, abs=1e-12)
    # merging a zero-count delta is a no-op
    before = (a.mean.copy(), a.var.copy(), a.count)
    a.update_from_moments(np.full(3, 99.0), np.full(3, 99.0), 0)
    np.testing.assert_array_equal(a.mean, before[0])
    np.testing.assert_array_equal(a.var, before[1])
    assert a.count == before[2]


def test_rms_ignores_non_finite_rows():
    rng = np.random.default_rng(2)
    clean = rng.normal(size=(10, 3))
    dirty = clean.copy()
    dirty[2, 1] = np.nan
    dirty[5, 0] = np.inf
    dirty[7, 2] = -np.inf
    keep = np.ones(10, dtype=bool)
    keep[[2, 5, 7]] = False
    a, b = RunningMeanStd(shape=(3,)), RunningMeanStd(shape=(3,))
    a.update(dirty)
    b.update(clean[keep])
    np.testing.assert_array_equal(a.mean, b.mean)
    np.testing.assert_array_equal(a.var, b.var)
    assert a.count == b.count == pytest.approx(7 + 1e-4)
    assert np.isfinite(a.mean).all() and np.isfinite(a.var).all()
    # an all-NaN batch changes nothing
    a.update(np.full((4, 3), np.nan))
    np.testing.assert_array_equal(a.mean, b.mean)
    np.testing.assert_array_equal(a.var, b.var)
    assert a.count == b.count


def test_rms_state_dict_round_trip_through_weights_only_load():
    rng = np.random.default_rng(3)
    rms = RunningMeanStd(shape=(4,))
    for _ in range(3):
        rms.update(rng.normal(size=(11, 4)))
    state = rms.state_dict()
    assert set(state) == {"mean", "var", "count"}
    assert all(isinstance(v, torch.Tensor) for v in state.values())
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    fresh = RunningMeanStd(shape=(4,))
    fresh.load_state_dict(loaded)
    np.testing.assert_array_equal(fresh.mean, rms.mean)
    np.testing.assert_array_equal(fresh.var, rms.var)
    assert fresh.count == rms.count
    assert fresh.mean.dtype == np.float64 and fresh.var.dtype == np.float64
    # the state is a snapshot: later updates to either side do not alias
    rms.update(rng.normal(size=(5, 4)))
    np.testing.assert_array_equal(state["mean"].numpy(), fresh.mean)
    fresh.update(rng.normal(size=(5, 4)))
    np.testing.assert_array_equal(loaded["mean"].numpy(), state["mean"].numpy())


def test_rms_state_dict_scalar_shape():
    rms = RunningMeanStd(shape=())
    rms.update(np.array([1.0, 2.0, 4.0]))
    fresh = RunningMeanStd(shape=())
    fresh.load_state_dict(rms.state_dict())
    assert fresh.mean.shape == () and fresh.mean == rms.mean and fresh.var == rms.var and fresh.count == rms.count


def test_rms_load_state_dict_wrong_shape_raises():
    src = RunningMeanStd(shape=(3,))
    with pytest.raises(ValueError):
        RunningMeanStd(shape=(4,)).load_state_dict(src.state_dict())
    with pytest.raises(ValueError):
        RunningMeanStd(shape=()).load_state_dict(src.state_dict())


# =====================================================================================================================
# Reward scaling: DiscountedReturn (in the sampler) and scale_rewards (on the learner)
# =====================================================================================================================
def test_discounted_return_restarts_after_episode_end():
    # gamma = 0.5, 2 envs
    #   step 0: r = [1, 2], ended = [F, F] -> G = [1, 2]
    #   step 1: r = [1, 1], ended = [T, F] -> G = [0.5*1 + 1, 0.5*2 + 1] = [1.5, 2]; env 0 then restarts -> [0, 2]
    #   step 2: r = [4, 2], ended = [F, T] -> G = [0 + 4, 0.5*2 + 2] = [4, 3];   env 1 then restarts -> [4, 0]
    #   step 3: r = [2, 2], ended = [F, F] -> G = [0.5*4 + 2, 0 + 2] = [4, 2]
    tracker = DiscountedReturn(num_envs=2, gamma=0.5)
    steps = [
        ([1.0, 2.0], [False, False], [1.0, 2.0], [1.0, 2.0]),
        ([1.0, 1.0], [True, False], [1.5, 2.0], [0.0, 2.0]),
        ([4.0, 2.0], [False, True], [4.0, 3.0], [4.0, 0.0]),
        ([2.0, 2.0], [False, False], [4.0, 2.0], [4.0, 2.0]),
    ]
    for r, ended, returned, after in steps:
        np.testing.assert_allclose(tracker.step(np.array(r), np.array(ended)), returned, atol=1e-12)
        np.testing.assert_allclose(tracker.value, after, atol=1e-12)
    # run: the same steps over a whole (T, N) rollout at once, carrying on from where the tracker is
    rollout_tracker = DiscountedReturn(num_envs=2, gamma=0.5)
    first, rest = steps[:1], steps[1:]
    for part in (first, rest):
        rewards, ended = np.array([s[0] for s in part]), np.array([s[1] for s in part])
        np.testing.assert_allclose(rollout_tracker.run(rewards, ended), [s[2] for s in part], atol=1e-12)
    np.testing.assert_allclose(rollout_tracker.value, steps[-1][3], atol=1e-12)


def test_discounted_return_restarts_after_non_finite_reward():
    tracker = DiscountedReturn(num_envs=2, gamma=0.5)
    tracker.step(np.array([1.0, 2.0]), np.array([False, False]))
    returned = tracker.step(np.array([np.nan, 1.0]), np.array([False, False]))
    assert math.isnan(returned[0]) and returned[1] == 2.0
    np.testing.assert_array_equal(tracker.value, [0.0, 2.0])
    np.testing.assert_allclose(tracker.step(np.array([1.0, 1.0]), np.array([False, False])), [1.0, 2.0])


def test_scale_rewards_divides_by_return_std_and_clips():
    rms = RunningMeanStd(shape=())
    rms.update(np.array([10.0, -10.0, 0.1]))
    _, var, _ = moments_with_prior([10.0, -10.0, 0.1])
    r = np.array([10.0, -10.0, 0.1])
    np.testing.assert_allclose(scale_rewards(r, rms, clip=100.0), r / np.sqrt(var + 1e-8), atol=1e-12)
    np.testing.assert_allclose(scale_rewards(r, rms, clip=0.5), np.clip(r / np.sqrt(var + 1e-8), -0.5, 0.5))


def test_return_statistics_skip_non_finite_returns():
    rms = RunningMeanStd(shape=())
    rms.update(np.array([1.0, np.nan, 2.0, np.inf]))
    mean, var, count = moments_with_prior([1.0, 2.0])
    assert rms.mean == pytest.approx(mean) and rms.var == pytest.approx(var) and rms.count == pytest.approx(count)


# =====================================================================================================================
# Numerical guard: finite moments, the per-sample mask, GAE across masked samples, advantage outliers
# =====================================================================================================================
def test_finite_moments_leave_out_bad_rows():
    batch = np.array([[1.0, 2.0], [np.nan, 5.0], [3.0, 4.0], [np.inf, 0.0]])
    mean, var, count = finite_moments(batch)
    assert count == 2
    np.testing.assert_allclose(mean, [2.0, 3.0])
    np.testing.assert_allclose(var, [1.0, 1.0])
    assert finite_moments(np.full((2, 3), np.nan))[2] == 0


def test_update_from_moments_refuses_non_finite_moments():
    """dppo_ray.py merges moments that actors computed: NaN moments must not poison the learner's statistics."""
    rms = RunningMeanStd(shape=(2,))
    rms.update_from_moments(np.array([np.nan, 1.0]), np.array([1.0, 1.0]), 10)
    rms.update_from_moments(np.array([0.0, 1.0]), np.array([np.inf, 1.0]), 10)
    np.testing.assert_array_equal(rms.mean, [0.0, 0.0])
    np.testing.assert_array_equal(rms.var, [1.0, 1.0])
    assert rms.count == 1e-4


def test_finite_samples_masks_any_non_finite_part():
    obs = np.zeros((3, 2, 4))
    actions = np.zeros((3, 2, 1))
    rewards = np.zeros((3, 2))
    obs[0, 1, 2] = np.nan
    actions[1, 0, 0] = np.inf
    rewards[2, 1] = np.nan
    expected = np.array([[True, False], [False, True], [True, False]])
    np.testing.assert_array_equal(finite_samples(obs, actions, rewards), expected)
    np.testing.assert_array_equal(finite_samples(obs, np.zeros((3, 2)), rewards)[1], [True, True])  # discrete actions


def test_gae_masked_sample_cuts_the_chain_and_bootstraps_from_its_value():
    """A NaN reward at t=2 (its observation is fine): t=1 ends its chain and bootstraps from V(s_2) = nv[1], like a
    time-limit cut; t=2 gets advantage 0; t=3 is unaffected.
      d0 = 1 + 0.9*1.0 - 0.5 = 1.4,  d1 = 0 + 0.9*5.0 - 1.0 = 3.5,  d3 = 1 + 0.9*3.0 - 2.0 = 1.7
      A1 = 3.5 (cut), A0 = 1.4 + 0.72*3.5 = 3.92, A2 = 0, A3 = 1.7"""
    r = col([1.0, 0.0, float("nan"), 1.0])
    valid = col([True, True, False, True], dtype=torch.bool)
    zeros = col([0, 0, 0, 0])
    adv, ret = compute_gae(r, col(V4), col(NV4), zeros, zeros, GAMMA, LAM, valid=valid)
    torch.testing.assert_close(adv, col([3.92, 3.5, 0.0, 1.7]))
    torch.testing.assert_close(ret[[0, 1, 3]], col([4.42, 4.5, 3.7]))
    assert torch.isfinite(ret).all()


def test_gae_non_finite_successor_value_is_a_cut_without_bootstrap():
    """A NaN observation at t=2 makes V(s_2) NaN: t=1 ends its chain with no bootstrap (like a termination), and
    the NaN reaches no kept sample. d1 = 0 - 1.0 = -1.0, A0 = 1.4 + 0.72*(-1.0) = 0.68."""
    v = col([0.5, 1.0, float("nan"), 2.0])
    nv = col([1.0, float("nan"), 2.0, 3.0])
    valid = col([True, True, False, True], dtype=torch.bool)
    zeros = col([0, 0, 0, 0])
    adv, ret = compute_gae(col(R4), v, nv, zeros, zeros, GAMMA, LAM, valid=valid)
    torch.testing.assert_close(adv, col([0.68, -1.0, 0.0, 1.7]))
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()


def test_gae_all_valid_mask_changes_nothing():
    rng = np.random.default_rng(3)
    r, v, nv = (torch.tensor(rng.standard_normal((6, 3))) for _ in range(3))
    term = torch.tensor(rng.random((6, 3)) < 0.2)
    trunc = torch.tensor(rng.random((6, 3)) < 0.2)
    plain = compute_gae(r, v, nv, term, trunc, 0.99, 0.95)
    masked = compute_gae(r, v, nv, term, trunc, 0.99, 0.95, valid=torch.ones(6, 3, dtype=torch.bool))
    torch.testing.assert_close(plain, masked)


def test_advantage_outliers_robust_scale_and_absolute_bound():
    advantages = np.array([1.0, -1.0, 0.5, -0.5, 0.0, 5000.0, 2.0, np.nan])
    returns = np.array([0.0, 0.0, 0.0, 0.0, 2e6, 0.0, 0.0, 0.0])
    valid = np.array([True, True, True, True, True, True, True, False])
    # Over the kept values [1, -1, .5, -.5, 5000, 2] (index 4 falls to --guard-max-abs through its return):
    # median 0.75, MAD = median(|x - 0.75|) = median(.25, 1.75, .25, 1.25, 4999.25, 1.25) = 1.25; 5000 is 3999 MADs out.
    bad = advantage_outliers(advantages, returns, valid, max_abs=1e6, mad_factor=1000.0)
    np.testing.assert_array_equal(bad, [False, False, False, False, True, True, False, False])
    assert not advantage_outliers(advantages[:4], returns[:4], valid[:4], max_abs=1e6).any()
    # With a zero MAD (all kept advantages equal) only the absolute bound applies.
    same = np.array([1.0, 1.0, 1.0, 3.0])
    np.testing.assert_array_equal(advantage_outliers(same, np.zeros(4), np.ones(4, bool), max_abs=2.0), [0, 0, 0, 1])


def test_advantage_outliers_non_finite_advantage_of_a_valid_sample():
    bad = advantage_outliers(np.array([1.0, np.inf, 2.0]), np.zeros(3), np.ones(3, bool), max_abs=1e6)
    np.testing.assert_array_equal(bad, [False, True, False])


def test_a_batch_is_skipped_only_when_under_half_of_it_is_usable():
    assert too_few_samples(128, 256) is None and too_few_samples(256, 256) is None
    assert too_few_samples(127, 256) == "only 127 of 256 samples are usable (NaN/inf data or outlier advantages)"
    assert too_few_samples(0, 1) == "only 0 of 1 samples are usable (NaN/inf data or outlier advantages)"


def test_a_step_is_refused_for_a_non_finite_or_too_large_loss_or_a_non_finite_gradient():
    assert bad_step(0.5, 3.0, max_abs=1e6, epoch=0) is None
    assert bad_step(-1e6, 3.0, max_abs=1e6, epoch=0) is None  # at the bound is kept
    assert bad_step(float("nan"), 3.0, max_abs=1e6, epoch=2) == "loss nan in epoch 3"
    assert bad_step(-2e6, float("nan"), max_abs=1e6, epoch=0) == "loss -2e+06 in epoch 1"  # the loss is said first
    assert bad_step(0.5, float("inf"), max_abs=1e6, epoch=9) == "non-finite gradient in epoch 10"


# =====================================================================================================================
# Health warnings
# =====================================================================================================================
def test_health_warnings_name_the_problem():
    healthy = {"entropy": [8.0 - 0.01 * i for i in range(20)], "approx_kl": [0.01] * 20, "explained_variance": [0.9]}
    assert health_warnings(healthy, True, act_dim=6) == []
    sick = {"entropy": [8.0 - 0.5 * i for i in range(20)], "approx_kl": [0.05] * 20, "explained_variance": [-0.3]}
    names = [name for name, _ in health_warnings(sick, True, act_dim=6)]
    assert names == ["entropy_collapse", "high_kl", "low_explained_variance"]
    # explained variance is not judged during warm-up; a single high-KL update is not "persistent"
    early = {"entropy": [8.0], "approx_kl": [0.01] * 4 + [0.5], "explained_variance": [-0.3]}
    assert health_warnings(early, False, act_dim=6) == []


@pytest.mark.parametrize("with_statistics", [True, False])
def test_normalize_obs_standardizes_clips_and_marks_non_finite_rows(with_statistics):
    rng = np.random.default_rng(0)
    raw = rng.normal(size=(5, 4)) * 3.0
    raw[1, 2], raw[3, 0] = np.nan, -np.inf
    mean, std = (rng.normal(size=4), rng.uniform(0.5, 2.0, size=4)) if with_statistics else (None, None)
    expected = raw.copy() if mean is None else np.clip((raw - mean) / std, -2.5, 2.5)
    expected[[1, 3]] = np.nan  # the whole row, whatever the clip would have made of it
    out = np.full((5, 4), 7.0, np.float32)
    x = normalize_obs(raw, mean, std, 2.5, out=out)
    assert x is out and x.dtype == np.float32
    np.testing.assert_array_equal(x, expected.astype(np.float32))
    np.testing.assert_array_equal(normalize_obs(raw, mean, std, 2.5), x)
    for_acting = normalize_obs(raw, mean, std, 2.5, fill=0.0)
    np.testing.assert_array_equal(for_acting[[1, 3]], 0.0)
    np.testing.assert_array_equal(np.delete(for_acting, [1, 3], axis=0), np.delete(x, [1, 3], axis=0))


def test_finished_episodes_sum_each_episode_across_rollouts_in_the_order_they_end():
    running_returns, running_lengths = np.zeros(2), np.zeros(2, dtype=np.int64)
    rewards = np.array([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0]])
    ended = np.array([[False, True], [True, False], [False, False]])
    returns, lengths = finished_episodes(rewards, ended, running_returns, running_lengths)
    assert returns == [10.0, 3.0] and lengths == [1, 2]  # env 1 ends at step 0, env 0 at step 1
    np.testing.assert_array_equal(running_returns, [3.0, 50.0])
    np.testing.assert_array_equal(running_lengths, [1, 2])
    returns, lengths = finished_episodes(
        np.array([[4.0, 5.0]]), np.array([[True, True]]), running_returns, running_lengths
    )
    assert returns == [7.0, 55.0] and lengths == [2, 3]  # the unfinished sums carried over
    np.testing.assert_array_equal(running_returns, [0.0, 0.0])
