"""Algorithms by name: hand-computed losses, gradients and advantages, and micro-batch equivalence."""

from __future__ import annotations

import math
import typing

import pytest
import torch

from hetrl.config.algorithm import AlgorithmConfig, AlgorithmName
from hetrl.trainer.algorithms import (
    LossInputs,
    advantage_metrics,
    compute_advantages,
    compute_loss,
    compute_value_loss,
    compute_value_targets,
    shape_rewards,
)
from hetrl.trainer.losses import count_tokens_and_seqs

# Three responses: 3 tokens with advantage +1, 2 tokens with advantage -2, and a zero-length one.
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
ADV = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, 0.0], [0.0, 0.0, 0.0]])
LOGP = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, -7.0], [-9.0, -9.0, -9.0]])


def _on_policy(**extra) -> tuple[LossInputs, torch.Tensor]:
    logp = LOGP.clone().requires_grad_(True)
    return LossInputs(logprobs=logp, old_logprobs=logp.detach(), advantages=ADV, mask=MASK, **extra), logp


def _algo(name: str = "grpo", **kw) -> AlgorithmConfig:
    return AlgorithmConfig(name=name, is_correction=kw.pop("is_correction", "none"), **kw)


@pytest.mark.parametrize(
    ("name", "expected_loss", "expected_grad_rows"),
    [
        # token-mean over 5 tokens of -A r (r = 1): -(3*1 + 2*(-2)) / 5 = 0.2; grad -A/5
        ("grpo", 0.2, (-0.2, 0.4)),
        ("rloo", 0.2, (-0.2, 0.4)),
        ("reinforce_pp", 0.2, (-0.2, 0.4)),
        ("dapo", 0.2, (-0.2, 0.4)),
        # Dr. GRPO: sum / (max_len 4 * 2 seqs) = 1/8; grad -A/8
        ("dr_grpo", 0.125, (-0.125, 0.25)),
        # GSPO seq-mean-token-mean: -(1 + (-2)) / 2 = 0.5; grad row 0: -1/(3*2), row 1: 2/(2*2)
        ("gspo", 0.5, (-1 / 6, 0.5)),
    ],
)
def test_policy_loss_on_the_first_minibatch(name, expected_loss, expected_grad_rows):
    inputs, logp = _on_policy()
    loss, metrics = compute_loss(_algo(name), inputs, max_len=4)
    assert loss.item() == pytest.approx(expected_loss)
    assert metrics["loss/policy"].item() == pytest.approx(expected_loss)
    loss.backward()
    g0, g1 = expected_grad_rows
    torch.testing.assert_close(logp.grad, torch.tensor([[g0, g0, g0], [g1, g1, 0.0], [0.0, 0.0, 0.0]]))
    assert metrics["clip_frac/low"].item() == metrics["clip_frac/high"].item() == metrics["policy_kl"].item() == 0.0


def test_cispo_is_reinforce_weighted_by_the_clipped_ratio():
    inputs, logp = _on_policy()
    loss, _ = compute_loss(_algo("cispo"), inputs)
    # -(1*(-1 - 0.5 - 2) + (-2)*(-0.3 - 1.2)) / 5 = -(-3.5 + 3) / 5 = 0.1
    assert loss.item() == pytest.approx(0.1)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.2, -0.2, -0.2], [0.4, 0.4, 0.0], [0.0, 0.0, 0.0]]))


def _single_token(ratio: float, advantage: float) -> LossInputs:
    old = torch.tensor([[-1.0]])
    logp = (old + math.log(ratio)).requires_grad_(True)
    return LossInputs(logprobs=logp, old_logprobs=old, advantages=torch.tensor([[advantage]]), mask=torch.ones(1, 1))


def test_dapo_clips_higher_than_grpo():
    grpo_loss, grpo_m = compute_loss(_algo("grpo"), _single_token(1.25, 1.0))
    dapo_loss, dapo_m = compute_loss(_algo("dapo"), _single_token(1.25, 1.0))
    assert grpo_loss.item() == pytest.approx(-1.2) and grpo_m["clip_frac/high"].item() == 1.0
    assert dapo_loss.item() == pytest.approx(-1.25) and dapo_m["clip_frac/high"].item() == 0.0
    low_loss, low_m = compute_loss(_algo("dapo"), _single_token(0.7, -1.0))
    assert low_loss.item() == pytest.approx(0.8) and low_m["clip_frac/low"].item() == 1.0
    # approx KL(pi_old || pi) with r = 0.7: r - 1 - log r
    assert low_m["policy_kl"].item() == pytest.approx(0.7 - 1 - math.log(0.7))


def test_dual_clip_and_cispo_truncation_from_config():
    loss, metrics = compute_loss(_algo("grpo", dual_clip=3.0), _single_token(4.0, -1.0))
    assert loss.item() == pytest.approx(3.0) and metrics["clip_frac/dual"].item() == 1.0
    loss, metrics = compute_loss(_algo("cispo", cispo_clip_high=2.0), _single_token(5.0, 1.0))
    assert loss.item() == pytest.approx(-3.0 * (-1.0 + math.log(5.0)))  # -min(5, 3) * A * logp
    assert metrics["clip_frac/high"].item() == 1.0 and metrics["clip_frac/low"].item() == 0.0


def test_kl_and_entropy_terms():
    ref = LOGP - 0.5  # d = 0.5 on every token: k3 = e^-0.5 - 1 + 0.5, k2 = 0.125
    entropy = torch.tensor([[2.0, 2.0, 2.0], [1.0, 1.0, 9.0], [9.0, 9.0, 9.0]])  # token-mean 8/5
    inputs, _ = _on_policy(ref_logprobs=ref, entropy=entropy)
    loss, m = compute_loss(_algo("grpo", kl_coef=0.1, kl_estimator="k2", entropy_coef=0.01), inputs)
    k3 = math.exp(-0.5) - 0.5
    assert m["loss/kl"].item() == pytest.approx(0.125)  # the configured estimator, before kl_coef
    assert m["approx_kl"].item() == pytest.approx(k3)  # always k3
    assert m["loss/entropy"].item() == pytest.approx(1.6) and m["entropy"].item() == pytest.approx(1.6)
    assert loss.item() == pytest.approx(0.2 + 0.1 * 0.125 - 0.01 * 1.6)
    assert m["loss/total"].item() == pytest.approx(loss.item())
    # KL folded into the reward: measured, not added to the loss
    loss, m = compute_loss(_algo("grpo", kl_coef=0.1, kl_in_reward=True), _on_policy(ref_logprobs=ref)[0])
    assert loss.item() == pytest.approx(0.2) and "loss/kl" not in m and m["approx_kl"].item() == pytest.approx(k3)


@pytest.mark.parametrize(
    ("mode", "expected_loss", "weight_mean", "masked", "truncated"),
    [
        # weights [0.5, 2 (capped from 3), 1], [1, 1]: -(1*3.5 + (-2)*2) / 5 = 0.1
        ("truncated", 0.1, 5.5 / 5, 0.0, 0.2),
        # weights [0.5, 0 (rejected), 1], [1, 1]: -(1.5 - 4) / 5 = 0.5
        ("masked", 0.5, 3.5 / 5, 0.2, 0.0),
    ],
)
def test_importance_sampling_correction(mode, expected_loss, weight_mean, masked, truncated):
    w = torch.tensor([[0.5, 3.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    inputs, _ = _on_policy(rollout_logprobs=LOGP - w.log())
    loss, m = compute_loss(_algo("grpo", is_correction=mode, is_threshold=2.0), inputs)
    assert loss.item() == pytest.approx(expected_loss)
    assert m["is/weight_mean"].item() == pytest.approx(weight_mean)
    assert m["is/masked_frac"].item() == pytest.approx(masked)
    assert m["is/truncated_frac"].item() == pytest.approx(truncated)


def test_icepop_rejected_tokens_get_no_gradient():
    # ratios pi_old/mu: row 0 0.4 (below 0.5), 3 (above 2), 1; row 1 1.25, 1; row 2 is empty
    w = torch.tensor([[0.4, 3.0, 1.0], [1.25, 1.0, 1.0], [1.0, 1.0, 1.0]])
    inputs, logp = _on_policy(rollout_logprobs=LOGP - w.log())
    algo = _algo("grpo", is_correction="icepop", is_threshold=2.0)
    assert algo.resolved_is_threshold_low == 0.5
    loss, m = compute_loss(algo, inputs)
    # on-policy r = 1, weights [0, 0, 1], [1.25, 1]: -(1 * 1 + (-2) * 1.25 + (-2) * 1) / 5 = 3.5 / 5
    assert loss.item() == pytest.approx(0.7)
    assert m["is/masked_frac"].item() == pytest.approx(2 / 5)
    assert m["is/weight_mean"].item() == pytest.approx(3.25 / 5)
    assert m["is/truncated_frac"].item() == 0.0
    loss.backward()
    # d loss / d logp_t = -A_t w_t / 5 (dr/dlogp = r = 1): exactly 0 on the two rejected tokens
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 0.0, -0.2], [0.5, 0.4, 0.0], [0.0, 0.0, 0.0]]))
    assert logp.grad[0, 0].item() == 0.0 and logp.grad[0, 1].item() == 0.0


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"is_correction": "icepop", "is_level": "sequence"}, "icepop masks single tokens.*is_level='sequence'"),
        ({"is_correction": "icepop", "is_level": "geometric"}, "is_correction=masked with is_threshold_low"),
        (
            {"is_correction": "truncated", "is_threshold_low": 0.5},
            "is_threshold_low set, but .*'truncated' has no lower",
        ),
        ({"is_correction": "masked", "is_threshold_low": 1.0}, "less than 1"),
        ({"is_correction": "masked", "is_threshold_low": 0.0}, "greater than 0"),
    ],
)
def test_is_config_refusals(kw, match):
    with pytest.raises(ValueError, match=match):
        AlgorithmConfig(**kw)


def test_is_threshold_low_defaults():
    assert AlgorithmConfig(is_correction="masked").resolved_is_threshold_low is None
    assert AlgorithmConfig(is_correction="masked", is_threshold_low=0.3).resolved_is_threshold_low == 0.3
    assert (
        AlgorithmConfig(is_correction="icepop", is_threshold_low=0.2, is_threshold=5.0).resolved_is_threshold_low == 0.2
    )
    assert AlgorithmConfig(is_correction="masked", is_level="geometric").is_level == "geometric"


def test_ppo_value_loss_is_the_clipped_value_loss():
    returns = torch.tensor([[1.0, 1.0, 1.0], [0.5, 0.5, 0.0], [0.0, 0.0, 0.0]])
    values = torch.zeros(3, 3, requires_grad=True)
    loss, m = compute_value_loss(_algo("ppo"), values, torch.zeros(3, 3), returns, MASK)
    # value loss 0.5 (V - R)^2: 0.5 x3, 0.125 x2 -> token-mean 1.75 / 5 = 0.35
    assert m["loss/value"].item() == pytest.approx(0.35)
    assert m["value/clip_frac"].item() == 0.0 and m["value/mean"].item() == 0.0
    assert loss.item() == pytest.approx(0.35)
    loss.backward()
    torch.testing.assert_close(values.grad, -returns * MASK / 5)
    # V moved 0.5 from V_old = 0 with value_clip 0.2: for R = 1 the clipped branch (0.2 - 1)^2 is the
    # larger, for R = 0 the unclipped one (0.5 - 0)^2
    moved, targets = torch.full((3, 3), 0.5), torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    _, m = compute_value_loss(_algo("ppo", value_clip=0.2), moved, torch.zeros(3, 3), targets, MASK)
    assert m["value/clip_frac"].item() == pytest.approx(3 / 5)
    assert "loss/value" not in compute_loss(_algo("ppo"), _on_policy()[0])[1]  # the policy's loss has no value part


def test_missing_inputs_are_reported():
    with pytest.raises(ValueError, match="ref_logprobs"):
        compute_loss(_algo("grpo", kl_coef=0.1), _on_policy()[0])
    with pytest.raises(ValueError, match="entropy"):
        compute_loss(_algo("grpo", entropy_coef=0.1), _on_policy()[0])
    with pytest.warns(UserWarning, match="rollout_logprobs"):
        compute_loss(_algo("grpo", is_correction="truncated"), _on_policy()[0])


def test_metric_keys_are_stable():
    inputs, _ = _on_policy(rollout_logprobs=LOGP, ref_logprobs=LOGP, entropy=torch.ones(3, 3))
    _, m = compute_loss(_algo("grpo", is_correction="truncated", kl_coef=0.1, entropy_coef=0.1), inputs)
    assert set(m) == {
        "loss/total",
        "loss/policy",
        "loss/kl",
        "loss/entropy",
        "clip_frac/low",
        "clip_frac/high",
        "policy_kl",
        "approx_kl",
        "entropy",
        "is/weight_mean",
        "is/masked_frac",
        "is/truncated_frac",
    }
    assert all(not v.requires_grad and v.dim() == 0 for v in m.values())


def _random_batch(gen: torch.Generator) -> dict[str, torch.Tensor]:
    lengths = torch.tensor([7, 3, 0, 5, 1, 6])
    shape = (6, 7)
    mask = (torch.arange(7)[None] < lengths[:, None]).float()
    mask[0, 2] = 0.0  # an environment token inside a response
    rand = lambda scale=1.0: torch.randn(shape, generator=gen) * scale  # noqa: E731
    logp = -rand().abs()
    return {
        "logprobs": logp,
        "old_logprobs": logp + rand(0.3),
        "rollout_logprobs": logp + rand(0.5),
        "ref_logprobs": logp + rand(0.2),
        "entropy": rand().abs(),
        "advantages": rand(),
        "mask": mask,
    }


@pytest.mark.parametrize(
    "is_kw",
    [
        {"is_correction": "truncated", "is_level": "sequence"},
        {"is_correction": "icepop"},
        {"is_correction": "masked", "is_level": "geometric", "is_threshold_low": 0.8},
    ],
    ids=["truncated-sequence", "icepop", "masked-geometric"],
)
@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("name", typing.get_args(AlgorithmName))
def test_micro_batches_with_global_normalisers_equal_the_full_batch(name, aggregation, is_kw):
    algo = AlgorithmConfig(
        name=name, loss_aggregation=aggregation, kl_coef=0.05, entropy_coef=0.01, dual_clip=3.0, **is_kw
    )
    batch = _random_batch(torch.Generator().manual_seed(1))
    gen = torch.Generator().manual_seed(3)
    value_fields = {key: torch.randn(6, 7, generator=gen) for key in ("values", "old_values", "returns")}
    logp = batch["logprobs"].clone().requires_grad_(True)
    values = value_fields["values"].clone().requires_grad_(True)

    def run(rows: slice, width: int, **norm) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        fields = {k: v[rows, :width] for k, v in batch.items()} | {"logprobs": logp[rows, :width]}
        loss, metrics = compute_loss(algo, LossInputs(**fields), max_len=9, **norm)
        if name == "ppo":  # the critic's loss, aggregated the same way
            value_loss, value_metrics = compute_value_loss(
                algo,
                values[rows, :width],
                value_fields["old_values"][rows, :width],
                value_fields["returns"][rows, :width],
                batch["mask"][rows, :width],
                max_len=9,
                **norm,
            )
            loss, metrics = loss + value_loss, metrics | value_metrics
        return loss, metrics

    full_loss, full_metrics = run(slice(0, 6), 7)
    full_loss.backward()
    full_grads = (logp.grad.clone(), values.grad)
    logp.grad, values.grad = None, None

    num_tokens, num_seqs = count_tokens_and_seqs(batch["mask"])
    # micro-batches of 2, 1 (the empty response) and 3 rows, each cut to its own padded width
    parts = [
        run(rows, width, num_global_tokens=num_tokens, num_global_seqs=num_seqs)
        for rows, width in ((slice(0, 2), 7), (slice(2, 3), 1), (slice(3, 6), 6))
    ]
    summed = sum(loss for loss, _ in parts)
    summed.backward()
    torch.testing.assert_close(summed, full_loss)
    torch.testing.assert_close(logp.grad, full_grads[0])
    if name == "ppo":
        torch.testing.assert_close(values.grad, full_grads[1])
    for key, value in full_metrics.items():
        torch.testing.assert_close(sum(m[key] for _, m in parts), value, msg=key)


GROUP_MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])


@pytest.mark.parametrize(
    ("name", "row_advantages"),
    [
        (
            "grpo",
            [0.5 / 0.5**0.5, -0.5 / 0.5**0.5, 0.0, 0.0],
        ),  # group a: 1, 0 -> +-0.5 / std 0.7071; group b: all equal
        ("dr_grpo", [0.5, -0.5, 0.0, 0.0]),
        ("rloo", [1.0, -1.0, 0.0, 0.0]),
    ],
)
def test_group_advantages_by_name(name, row_advantages):
    out = compute_advantages(_algo(name), torch.tensor([1.0, 0.0, 2.0, 2.0]), ["a", "a", "b", "b"], GROUP_MASK)
    torch.testing.assert_close(out, torch.tensor(row_advantages)[:, None] * GROUP_MASK, atol=1e-5, rtol=0)


def test_group_advantages_of_token_rewards_use_the_response_total():
    token_rewards = torch.tensor([[0.5, 0.5], [0.0, 0.0], [2.0, 0.0], [2.0, 0.0]])  # totals 1, 0, 2, 2
    out = compute_advantages(_algo("dr_grpo"), token_rewards, ["a", "a", "b", "b"], GROUP_MASK)
    torch.testing.assert_close(out, torch.tensor([0.5, -0.5, 0.0, 0.0])[:, None] * GROUP_MASK)


def test_reinforce_pp_by_name():
    # returns-to-go 1, 1 | 0: mean 2/3, unbiased std sqrt(1/3)
    out = compute_advantages(
        _algo("reinforce_pp"), torch.tensor([1.0, 0.0]), [0, 1], torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    )
    s = (1 / 3) ** 0.5
    torch.testing.assert_close(out, torch.tensor([[(1 / 3) / s, (1 / 3) / s], [(-2 / 3) / s, 0.0]]), atol=1e-5, rtol=0)


def test_ppo_gae_advantages_and_value_targets():
    algo = _algo("ppo", gamma=1.0, lam=1.0)
    mask = torch.ones(1, 2)
    values = torch.tensor([[0.2, 0.6]])
    # delta = 0.6 - 0.2 = 0.4, 1 - 0.6 = 0.4 -> A = 0.8, 0.4 -> whitened +-0.7071; targets A + V = 1, 1
    out = compute_advantages(algo, torch.tensor([1.0]), [0], mask, values=values)
    torch.testing.assert_close(out, torch.tensor([[0.5**0.5, -(0.5**0.5)]]), atol=1e-5, rtol=0)
    torch.testing.assert_close(compute_value_targets(algo, torch.tensor([1.0]), mask, values), torch.ones(1, 2))
    with pytest.raises(ValueError, match="values"):
        compute_advantages(algo, torch.tensor([1.0]), [0], mask)
    with pytest.raises(ValueError, match="rewards"):
        compute_advantages(algo, torch.tensor([1.0, 2.0]), [0, 0], mask, values=values)


def test_shape_rewards_overlong_and_kl():
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    # L_max 4, buffer 2: lengths 3, 4 -> (2 - 3)/2 = -0.5, (2 - 4)/2 = -1
    out, metrics = shape_rewards(_algo("dapo", overlong_buffer=2), torch.tensor([1.0, 1.0]), mask, max_tokens=4)
    torch.testing.assert_close(out, torch.tensor([0.5, 0.0]))
    assert metrics == {"reward/shaped_mean": 0.25}
    with pytest.raises(ValueError, match="max_tokens"):
        shape_rewards(_algo("dapo", overlong_buffer=2), torch.tensor([1.0, 1.0]), mask)
    # k1 = 0.2 per token, beta 0.5: -0.1 per policy token, the score on the last one
    old = torch.zeros(1, 3)
    algo = _algo("reinforce_pp", kl_coef=0.5, kl_estimator="k1", kl_in_reward=True)
    out, metrics = shape_rewards(
        algo, torch.tensor([1.0]), torch.tensor([[1.0, 1.0, 0.0]]), old_logprobs=old, ref_logprobs=old - 0.2
    )
    torch.testing.assert_close(out, torch.tensor([[-0.1, 0.9, 0.0]]))
    assert metrics == pytest.approx({"reward/shaped_mean": 0.8, "reward/kl_penalty": 0.2})
    with pytest.raises(ValueError, match="ref_logprobs"):
        shape_rewards(algo, torch.tensor([1.0]), torch.ones(1, 3))


def test_advantage_metrics():
    # policy-token advantages 1, 1, 1, -2, -2 (junk 5 on padding): mean -0.2, population std sqrt(2.16)
    advantages = ADV.clone()
    advantages[1, 2] = 5.0
    out = advantage_metrics(advantages, MASK)
    assert out["advantage/mean"] == pytest.approx(-0.2)
    assert out["advantage/std"] == pytest.approx(2.16**0.5)
    assert advantage_metrics(ADV, torch.zeros(3, 3)) == {"advantage/mean": 0.0, "advantage/std": 0.0}


def test_metric_names_are_documented_or_declared():
    from hetrl.monitor import names
    from hetrl.trainer import algorithms

    declared = {
        algorithms.IS_WEIGHT_MEAN,
        algorithms.IS_MASKED_FRAC,
        algorithms.IS_TRUNCATED_FRAC,
        algorithms.VALUE_CLIP_FRAC,
        algorithms.CLIP_FRAC_DUAL,
    }
    algo = AlgorithmConfig(name="ppo", kl_coef=0.1, entropy_coef=0.1, dual_clip=3.0, is_correction="masked")
    _, m = compute_loss(algo, LossInputs(**_random_batch(torch.Generator().manual_seed(0))))
    _, value_metrics = compute_value_loss(
        algo, torch.zeros(2, 2), torch.zeros(2, 2), torch.ones(2, 2), torch.ones(2, 2)
    )
    m |= value_metrics
    assert declared <= set(m)
    assert [k for k in m if k not in declared and names.spec_of(k) is None] == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    algo = AlgorithmConfig(name="dapo", kl_coef=0.05, entropy_coef=0.01, is_correction="masked")
    batch = _random_batch(torch.Generator().manual_seed(2))
    group_ids = [0, 0, 1, 1, 2, 2]
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5, 2.0, 1.0])
    results = []
    for device in ("cpu", "cuda"):
        on = {k: v.to(device) for k, v in batch.items()}
        on["advantages"] = compute_advantages(algo, rewards.to(device), group_ids, on["mask"])
        logp = on["logprobs"].clone().requires_grad_(True)
        loss, metrics = compute_loss(algo, LossInputs(**(on | {"logprobs": logp})))
        loss.backward()
        results.append((loss.cpu(), logp.grad.cpu(), {k: v.cpu() for k, v in metrics.items()}))
    (cpu_loss, cpu_grad, cpu_m), (gpu_loss, gpu_grad, gpu_m) = results
    torch.testing.assert_close(gpu_loss, cpu_loss)
    torch.testing.assert_close(gpu_grad, cpu_grad)
    for key in cpu_m:
        torch.testing.assert_close(gpu_m[key], cpu_m[key], msg=key)
