"""Tool schemas from functions, parsing of both call formats, and failures as observations."""

import asyncio
import json

import pytest
from env_helpers import tool_call

from hetrl.env.base import Task
from hetrl.env.envs.tool_use import ToolMathEnv, evaluate_arithmetic
from hetrl.env.tools import ToolRegistry, parse_tool_calls


def lookup(city: str, days: int = 1, units: str | None = None) -> dict:
    """Weather forecast for a city.

    Args:
        city: Name of the city.
        days: How many days ahead,
            counted from today.
        units: "metric" or "imperial".
    """
    if city == "Atlantis":
        raise KeyError("no such city")
    return {"city": city, "days": days}


def test_schema_from_signature_and_docstring():
    schema = ToolRegistry([lookup]).schemas()[0]["function"]
    assert schema["name"] == "lookup" and schema["description"] == "Weather forecast for a city."
    props = schema["parameters"]["properties"]
    assert props["city"] == {"type": "string", "description": "Name of the city."}
    assert props["days"] == {"type": "integer", "description": "How many days ahead, counted from today."}
    assert props["units"]["type"] == "string"
    assert schema["parameters"]["required"] == ["city"]


def test_tools_need_docstring_and_hints():
    def bare(x: int):
        return x

    def unhinted(x):
        """Doc."""

    with pytest.raises(ValueError, match="docstring"):
        ToolRegistry([bare])
    with pytest.raises(TypeError, match="type hint"):
        ToolRegistry([unhinted])


def test_parse_hermes_and_openai_shapes():
    text = (
        'thinking <tool_call>{"name": "lookup", "arguments": {"city": "Oslo"}}</tool_call> and '
        '<tool_call>{"function": {"name": "lookup", "arguments": "{\\"city\\": \\"Rome\\"}"}}</tool_call>'
    )
    parsed = parse_tool_calls({"role": "assistant", "content": text})
    assert [(c.name, c.arguments) for c in parsed.calls] == [("lookup", {"city": "Oslo"}), ("lookup", {"city": "Rome"})]
    openai = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_9",
                "type": "function",
                "function": {"name": "lookup", "arguments": json.dumps({"city": "Lima"})},
            }
        ],
    }
    parsed = parse_tool_calls(openai)
    assert parsed.calls[0].call_id == "call_9" and parsed.calls[0].arguments == {"city": "Lima"} and not parsed.errors
    assert not parse_tool_calls("just an answer")


@pytest.mark.parametrize(
    "text, reason",
    [
        ("<tool_call>{not json}</tool_call>", "not valid JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', '"name"'),
        ('<tool_call>{"name": "lookup", "arguments": [1]}</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "lookup", "arguments": "{bad"}</tool_call>', "arguments are not valid JSON"),
        ('<tool_call>{"name": "lookup"', "unterminated"),
    ],
)
def test_malformed_calls_are_reported(text, reason):
    parsed = parse_tool_calls(text)
    assert not parsed.calls and len(parsed.errors) == 1 and reason in parsed.errors[0]


@pytest.mark.parametrize(
    "call, expected",
    [
        ('{"name": "nope", "arguments": {}}', "unknown tool 'nope'"),
        ('{"name": "lookup", "arguments": {}}', "missing arguments ['city']"),
        ('{"name": "lookup", "arguments": {"city": "x", "zip": 1}}', "unknown arguments ['zip']"),
        ('{"name": "lookup", "arguments": {"city": 3}}', "'city' must be of type string"),
        ('{"name": "lookup", "arguments": {"city": "Atlantis"}}', "raised KeyError"),
    ],
)
def test_bad_calls_and_tool_exceptions_become_observations(call, expected):
    registry = ToolRegistry([lookup])
    messages, num_errors = asyncio.run(registry.execute(parse_tool_calls(f"<tool_call>{call}</tool_call>")))
    assert num_errors == 1 and messages[0]["role"] == "tool"
    assert messages[0]["content"].startswith("error:") and expected in messages[0]["content"]


def test_good_call_result_and_truncation():
    def big(n: int) -> str:
        """Return n characters.

        Args:
            n: how many.
        """
        return "x" * n

    registry = ToolRegistry([lookup, big])
    parsed = parse_tool_calls(tool_call("lookup", city="Oslo", days=2) + tool_call("big", n=10_000))
    messages, num_errors = asyncio.run(registry.execute(parsed))
    assert num_errors == 0 and json.loads(messages[0]["content"]) == {"city": "Oslo", "days": 2}
    assert "truncated" in messages[1]["content"] and len(messages[1]["content"]) < 4100


def test_env_feeds_errors_back_and_keeps_going():
    env = ToolMathEnv(runner=None)
    task = Task("t", "unit", [{"role": "user", "content": "1/0?"}], answer="0")

    async def episode():
        await env.reset(task, 0)
        first = await env.step({"role": "assistant", "content": tool_call("calculator", expression="1/0")})
        second = await env.step({"role": "assistant", "content": "<tool_call>oops</tool_call>"})
        return first, second

    first, second = asyncio.run(episode())
    assert not first.done and "ZeroDivisionError" in first.observations[0]["content"]
    assert not second.done and "not valid JSON" in second.observations[0]["content"]
    assert second.info == {"num_tool_calls": 2, "num_tool_errors": 2}


def test_calculator_is_not_eval():
    assert evaluate_arithmetic("(17 + 25) * 3 - 2 ** 3") == 118
    for hostile in ("__import__('os').system('true')", "9 ** 9 ** 9", "[1]*3"):
        with pytest.raises(ValueError):
            evaluate_arithmetic(hostile)
