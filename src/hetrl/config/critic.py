"""``critic:`` — PPO's value model (read only when ``algorithm.name=ppo``).

The critic has the policy's architecture with a scalar head and lives on the trainer ranks in the
trainer's TP/PP/CP/DP layout; it has an optimizer of its own, configured like the policy's
(``trainer.*``) except for the keys below.
"""

from __future__ import annotations

from pydantic import Field

from hetrl.config.base import Section


class CriticConfig(Section):
    init: str = Field(
        "policy",
        description="Where the value model starts: 'policy' (the policy's initial weights, the value head drawn "
        "fresh), 'fresh' "
        "(random init), or the path of an HF token-classification checkpoint (Llama/Qwen layout, score.weight [1, "
        "hidden]).",
    )
    lr: float = Field(
        1e-5,
        gt=0.0,
        description="Peak learning rate of the value model (its schedule: trainer.lr_warmup_steps, lr_decay_style...).",
    )
