"""The rollout role: vLLM generation engines that stream samples out and take versioned weight pushes."""

from hetrl.rollout.engine import GenerationEngine, check_servable, checkpoint_weights, configure_vllm_environment

__all__ = ["GenerationEngine", "check_servable", "checkpoint_weights", "configure_vllm_environment"]
