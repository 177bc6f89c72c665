import pytest

from hetrl.records import Sample
from hetrl.reward.shaping import FormatReward, LengthPenalty, NumericCloseness, OverlongPenalty, RepetitionPenalty


def s(n=0, ids=None, text="", finish="stop"):
    ids = ids if ids is not None else list(range(n))
    return Sample(
        "s",
        "g",
        "t",
        [1],
        ids,
        [1] * len(ids),
        [0.0] * len(ids),
        [0] * len(ids),
        finish_reason=finish,
        completion_text=text,
    )


@pytest.mark.parametrize("length, expected", [(10, 0.0), (12, 0.0), (14, -0.5), (16, -1.0), (17, -1.0)])
def test_dapo_overlong(length, expected):
    # L_max = 16, L_cache = 4: zero up to 12, then linear to -1 at 16, -1 beyond
    assert OverlongPenalty(16, 4)(s(length)).score == pytest.approx(expected)


def test_overlong_truncated_sample_gets_full_penalty():
    v = OverlongPenalty(16, 4, penalty=0.5)(s(5, finish="length"))
    assert v.score == -0.5 and "length/truncated" in v.flags


def test_length_and_repetition():
    assert LengthPenalty(10, coef=2.0)(s(15)).score == pytest.approx(-1.0)
    assert LengthPenalty(10)(s(5)).score == 0.0
    loop = RepetitionPenalty(ngram=2, threshold=0.3)(s(ids=[7, 8] * 20))
    assert loop.score < -0.9 and "repetition/degenerate" in loop.flags
    assert RepetitionPenalty(ngram=2)(s(ids=list(range(40)))).score == 0.0


def test_format():
    fmt = FormatReward()
    assert fmt(s(text="<think>hmm</think> so \\boxed{3}")).score == 1.0
    assert fmt(s(text="\\boxed{3}")).score == 0.0
    assert fmt(s(text="<think>hmm so \\boxed{3}")).score == 0.0


def test_invalid_arguments():
    with pytest.raises(ValueError):
        OverlongPenalty(10, 20)
    with pytest.raises(ValueError):
        RepetitionPenalty(ngram=0)


@pytest.mark.parametrize(
    "completion, answer, expected, flag",
    [
        ("<answer>12</answer>", "12", 1.0, None),
        ("<answer>9</answer>", "12", 0.7, None),  # 1 - 3/10
        ("<answer>40</answer>", "12", 0.0, None),  # further than the scale: no credit, never negative
        ("<answer>1</answer> <answer>12</answer>", "12", 1.0, None),  # the last tagged answer counts
        ("12", "12", 0.0, "closeness/no_number"),  # outside the tags
        ("<answer>12 or 13</answer>", "12", 0.0, "closeness/no_number"),  # not a plain number
        ("<answer>3</answer>", "x+1", 0.0, "closeness/reference_not_numeric"),
    ],
)
def test_numeric_closeness(completion, answer, expected, flag):
    sample = Sample("s", "g", "t", [1], [2], [1], [0.0], [0], completion_text=completion, answer=answer)
    value = NumericCloseness(scale=10.0)(sample)
    assert value.score == pytest.approx(expected)
    assert value.flags == ([flag] if flag else [])
    with pytest.raises(ValueError):
        NumericCloseness(scale=0)
