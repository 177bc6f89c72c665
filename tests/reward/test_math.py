import time

import pytest

from hetrl.reward.deadline import DeadlineCaller
from hetrl.reward.hacking import MULTIPLE_ANSWERS
from hetrl.reward.math import PARTIAL_PARSE, TIMEOUT, TOLERANCE_FALSE_POSITIVE, MathReward, boxed_contents, check_answer, integer_verdict
from hetrl.types import Sample


@pytest.mark.parametrize(
    "completion, gold, correct, flag",
    [
        ("so \\boxed{42}", "42", True, None),
        ("\\boxed{0.5}", "\\frac12", True, None),
        ("\\boxed{\\frac{1}{2^{99}}}", "\\frac{1}{2^{99}}", True, None),
        ("\\boxed{\\frac{1}{2^{98}}}", "\\frac{1}{2^{99}}", False, TOLERANCE_FALSE_POSITIVE),  # math-verify alone says True
        ("\\boxed{2} and then \\boxed{3}", "3", False, MULTIPLE_ANSWERS),
        ("\\boxed{5 or 7}", "5", False, MULTIPLE_ANSWERS),
        ("\\boxed{2.5.3}", "2.5", False, PARTIAL_PARSE),
        ("\\boxed{12345 6789}", "19134", False, PARTIAL_PARSE),  # sympy would add the juxtaposed numbers
        ("x = \\boxed{3}, i.e. \\boxed{3}", "3", True, None),  # the same answer twice is fine
        ("\\boxed{\\{1,2\\}}", "\\{1,2\\}", True, None),
        ("\\boxed{7}", "8", False, None),
        ("no answer here", "8", False, "math/no_answer"),
    ],
)
def test_guards(completion, gold, correct, flag):
    verdict = check_answer(completion, gold)
    assert verdict.correct is correct, verdict
    assert (flag in verdict.flags) if flag else not verdict.flags


@pytest.mark.parametrize("completion, gold", [("7", "7"), (" 12 ", "12"), ("-3", "-3"), ("007", "7"), ("7", "8"), ("-7", "7"),
                                              ("123456789012345678901234567890", "123456789012345678901234567891")])
def test_plain_integers_are_judged_in_process_as_math_verify_judges_them(completion, gold):
    fast = integer_verdict(completion, gold)
    assert fast is not None and (fast.correct, fast.flags) == (check_answer(completion, gold).correct, [])


@pytest.mark.parametrize("completion", ["7 cm", "7.0", "\\boxed{7}", "3+4", "7 7", ""])
def test_anything_but_a_plain_integer_goes_to_math_verify(completion):
    assert integer_verdict(completion, "7") is None


def test_boxed_contents_balanced():
    assert boxed_contents("a \\boxed{\\frac{1}{2}} b \\boxed{x^{2}} \\boxed{open") == ["\\frac{1}{2}", "x^{2}"]


def test_deadline_kills_and_replaces_worker():
    caller = DeadlineCaller(time.sleep, workers=1, timeout_s=0.5)
    try:
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            caller.call(30)
        assert time.monotonic() - start < 5
        assert caller.call(0) is None and caller.restarts == 1
    finally:
        caller.close()


def test_math_reward_off_main_thread():
    from concurrent.futures import ThreadPoolExecutor

    reward = MathReward(timeout_s=20.0)
    try:
        samples = [Sample(f"s{i}", "g", "math", [1], [], [], [], [], completion_text=f"\\boxed{{{i}}}", answer="3") for i in range(5)]
        with ThreadPoolExecutor(2) as ex:
            values = list(ex.map(reward, samples))
        assert [v.score for v in values] == [0.0, 0.0, 0.0, 1.0, 0.0]
    finally:
        reward.close()


def test_math_reward_timeout_is_a_flag_not_a_crash(monkeypatch):
    reward = MathReward(timeout_s=1.0)
    try:
        monkeypatch.setattr(reward.verifier._caller, "_fn", time.sleep)  # stand-in for a sympy call that spins
        monkeypatch.setattr(reward.verifier._caller, "call", lambda *a: DeadlineCaller.call(reward.verifier._caller, 30))
        value = reward(Sample("s", "g", "math", [1], [], [], [], [], completion_text="\\boxed{1}", answer="1"))
        assert value.score == 0.0 and TIMEOUT in value.flags
    finally:
        reward.close()


def test_answer_tag_ignores_digits_outside_the_tags():
    """Without tags, math-verify reads the last number anywhere: noise containing the right digit pays."""
    def sample(text):
        return Sample("s", "g", "t", [1], [2], [1], [0.0], [0], completion_text=text, answer="5")

    untagged, tagged = MathReward(timeout_s=20.0), MathReward(timeout_s=20.0, answer_tag="answer")
    try:
        assert untagged(sample('OHv=5ontC"')).score == 1.0  # the false positive the tag closes
        assert tagged(sample('OHv=5ontC"')).score == 0.0
        assert tagged(sample("<answer>5</answer>")).score == 1.0
        assert tagged(sample("<answer>3</answer> 5 <answer>5</answer>")).score == 1.0  # the last tag counts
        assert tagged(sample("5 <answer>4</answer>")).score == 0.0
    finally:
        untagged.close()
        tagged.close()
