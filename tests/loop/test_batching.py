"""The orchestrator's batch checks."""

import pytest

from hetrl.loop.batching import require_room
from hetrl.records import Sample, SampleMeta


def _sample(sample_id: str, length: int, reward: float) -> Sample:
    return Sample(
        sample_id=sample_id,
        group_id="g0",
        task_name="t",
        prompt_ids=[1, 2],
        completion_ids=[5] * length,
        loss_mask=[1] * length,
        logprobs=[-0.5] * length,
        versions=[0] * length,
        reward=reward,
    )


def test_a_batch_without_room_to_generate_is_a_config_error():
    roomy, full = _sample("g0.0", 3, 0.0), _sample("g0.1", 0, 0.0)
    full.info = {"stop_reason": "prompt_too_long"}
    require_room([SampleMeta.of(roomy), SampleMeta.of(full)], max_episode_tokens=16, what="evaluation")  # fine
    with pytest.raises(ValueError, match=r"every prompt \(1, the shortest 2 tokens\) fills env.max_episode_tokens=16"):
        require_room([SampleMeta.of(full)], max_episode_tokens=16, what="evaluation")
