"""Numbers computed from samples: rewards, lengths, staleness, MFU, mismatch, pass@k / mean@k."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from hetrl.monitor.eval import eval_metrics, mean_at_k, pass_at_k
from hetrl.monitor.metrics import mfu, rollout_metrics, staleness_metrics
from hetrl.monitor.mismatch import mismatch_metrics
from hetrl.records import REWARD_METRICS_KEY, Sample, SampleMeta


def _s(i, reward, n_tokens, task="a", rewards=None, finish="stop", flags=(), versions=None, group="g"):
    return Sample(
        sample_id=f"s{i}",
        group_id=group,
        task_name=task,
        prompt_ids=[1],
        completion_ids=[0] * n_tokens,
        loss_mask=[1] * n_tokens,
        logprobs=[0.0] * n_tokens,
        versions=versions or [0] * n_tokens,
        finish_reason=finish,
        rewards=rewards or {},
        reward=reward,
        flags=list(flags),
        num_turns=i + 1,
        num_tool_calls=2 * i,
    )


def _metas(samples: list[Sample]) -> list[SampleMeta]:
    return [SampleMeta.of(s) for s in samples]


def test_rollout_metrics_by_hand():
    samples = [
        _s(0, 1.0, 4, "a", {"acc": 1.0}, flags=["x"]),
        _s(1, 0.0, 8, "b", {"acc": 0.0, "fmt": 0.5}, finish="length"),
        _s(2, 0.5, 6, "a", {"acc": 1.0, "fmt": 1.0}, flags=["x", "y"]),
    ]
    m = rollout_metrics(_metas(samples))
    assert m["reward/mean"] == pytest.approx(0.5) and m["reward/std"] == pytest.approx(np.std([1, 0, 0.5]))
    assert (m["reward/min"], m["reward/max"]) == (0.0, 1.0)
    assert m["reward/acc/mean"] == pytest.approx(2 / 3) and m["reward/fmt/mean"] == pytest.approx(
        0.75
    )  # fmt: 2 samples
    assert m["reward/task/a/mean"] == pytest.approx(0.75) and m["reward/task/b/max"] == 0.0
    assert (m["response_length/mean"], m["response_length/max"]) == (6.0, 8.0)
    assert m["response_length/truncated_frac"] == pytest.approx(1 / 3)
    assert m["episode/turns_mean"] == 2.0 and m["episode/tool_calls_mean"] == 2.0
    assert (
        m["flags/frac"] == pytest.approx(2 / 3)
        and m["flags/x_frac"] == pytest.approx(2 / 3)
        and m["flags/y_frac"] == pytest.approx(1 / 3)
    )
    assert rollout_metrics([]) == {}
    assert "hack/proxy_corr" not in m and "judge/failed_frac" not in m


def test_served_model_metrics_by_hand():
    samples = [
        _s(i, 0.0, 2, rewards={"reward_model": rm, "math": right})
        for i, (rm, right) in enumerate([(1.0, 1.0), (2.0, 0.0), (3.0, 0.0)])
    ]
    for s, failed, mass in zip(samples, (1.0, 0.0, 0.0), (None, 0.5, 0.7)):
        s.info[REWARD_METRICS_KEY] = {
            "judge/failed_frac": failed,
            "reward/hacked": 0.0,
            **({"judge/score_mass": mass} if mass else {}),
        }
    m = rollout_metrics(_metas(samples))
    assert m["judge/failed_frac"] == pytest.approx(1 / 3) and m["judge/score_mass"] == pytest.approx(
        0.6
    )  # over samples that have it
    assert "reward/hacked" not in m  # the rubric's own bookkeeping is no documented metric
    assert m["hack/proxy_corr"] == pytest.approx(np.corrcoef([1, 2, 3], [1, 0, 0])[0, 1]) and m["hack/proxy_corr"] < 0
    del samples[0].rewards["math"]  # a sample without a verifiable source: no correlation that step
    assert "hack/proxy_corr" not in rollout_metrics(_metas(samples))


def test_staleness():
    samples = [_s(0, 0, 2, versions=[3, 4]), _s(1, 0, 2, versions=[5, 5])]
    m = staleness_metrics(_metas(samples), trainer_version=6, num_dropped=2)
    assert m == {"staleness/dropped": 2.0, "staleness/mean": 2.0, "staleness/max": 3.0}


def test_mfu():
    assert mfu(tokens_per_s=1000, num_params=1e9, peak_flops_per_device=1e15, num_devices=6) == pytest.approx(1e-3)
    with pytest.raises(ValueError):
        mfu(1, 1, 0, 1)


def test_mismatch_by_hand():
    engine = [[-1.0, -2.0, -0.5], [-1.0]]
    trainer = [[-1.0, -1.0, -3.0], [-1.5]]
    masks = [[1, 1, 0], [1]]  # third token of sample 0 is an env token: ignored
    m = mismatch_metrics(engine, trainer, masks)
    log_r = np.array([0.0, 1.0, -0.5])
    assert m["mismatch/prob_ratio_mean"] == pytest.approx(np.exp(log_r).mean())
    assert m["mismatch/k3_kl"] == pytest.approx((np.exp(log_r) - 1 - log_r).mean())
    assert m["mismatch/max_abs_logprob_diff"] == pytest.approx(1.0)
    identical = mismatch_metrics(engine, engine)
    assert identical["mismatch/prob_ratio_mean"] == 1.0 and identical["mismatch/k3_kl"] == 0.0
    assert mismatch_metrics([[]], [[]]) == {}
    with pytest.raises(ValueError, match="differ in length"):
        mismatch_metrics([[0.0]], [[0.0, 0.0]])


def _pass_at_k_bruteforce(n, c, k):
    outcomes = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n,c,k", [(5, 0, 1), (5, 2, 1), (5, 2, 3), (6, 5, 2), (10, 3, 4), (4, 4, 4), (8, 1, 8)])
def test_pass_at_k_matches_combinatorics(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(_pass_at_k_bruteforce(n, c, k), abs=1e-12)
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)


def test_pass_at_k_large_n_stable():
    assert pass_at_k(200, 1, 100) == pytest.approx(0.5)
    assert 0.0 <= pass_at_k(1000, 3, 10) <= 1.0 and math.isfinite(pass_at_k(1000, 3, 10))
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_eval_metrics_groups_by_prompt_and_task():
    samples = (
        [_s(i, r, 1, task="t", group="p0") for i, r in enumerate([1, 0, 0, 0])]
        + [_s(i, r, 1, task="t", group="p1") for i, r in enumerate([1, 1, 0, 1])]
        + [_s(i, r, 1, task="u", group="q0") for i, r in enumerate([0, 0, 0, 0])]
    )
    m = eval_metrics(_metas(samples), ks=[1, 2])
    assert m["eval/t/pass@1"] == pytest.approx((0.25 + 0.75) / 2)
    assert m["eval/t/pass@2"] == pytest.approx((pass_at_k(4, 1, 2) + pass_at_k(4, 3, 2)) / 2)
    assert m["eval/t/mean@1"] == pytest.approx((1 + 1) / 2) and m["eval/t/mean@2"] == pytest.approx((0.5 + 1.0) / 2)
    assert m["eval/u/pass@2"] == 0.0
    assert mean_at_k([[1, 0], [0.5]]) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="needs >= 8 samples"):
        eval_metrics(_metas(samples), ks=[8])


def test_free_form_task_and_flag_names_become_valid_segments():
    from hetrl.monitor import names

    samples = [
        _s(0, 1.0, 2, task="reasoning_gym/basic_arithmetic", rewards={"judge:v1": 1.0}, flags=["hack/exit_early"])
    ]
    m = rollout_metrics(_metas(samples))
    assert m["reward/task/reasoning_gym.basic_arithmetic/mean"] == 1.0
    assert m["flags/hack.exit_early_frac"] == 1.0 and m["reward/judge.v1/mean"] == 1.0
    assert all(names.check_name(k) == k for k in m)
    assert "eval/reasoning_gym.basic_arithmetic/pass@1" in eval_metrics(_metas(samples), ks=[1])
