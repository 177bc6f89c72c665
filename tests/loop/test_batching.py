"""The orchestrator's advantages: the recipe's reward shaping is applied, or refused up front."""

import pytest

from hetrl.config.algorithm import AlgorithmConfig
from hetrl.loop.batching import advantages_for, check_loop_support, require_room
from hetrl.types import Sample


def _sample(sample_id: str, length: int, reward: float) -> Sample:
    return Sample(sample_id=sample_id, group_id="g0", task_name="t", prompt_ids=[1, 2], completion_ids=[5] * length,
                  loss_mask=[1] * length, logprobs=[-0.5] * length, versions=[0] * length, reward=reward)


def test_overlong_penalty_shapes_the_advantages():
    """Same verifier reward; the sample cut at max_tokens=8 is penalised (DAPO), the short one is not."""
    samples = [_sample("g0.0", 4, 1.0), _sample("g0.1", 8, 1.0)]
    plain = advantages_for(AlgorithmConfig(name="grpo", group_size=2), samples, max_tokens=8)
    assert plain == [[0.0] * 4, [0.0] * 8]  # equal rewards: no signal
    shaped = advantages_for(AlgorithmConfig(name="grpo", group_size=2, overlong_buffer=2, overlong_penalty=0.5), samples, max_tokens=8)
    assert shaped[0][0] > 0 > shaped[1][0]
    assert len(set(shaped[0])) == 1 and len(set(shaped[1])) == 1  # one advantage per sequence


def test_kl_folded_into_the_reward_is_refused_before_the_run():
    check_loop_support(AlgorithmConfig(name="grpo", kl_coef=0.1))
    with pytest.raises(ValueError, match="kl_in_reward=true is not supported by the RL loop"):
        check_loop_support(AlgorithmConfig(name="grpo", kl_coef=0.1, kl_in_reward=True))


def test_a_batch_without_room_to_generate_is_a_config_error():
    roomy, full = _sample("g0.0", 3, 0.0), _sample("g0.1", 0, 0.0)
    full.info = {"stop_reason": "prompt_too_long"}
    require_room([roomy, full], max_episode_tokens=16, what="evaluation")  # some had room: fine
    with pytest.raises(ValueError, match=r"every prompt \(1, the shortest 2 tokens\) fills env.max_episode_tokens=16"):
        require_room([full], max_episode_tokens=16, what="evaluation")
