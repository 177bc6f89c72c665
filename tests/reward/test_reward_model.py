"""The reward model a reward server holds, and the reward function that asks it."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hetrl.config.model import ModelConfig  # noqa: E402
from hetrl.config.reward import RewardConfig, RewardModelConfig  # noqa: E402
from hetrl.models.hf import build_random_hf_checkpoint  # noqa: E402
from hetrl.records import Sample  # noqa: E402
from hetrl.reward.reward_model import RewardModelReward  # noqa: E402
from hetrl.reward.rubric import Rubric  # noqa: E402
from hetrl.reward.serving import RewardModelScorer  # noqa: E402


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    return build_random_hf_checkpoint(ModelConfig(), tmp_path_factory.mktemp("policy"), seed=0)


@pytest.fixture(scope="module")
def scorer(policy_dir):
    return RewardModelScorer(policy_dir, RewardModelConfig(batch_size=2, max_length=48), seed=0, fresh_head=True)


def chat(prompt, response):
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]


PAIRS = [
    chat("What is 2+2?", "4"),
    chat("Name a colour.", "A long answer: blue, like the sky at noon."),
    chat("Hi", ""),
]


def test_batched_scores_match_single_ones(scorer):
    singles = [scorer.score([pair])[0] for pair in PAIRS]
    assert scorer.score(PAIRS) == pytest.approx(singles, abs=1e-5)  # padding and batch split leak nothing
    assert len({round(x, 6) for x in singles}) == 3


def test_the_fresh_head_is_seeded(policy_dir, scorer):
    again = RewardModelScorer(policy_dir, RewardModelConfig(batch_size=2, max_length=48), seed=0, fresh_head=True)
    other = RewardModelScorer(policy_dir, RewardModelConfig(batch_size=2, max_length=48), seed=1, fresh_head=True)
    assert again.score(PAIRS) == pytest.approx(scorer.score(PAIRS)) and other.score(PAIRS) != pytest.approx(
        scorer.score(PAIRS)
    )


def test_left_truncation_keeps_the_response(scorer):
    long_prompt = "blah " * 100
    assert scorer.score([chat(long_prompt, "4")]) == pytest.approx(
        scorer.score([chat("x " + long_prompt, "4")]), abs=1e-5
    )
    assert scorer.score([chat(long_prompt, "4")]) != pytest.approx(scorer.score([chat(long_prompt, "5")]), abs=1e-7)


class FakeServer:
    def __init__(self, scorer):
        self.scorer, self.asked = scorer, []

    def reward_model(self, messages):
        self.asked.append(messages)
        return self.scorer.score([messages])[0]


def test_usable_as_a_weighted_reward_function(scorer):
    server = FakeServer(scorer)
    config = RewardConfig(
        functions=[{"name": "reward_model", "weight": 0.5, "kwargs": {"scale": 2.0}}], reward_model={"path": "policy"}
    )
    rubric = Rubric.from_config(config, resources={"reward_server": server})
    sample = Sample(
        "s",
        "g",
        "t",
        [1, 2],
        [3, 4],
        [1, 1],
        [0.0, 0.0],
        [0, 0],
        prompt_text="<user>What is 2+2?",
        completion_text="4</s>",
        info={"messages": chat("What is 2+2?", "4")},
    )
    out = rubric.score(sample)
    assert server.asked == [chat("What is 2+2?", "4")]  # the conversation, not the templated text
    assert (
        out.total == pytest.approx(0.5 * 2.0 * scorer.score([chat("What is 2+2?", "4")])[0], abs=1e-6) and not out.flags
    )
    assert isinstance(RewardModelReward(server), RewardModelReward)


def test_a_conversation_the_template_refuses_is_its_own_error(scorer, monkeypatch):
    template = scorer.tokenizer.apply_chat_template

    def strict(messages, **kwargs):
        if any(m["role"] == "tool" for m in messages):
            raise ValueError("roles must alternate user/assistant")
        return template(messages, **kwargs)

    monkeypatch.setattr(scorer.tokenizer, "apply_chat_template", strict)
    refused = [*PAIRS[0], {"role": "tool", "content": "ok"}]
    results = scorer.score([PAIRS[0], refused, PAIRS[1]])
    assert isinstance(results[1], ValueError) and results[0] == pytest.approx(scorer.score([PAIRS[0]])[0], abs=1e-5)
    assert results[2] == pytest.approx(scorer.score([PAIRS[1]])[0], abs=1e-5)
