"""Rewards: a rubric of weighted reward functions, verifiers, reward models, a judge, hacking defenses.

Heavy pieces (math-verify, torch, the sandbox) are imported by their own modules only.
"""

from hetrl.reward.base import RewardOutcome, RewardValue
from hetrl.reward.rubric import Rubric
from hetrl.reward.worker import ConcurrentScorer

__all__ = ["ConcurrentScorer", "RewardOutcome", "RewardValue", "Rubric"]
