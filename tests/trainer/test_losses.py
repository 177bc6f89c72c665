"""Loss pieces against values worked out by hand (the arithmetic is in the comments)."""

from __future__ import annotations

import math

import pytest
import torch

from hetrl.trainer import losses

# Two real rows and one zero-length row; padding holds junk that must never leak into a result.
PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0, 99.0], [4.0, 5.0, 99.0, 99.0], [99.0, 99.0, 99.0, 99.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])


def test_count_tokens_and_seqs_ignores_empty_rows():
    assert losses.count_tokens_and_seqs(MASK) == (5.0, 2.0)


@pytest.mark.parametrize(
    ("mode", "kwargs", "expected"),
    [
        ("token-mean", {}, 15.0 / 5),  # (1+2+3+4+5) / 5 tokens
        ("seq-mean-token-mean", {}, (6.0 / 3 + 9.0 / 2) / 2),  # (2 + 4.5) / 2 non-empty seqs
        ("seq-mean-token-sum-norm", {"max_len": 4}, 15.0 / (4 * 2)),
        ("seq-mean-token-sum-norm", {"max_len": 10}, 15.0 / (10 * 2)),
        ("token-mean", {"num_global_tokens": 10.0}, 15.0 / 10),
        ("seq-mean-token-mean", {"num_global_seqs": 5.0}, 6.5 / 5),
        ("seq-mean-token-sum-norm", {"max_len": 4, "num_global_seqs": 3.0}, 15.0 / 12),
        ("token-mean", {"num_global_tokens": torch.tensor(10.0)}, 15.0 / 10),  # an all-reduced count
        ("seq-mean-token-mean", {"num_global_seqs": torch.tensor(5.0)}, 6.5 / 5),
    ],
)
def test_aggregate_modes(mode, kwargs, expected):
    assert losses.aggregate(PER_TOKEN, MASK, mode, **kwargs).item() == pytest.approx(expected)


def test_aggregate_gradient_is_the_normalised_mask():
    x = PER_TOKEN.clone().requires_grad_(True)
    losses.aggregate(x, MASK, "seq-mean-token-mean").backward()
    # d/dx of (x0+x1+x2)/3/2 + (x3+x4)/2/2
    expected = torch.tensor([[1 / 6, 1 / 6, 1 / 6, 0.0], [0.25, 0.25, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(x.grad, expected)


def test_aggregate_counts_bf16_tokens_exactly():
    # 1001 tokens of value 1: in bf16 (spacing 8 near 1000) the sum or the count would round to 1000
    per_token = torch.ones(7, 143, dtype=torch.bfloat16)
    out = losses.aggregate(per_token, torch.ones(7, 143), "token-mean")
    assert out.dtype == torch.float32 and out.item() == 1.0
    per_token = torch.ones(1, 1001, dtype=torch.bfloat16)
    assert losses.aggregate(per_token, torch.ones(1, 1001), "seq-mean-token-mean").item() == 1.0


def test_aggregate_empty_batch_is_zero_and_differentiable():
    x = torch.ones(2, 3, requires_grad=True)
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        out = losses.aggregate(x, torch.zeros(2, 3), mode, max_len=3)
        assert out.item() == 0.0
        out.backward()
    assert torch.equal(x.grad, torch.zeros(2, 3))


def test_aggregate_errors():
    with pytest.raises(ValueError, match="max_len"):
        losses.aggregate(PER_TOKEN, MASK, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        losses.aggregate(PER_TOKEN, MASK, "mean")
    with pytest.raises(ValueError, match="shape"):
        losses.aggregate(PER_TOKEN, MASK[:, :2], "token-mean")


def test_ppo_ratio_and_clipped_surrogate_by_hand():
    # (ratio, advantage) pairs, clip_low 0.2, clip_high 0.28, dual clip 3:
    #   (0.5, +1): max(-0.5, -0.8) = -0.5          unclipped, grad -A r = -0.5
    #   (0.5, -1): max(0.5, 0.8) = 0.8             clip low, grad 0
    #   (1.5, +1): max(-1.5, -1.28) = -1.28        clip high, grad 0
    #   (1.5, -1): max(1.5, 1.28) = 1.5            unclipped, grad 1.5
    #   (1.1, +2): max(-2.2, -2.2) = -2.2          inside, grad -2.2
    #   (4.0, -1): max(4, 1.28) = 4 -> min(4, 3)=3 dual clip, grad 0
    ratios = torch.tensor([[0.5, 0.5, 1.5, 1.5, 1.1, 4.0]])
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0, 2.0, -1.0]])
    old = torch.tensor([[-1.0, -2.0, -0.5, -1.5, -3.0, -0.1]])
    logp = (old + ratios.log()).requires_grad_(True)
    ratio = losses.ppo_ratio(logp, old)
    torch.testing.assert_close(ratio, ratios)
    loss, active = losses.clipped_surrogate(ratio, adv, 0.2, 0.28, dual_clip=3.0)
    torch.testing.assert_close(loss, torch.tensor([[-0.5, 0.8, -1.28, 1.5, -2.2, 3.0]]))
    assert active["low"].tolist() == [[False, True, False, False, False, False]]
    assert active["high"].tolist() == [[False, False, True, False, False, False]]
    assert active["dual"].tolist() == [[False, False, False, False, False, True]]
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.5, 0.0, 0.0, 1.5, -2.2, 0.0]]))


def test_clipped_surrogate_without_dual_clip_and_bad_constant():
    loss, active = losses.clipped_surrogate(torch.tensor([4.0]), torch.tensor([-1.0]), 0.2, 0.2)
    assert loss.item() == pytest.approx(4.0) and "dual" not in active
    with pytest.raises(ValueError, match="dual_clip"):
        losses.clipped_surrogate(torch.tensor([1.0]), torch.tensor([1.0]), 0.2, 0.2, dual_clip=0.5)


def test_gspo_ratio_is_length_normalised_with_per_token_gradient():
    old = torch.tensor([[-1.0, -2.0, 0.0], [-1.0, 0.0, 0.0]])
    # row 0: diffs 0.1, 0.3 (+ junk 5.0 on padding) -> mean 0.2; row 1: diff -0.4 -> mean -0.4
    logp = (old + torch.tensor([[0.1, 0.3, 5.0], [-0.4, 7.0, 7.0]])).requires_grad_(True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    ratio = losses.gspo_ratio(logp, old, mask)
    e2, e4 = math.exp(0.2), math.exp(-0.4)
    torch.testing.assert_close(ratio, torch.tensor([[e2, e2, 1.0], [e4, 1.0, 1.0]]))
    ratio.sum().backward()
    # d s_it / d logp_t = s_i (the sequence ratio is a constant in the token form)
    torch.testing.assert_close(logp.grad, torch.tensor([[e2, e2, 0.0], [e4, 0.0, 0.0]]))


def test_cispo_loss_by_hand():
    # ratios 0.5, 2, 7 with eps_high 5 -> weights 0.5, 2, 6 (stop-gradient)
    logp_values = torch.tensor([[-1.0, -2.0, -0.5]])
    old = logp_values - torch.tensor([[0.5, 2.0, 7.0]]).log()
    logp = logp_values.clone().requires_grad_(True)
    adv = torch.tensor([[1.0, -1.0, 1.0]])
    loss, truncated = losses.cispo_loss(logp, old, adv, clip_high=5.0)
    # -w A logp: -0.5*1*-1 = 0.5; -2*-1*-2 = -4; -6*1*-0.5 = 3
    torch.testing.assert_close(loss, torch.tensor([[0.5, -4.0, 3.0]]))
    assert truncated.tolist() == [[False, False, True]]
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.5, 2.0, -6.0]]))  # -w A: clipped tokens keep a gradient


def test_kl_estimators_by_hand():
    ref = torch.tensor([-1.0, -1.0, -1.0])
    logp = ref + torch.tensor([0.5, -0.5, 0.0])
    torch.testing.assert_close(losses.kl_estimate(logp, ref, "k1"), torch.tensor([0.5, -0.5, 0.0]))
    torch.testing.assert_close(losses.kl_estimate(logp, ref, "k2"), torch.tensor([0.125, 0.125, 0.0]))
    k3 = [math.exp(-0.5) - 1 + 0.5, math.exp(0.5) - 1 - 0.5, 0.0]
    torch.testing.assert_close(losses.kl_estimate(logp, ref, "k3"), torch.tensor(k3))
    with pytest.raises(ValueError, match="k1, k2, k3"):
        losses.kl_estimate(logp, ref, "k4")


def test_k3_alone_is_clamped_at_10_with_a_finite_gradient():
    """verl's low_var_kl clamp: a token far below the reference weighs 10, not exp(500), and stops pulling."""
    ref = torch.tensor([0.0, 0.0, 0.0, 0.0])
    logp = torch.tensor([-500.0, -3.0, 2.0, 12.0], requires_grad=True)  # k3 unclamped: e^20 - 21, 16.09, 1.14, 11.0
    k3 = losses.kl_estimate(logp, ref, "k3")
    assert k3[0].item() == k3[1].item() == k3[3].item() == 10.0
    assert k3[2].item() == pytest.approx(math.exp(-2.0) - 1.0 + 2.0)
    k3.sum().backward()
    assert torch.isfinite(logp.grad).all()
    torch.testing.assert_close(logp.grad, torch.tensor([0.0, 0.0, 1.0 - math.exp(-2.0), 0.0]))
    # k1 and k2 are not clamped (verl clamps low_var_kl alone).
    assert losses.kl_estimate(logp.detach(), ref, "k1")[0].item() == -500.0
    assert losses.kl_estimate(logp.detach(), ref, "k2")[0].item() == 125_000.0


def test_k1_and_k3_are_unbiased_estimates_of_the_true_kl():
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.5, 0.3])
    true_kl = float((p * (p / q).log()).sum())
    gen = torch.Generator().manual_seed(0)
    samples = torch.multinomial(p, 200_000, replacement=True, generator=gen)
    logp, logq = p.log()[samples], q.log()[samples]
    for estimator in ("k1", "k3"):
        assert losses.kl_estimate(logp, logq, estimator).mean().item() == pytest.approx(true_kl, abs=5e-3)
    assert bool((losses.kl_estimate(logp, logq, "k3") >= 0).all())


# row 0: token ratios pi_old/mu = 0.5, 3, 1.5 (product 2.25); row 1: 0.5, 2 (product 1); junk on padding
_IS_RATIOS = torch.tensor([[0.5, 3.0, 1.5, 50.0], [0.5, 2.0, 50.0, 50.0]])
_IS_MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    ("mode", "level", "weights", "rejected", "truncated"),
    [
        ("truncated", "token", [[0.5, 2.0, 1.5, 0.0], [0.5, 2.0, 0.0, 0.0]], [], [(0, 1)]),
        ("masked", "token", [[0.5, 0.0, 1.5, 0.0], [0.5, 2.0, 0.0, 0.0]], [(0, 1)], []),
        ("truncated", "sequence", [[2.0, 2.0, 2.0, 0.0], [1.0, 1.0, 0.0, 0.0]], [], [(0, 0), (0, 1), (0, 2)]),
        ("masked", "sequence", [[0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]], [(0, 0), (0, 1), (0, 2)], []),
        ("none", "token", _IS_MASK.tolist(), [], []),
    ],
)
def test_importance_weights_by_hand(mode, level, weights, rejected, truncated):
    rollout = torch.tensor([[-1.0, -2.0, -0.3, -4.0], [-0.7, -1.1, -0.2, -0.9]])
    old = rollout + _IS_RATIOS.log()
    w, rej, trunc = losses.importance_weights(old, rollout, _IS_MASK, mode, level, threshold=2.0)
    torch.testing.assert_close(w, torch.tensor(weights))
    assert sorted(map(tuple, rej.nonzero().tolist())) == rejected
    assert sorted(map(tuple, trunc.nonzero().tolist())) == truncated


def test_importance_weights_are_constants_and_errors():
    old = torch.zeros(1, 2, requires_grad=True)
    w, _, _ = losses.importance_weights(old, torch.full((1, 2), -1.0), torch.ones(1, 2), "truncated", "token", 2.0)
    assert not w.requires_grad
    torch.testing.assert_close(w, torch.tensor([[2.0, 2.0]]))  # e^1 capped at 2
    with pytest.raises(ValueError, match="threshold"):
        losses.importance_weights(old, old, torch.ones(1, 2), "truncated", "token", 1.0)
    with pytest.raises(ValueError, match="IS level"):
        losses.importance_weights(old, old, torch.ones(1, 2), "masked", "step", 2.0)
    with pytest.raises(ValueError, match="IS correction"):
        losses.importance_weights(old, old, torch.ones(1, 2), "clip", "token", 2.0)


# IcePop on 2x3: row 0 ratios 0.4, 1.5, 6; row 1 ratios 3, 0.8 and a padding slot with junk (ratio 50)
_ICEPOP_RATIOS = torch.tensor([[0.4, 1.5, 6.0], [3.0, 0.8, 50.0]])
_ICEPOP_MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


@pytest.mark.parametrize(
    ("threshold", "weights", "rejected"),
    [
        # the paper's [0.5, 5]: 0.4 falls below, 6 above; 1.5, 3 and 0.8 keep their ratio as weight
        (5.0, [[0.0, 1.5, 0.0], [3.0, 0.8, 0.0]], [(0, 0), (0, 2)]),
        # is_threshold's default upper bound 2 rejects the 3 as well
        (2.0, [[0.0, 1.5, 0.0], [0.0, 0.8, 0.0]], [(0, 0), (0, 2), (1, 0)]),
    ],
)
def test_icepop_weights_by_hand(threshold, weights, rejected):
    rollout = torch.tensor([[-1.0, -2.0, -0.3], [-0.7, -1.1, -0.2]])
    old = rollout + _ICEPOP_RATIOS.log()
    w, rej, trunc = losses.importance_weights(
        old, rollout, _ICEPOP_MASK, "icepop", "token", threshold, threshold_low=0.5
    )
    torch.testing.assert_close(w, torch.tensor(weights))
    assert sorted(map(tuple, rej.nonzero().tolist())) == rejected  # padding is never counted as rejected
    assert not trunc.any()
    # masked IS at token level with the same lower bound is the same mask
    w_masked, rej_masked, _ = losses.importance_weights(old, rollout, _ICEPOP_MASK, "masked", "token", threshold, 0.5)
    torch.testing.assert_close(w_masked, w)
    assert torch.equal(rej_masked, rej)


# Geometric level, 3x3: row 0 ratios 2, 4, 8 (product 64, geometric mean 64^(1/3) = 4); row 1 ratios
# 0.1, 0.9 and padding (product 0.09, geometric mean sqrt(0.09) = 0.3); row 2 ratios 4, 0.25, 1
# (product 1, geometric mean 1: token level would cap or reject two of its tokens, this level none).
_GEO_RATIOS = torch.tensor([[2.0, 4.0, 8.0], [0.1, 0.9, 50.0], [4.0, 0.25, 1.0]])
_GEO_MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
_ROW0, _ROW1 = [(0, 0), (0, 1), (0, 2)], [(1, 0), (1, 1)]


@pytest.mark.parametrize(
    ("mode", "low", "weights", "rejected", "truncated"),
    [
        ("truncated", None, [[2.0, 2.0, 2.0], [0.3, 0.3, 0.0], [1.0, 1.0, 1.0]], [], _ROW0),
        ("masked", None, [[0.0, 0.0, 0.0], [0.3, 0.3, 0.0], [1.0, 1.0, 1.0]], _ROW0, []),
        # two-sided: row 1's 0.3 < 0.5 is rejected too
        ("masked", 0.5, [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]], _ROW0 + _ROW1, []),
    ],
)
def test_geometric_level_by_hand(mode, low, weights, rejected, truncated):
    rollout = torch.tensor([[-1.0, -2.0, -0.3], [-0.7, -1.1, -0.2], [-0.5, -0.4, -3.0]])
    old = rollout + _GEO_RATIOS.log()
    w, rej, trunc = losses.importance_weights(old, rollout, _GEO_MASK, mode, "geometric", 2.0, low)
    torch.testing.assert_close(w, torch.tensor(weights))
    assert sorted(map(tuple, rej.nonzero().tolist())) == rejected
    assert sorted(map(tuple, trunc.nonzero().tolist())) == truncated


def test_geometric_level_keeps_a_long_response_that_sequence_level_rejects():
    # 10 tokens, each ratio 1.1: product 1.1^10 = 2.594 > 2 is rejected whole; geometric mean 1.1 is kept
    old, rollout, mask = torch.full((1, 10), math.log(1.1)), torch.zeros(1, 10), torch.ones(1, 10)
    w_seq, _, _ = losses.importance_weights(old, rollout, mask, "masked", "sequence", 2.0)
    w_geo, _, _ = losses.importance_weights(old, rollout, mask, "masked", "geometric", 2.0)
    torch.testing.assert_close(w_seq, torch.zeros(1, 10))
    torch.testing.assert_close(w_geo, torch.full((1, 10), 1.1))


def test_icepop_and_lower_bound_errors():
    old = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="token-level"):
        losses.importance_weights(old, old, torch.ones(1, 2), "icepop", "sequence", 5.0, 0.5)
    with pytest.raises(ValueError, match="threshold_low"):
        losses.importance_weights(old, old, torch.ones(1, 2), "icepop", "token", 5.0)
    with pytest.raises(ValueError, match="lower threshold"):
        losses.importance_weights(old, old, torch.ones(1, 2), "masked", "token", 2.0, 1.0)
    with pytest.raises(ValueError, match="no lower bound"):
        losses.importance_weights(old, old, torch.ones(1, 2), "truncated", "token", 2.0, 0.5)


def test_clipped_value_loss_by_hand():
    # eps_v = 0.2, V_old = 0.5 everywhere:
    #   V=1,   R=2:  clipped V 0.7: max(1, 1.69)/2 = 0.845  (clipped branch, grad 0)
    #   V=0,   R=0:  clipped V 0.3: max(0, 0.09)/2 = 0.045  (clipped branch, grad 0)
    #   V=0.5, R=-1: clipped V 0.5: max(2.25, 2.25)/2 = 1.125 (grad V - R = 1.5)
    values = torch.tensor([1.0, 0.0, 0.5], requires_grad=True)
    loss, clipped = losses.clipped_value_loss(values, torch.full((3,), 0.5), torch.tensor([2.0, 0.0, -1.0]), clip=0.2)
    torch.testing.assert_close(loss, torch.tensor([0.845, 0.045, 1.125]))
    assert clipped.tolist() == [True, True, False]
    loss.sum().backward()
    torch.testing.assert_close(values.grad, torch.tensor([0.0, 0.0, 1.5]))


def test_huge_log_ratio_stays_finite():
    ratio = losses.ppo_ratio(torch.tensor([[500.0]]), torch.tensor([[0.0]]))
    assert torch.isfinite(ratio).all()
    assert torch.isfinite(losses.kl_estimate(torch.tensor([-500.0]), torch.tensor([0.0]), "k3")).all()
