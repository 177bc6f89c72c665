"""Tools for the policy: a registry built from plain Python functions, and tool-call parsing.

A tool is an ordinary (sync or async) function with type hints and a Google-style docstring; its
JSON schema (OpenAI function format) comes from the signature and the ``Args:`` section, so the
schema the policy sees cannot drift from the code that runs. Sync tools run in a worker thread (they
may block); async tools run on the event loop, so cheap pure ones should be async.

Everything that can go wrong on the policy's side (unparsable JSON, an unknown tool, a missing or
mistyped argument, the tool raising) becomes a tool *observation* with an error text, never an
exception in the rollout loop: learning to call tools includes learning from failed calls.

Parsed formats: Hermes/Qwen ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks in
the text, and the OpenAI message shape ``{"tool_calls": [{"id", "type": "function", "function":
{"name", "arguments": "<json>"}}]}`` (what engines with a tool parser return).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hetrl.env.base import Message

_JSON_TYPES: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "array",
    tuple: "array",
    dict: "object",
}
_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)
MAX_RESULT_CHARS = 4000  # a tool's output is truncated beyond this: observations share the token budget


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    call_id: str


@dataclass
class ParsedCalls:
    """Tool calls found in one assistant message; ``errors`` are the malformed ones, as feedback texts."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.calls or self.errors)


def _json_schema(annotation: Any) -> dict[str, Any]:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _json_schema(options[0]) if len(options) == 1 else {"anyOf": [_json_schema(a) for a in options]}
    if origin in (list, tuple):
        args = typing.get_args(annotation)
        return {"type": "array", "items": _json_schema(args[0])} if args else {"type": "array"}
    base = origin or annotation
    if base not in _JSON_TYPES:
        raise TypeError(
            f"tool parameters must be str/int/float/bool/list/dict (or Optional of them), got {annotation!r}"
        )
    return {"type": _JSON_TYPES[base]}


def _docstring_parts(doc: str) -> tuple[str, dict[str, str]]:
    """(description, {arg: description}) from a Google-style docstring."""
    summary, _, rest = doc.partition("Args:")
    descriptions: dict[str, str] = {}
    current = None
    for line in rest.splitlines():
        match = re.match(r"\s*(\w+)\s*(\([^)]*\))?:\s*(.*)", line)
        if match:
            current = match.group(1)
            descriptions[current] = match.group(3).strip()
        elif current and line.strip() and not re.match(r"\s*(Returns|Raises):", line):
            descriptions[current] += " " + line.strip()
        else:
            current = None
    return " ".join(summary.split()), descriptions


class Tool:
    """One callable tool with its OpenAI-format schema."""

    def __init__(self, fn: Callable[..., Any], name: str | None = None) -> None:
        self.fn = fn
        self.name = name or fn.__name__
        # Bound methods (tools of an env instance) share their function's schema: built once per class.
        self.schema = _function_schema(getattr(fn, "__func__", fn), self.name, inspect.ismethod(fn))

    def check_arguments(self, arguments: dict[str, Any]) -> str | None:
        """An error text for arguments that do not fit the schema, or None."""
        params = self.schema["function"]["parameters"]
        unknown = sorted(set(arguments) - set(params["properties"]))
        missing = [p for p in params["required"] if p not in arguments]
        if unknown or missing:
            return f"tool {self.name}: unknown arguments {unknown}, missing arguments {missing}"
        for pname, value in arguments.items():
            expected = params["properties"][pname].get("type")
            if expected and not _matches(value, expected):
                return f"tool {self.name}: argument {pname!r} must be of type {expected}, got {type(value).__name__}"
        return None

    async def __call__(self, arguments: dict[str, Any]) -> Any:
        if inspect.iscoroutinefunction(self.fn):
            return await self.fn(**arguments)
        return await asyncio.to_thread(self.fn, **arguments)


@functools.cache
def _function_schema(fn: Callable[..., Any], name: str, bound: bool) -> dict[str, Any]:
    description, arg_docs = _docstring_parts(inspect.getdoc(fn) or "")
    if not description:
        raise ValueError(f"tool {name}: the function needs a docstring (it is the tool's description)")
    hints = typing.get_type_hints(fn)
    properties, required = {}, []
    params = list(inspect.signature(fn).parameters.items())[1 if bound else 0 :]  # drop self
    for pname, param in params:
        if pname not in hints:
            raise TypeError(f"tool {name}: parameter {pname!r} needs a type hint")
        properties[pname] = {**_json_schema(hints[pname]), "description": arg_docs.get(pname, "")}
        if param.default is inspect.Parameter.empty:
            required.append(pname)
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def _matches(value: Any, json_type: str) -> bool:
    if json_type == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if json_type == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, {"string": str, "boolean": bool, "array": list, "object": dict}[json_type])


class ToolRegistry:
    """Named tools; ``execute`` turns calls (good or bad) into tool observation messages."""

    def __init__(self, functions: list[Callable[..., Any]] | None = None) -> None:
        self.tools: dict[str, Tool] = {}
        for fn in functions or []:
            self.register(fn)

    def register(self, fn: Callable[..., Any], name: str | None = None) -> Tool:
        tool = Tool(fn, name)
        if tool.name in self.tools:
            raise ValueError(f"tool {tool.name!r} registered twice")
        self.tools[tool.name] = tool
        return tool

    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema for t in self.tools.values()]

    def describe(self) -> str:
        """System-prompt text announcing the tools in the Hermes format (works with any chat template)."""
        listing = "\n".join(json.dumps(s) for s in self.schemas())
        return (
            "You can call tools. Available tools:\n<tools>\n" + listing + "\n</tools>\n"
            'To call one, write <tool_call>{"name": <tool name>, "arguments": <JSON object>}</tool_call>. '
            "Answer without a tool call when you are done."
        )

    async def call(self, call: ToolCall) -> tuple[str, bool]:
        """(result text, ok). Unknown tools, bad arguments and exceptions give ok=False and an error text."""
        tool = self.tools.get(call.name)
        if tool is None:
            return f"error: unknown tool {call.name!r}; available: {sorted(self.tools)}", False
        problem = tool.check_arguments(call.arguments)
        if problem:
            return f"error: {problem}", False
        try:
            result = await tool(call.arguments)
        except Exception as exc:  # the policy's call made the tool fail: that is feedback, not a crash
            return f"error: tool {call.name} raised {type(exc).__name__}: {exc}", False
        text = result if isinstance(result, str) else json.dumps(result, default=str)
        if len(text) > MAX_RESULT_CHARS:
            text = text[:MAX_RESULT_CHARS] + f"... [truncated {len(text) - MAX_RESULT_CHARS} chars]"
        return text, True

    async def execute(self, parsed: ParsedCalls) -> tuple[list[Message], int]:
        """Tool observation messages for every parsed call and every malformed one; also the error count."""
        results = await asyncio.gather(*(self.call(c) for c in parsed.calls))
        messages = [
            {"role": "tool", "name": c.name, "tool_call_id": c.call_id, "content": text}
            for c, (text, _) in zip(parsed.calls, results)
        ]
        messages += [{"role": "tool", "name": "error", "content": f"error: {e}"} for e in parsed.errors]
        return messages, len(parsed.errors) + sum(not ok for _, ok in results)


def _call_from_obj(obj: Any, call_id: str) -> ToolCall:
    """A ToolCall from {"name", "arguments"} or the OpenAI {"function": {...}} shape; ValueError if neither."""
    if isinstance(obj, dict) and isinstance(obj.get("function"), dict):
        call_id = str(obj.get("id") or call_id)
        obj = obj["function"]
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ValueError('a tool call must be a JSON object with a string "name" and an "arguments" object')
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):  # OpenAI sends arguments as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f"tool {obj['name']}: arguments are not valid JSON ({exc.msg})") from None
    if not isinstance(arguments, dict):
        raise ValueError(f"tool {obj['name']}: arguments must be a JSON object, got {type(arguments).__name__}")
    return ToolCall(name=obj["name"], arguments=arguments, call_id=call_id)


def parse_tool_calls(message: Message | str) -> ParsedCalls:
    """Tool calls in an assistant message (OpenAI ``tool_calls`` field, else Hermes blocks in the text)."""
    parsed = ParsedCalls()
    if isinstance(message, dict) and message.get("tool_calls"):
        for i, obj in enumerate(message["tool_calls"]):
            _collect(parsed, lambda o=obj, i=i: _call_from_obj(o, f"call_{i}"))
        return parsed
    text = message if isinstance(message, str) else (message.get("content") or "")
    if not isinstance(text, str):
        return parsed
    for i, match in enumerate(_TOOL_CALL_RE.finditer(text)):
        body, closed = match.group(1).strip(), match.group(2)
        if not closed:
            parsed.errors.append("unterminated <tool_call> block (missing </tool_call>)")
            continue
        _collect(parsed, lambda body=body, i=i: _call_from_obj(_loads(body), f"call_{i}"))
    return parsed


def _loads(body: str) -> Any:
    try:
        return json.loads(body)
    except json.JSONDecodeError as exc:
        raise ValueError(f"tool call is not valid JSON ({exc.msg} at char {exc.pos}): {body[:200]!r}") from None


def _collect(parsed: ParsedCalls, make: Callable[[], ToolCall]) -> None:
    try:
        parsed.calls.append(make())
    except ValueError as exc:
        parsed.errors.append(str(exc))
