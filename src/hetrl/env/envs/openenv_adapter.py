"""OpenEnv environments as hetrl environments: ``env.name: openenv`` (docs/environments.md).

An OpenEnv environment is a server (openenv-core's ``create_app`` under uvicorn); its episodes live
in WebSocket sessions at ``<url>/ws`` (the HTTP ``/reset`` and ``/step`` are stateless, one env per
request). :class:`OpenEnvEnv` runs each hetrl episode as ONE such session: ``reset`` connects and
resets with the episode's seed (so a run's games follow from ``run.seed``), each policy turn's
text becomes the environment's action, parsed against the action schema the server publishes at
``/schema``, and the observation's text, reward and ``done`` come back as the next user message,
the turn's reward and the episode's end; ``close`` ends the session. A turn whose text does not
parse is never sent: the policy is told why (reward ``env.openenv.invalid_action_reward``).

Who owns what: the client side speaks the session protocol (JSON messages ``{"type": "reset" |
"step" | "close", "data": ...}``, answered ``{"type": "observation" | "error", "data": ...}``) with
``websockets`` directly, so a run against a URL imports none of openenv-core (its server package
pulls in gradio, ~10 s of imports). A run naming ``env.openenv.app`` starts that server itself,
once per process that runs episodes (:func:`serve_app`: a uvicorn thread on 127.0.0.1, stopped at
exit). Every wait (server start, schema, connect, each answer, close) has the deadline
``env.openenv.timeout_s``; a server that misses it, refuses a message or goes away raises
:class:`OpenEnvError` naming its URL, which fails the run: an OpenEnv server is no hetrl env rank,
so there is no failover to another.

Tasks (:class:`OpenEnvSource`) are episode slots: the environment makes each problem from the
episode's seed and shows it in its first observation. A slot's ``answer`` is a demonstration reply
drawn from ``env.tasks.options.demonstrations``, what ``warm_start`` teaches.
"""

from __future__ import annotations

import asyncio
import atexit
import importlib
import json
import random
import socket
import threading
import time
import urllib.request
from typing import Any

import uvicorn
import websockets

from hetrl.config.env import OpenEnvConfig
from hetrl.env.base import Environment, Message, StepResult, Task
from hetrl.env.tasks.base import ProceduralSource

MAX_MESSAGE_BYTES = 64 * 2**20  # an observation may carry a screenshot


class OpenEnvError(RuntimeError):
    """An OpenEnv server missed a deadline, refused a message or went away; the text names its URL."""


# --- the server a run starts itself -----------------------------------------------------------------
_servers: dict[str, str] = {}  # app -> base URL of this process's server of it
_servers_lock = threading.Lock()


def serve_app(app: str, timeout_s: float) -> str:
    """The base URL of this process's server of ``app`` ("module:attribute", allowlisted by the config),
    started under uvicorn on a free port of 127.0.0.1 on the first call and stopped at exit."""
    with _servers_lock:
        if app in _servers:
            return _servers[app]
        module, _, attribute = app.partition(":")
        asgi = getattr(importlib.import_module(module), attribute)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))  # the port is ours before uvicorn listens: no race with another process
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        server = uvicorn.Server(uvicorn.Config(asgi, log_level="warning"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"openenv {app}", daemon=True)
        thread.start()
        deadline = time.monotonic() + timeout_s
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                server.should_exit = True
                raise OpenEnvError(
                    f"the OpenEnv app {app} did not start serving {url} within {timeout_s} s (env.openenv.timeout_s)"
                    if thread.is_alive()
                    else f"the OpenEnv app {app} stopped while starting on {url} (its error is logged above)"
                )
            time.sleep(0.02)
        atexit.register(_stop, server, thread, timeout_s)
        _servers[app] = url
        return url


def _stop(server: uvicorn.Server, thread: threading.Thread, timeout_s: float) -> None:
    server.should_exit = True
    thread.join(timeout_s)


# --- the action schema and the parsing of a turn ------------------------------------------------------
_schemas: dict[str, dict[str, Any]] = {}  # base URL -> its action schema


def _get_action_schema(url: str, timeout_s: float) -> dict[str, Any]:
    if url not in _schemas:
        try:
            with urllib.request.urlopen(f"{url}/schema", timeout=timeout_s) as response:
                _schemas[url] = json.load(response)["action"]
        except (OSError, ValueError, KeyError) as err:
            raise OpenEnvError(f"OpenEnv server {url}: no action schema at {url}/schema ({err})") from err
    return _schemas[url]


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "integer": (int,),
    "number": (int, float),
    "string": (str,),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}


def action_fields(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The fields a policy fills: the schema's properties but openenv's own ``metadata``."""
    return {name: spec for name, spec in schema.get("properties", {}).items() if name != "metadata"}


def _a(kind: str | None) -> str:
    return f"{'an' if kind in ('integer', 'array', 'object') else 'a'} {kind}"


def _coerce(text: str, name: str, spec: dict[str, Any]) -> Any:
    """The reply as the value of the action's only field, by its JSON type."""
    kind = spec.get("type")
    try:
        if kind == "string":
            return text
        if kind == "integer":
            return int(text)
        if kind == "number":
            return float(text)
        if kind == "boolean" and text.lower() in ("true", "false"):
            return text.lower() == "true"
        return json.loads(text)
    except ValueError:
        raise ValueError(f"{name} must be {_a(kind)}, got {text[:40]!r}") from None


def _check_value(name: str, value: Any, spec: dict[str, Any]) -> None:
    kind = spec.get("type")
    if kind in _JSON_TYPES and (
        not isinstance(value, _JSON_TYPES[kind]) or (isinstance(value, bool) and kind in ("integer", "number"))
    ):
        raise ValueError(f"{name} must be {_a(kind)}, got {value!r}")
    if "minimum" in spec and value < spec["minimum"] or "maximum" in spec and value > spec["maximum"]:
        raise ValueError(f"{name} must be in {spec.get('minimum', '-inf')}..{spec.get('maximum', 'inf')}, got {value}")
    if "enum" in spec and value not in spec["enum"]:
        raise ValueError(f"{name} must be one of {spec['enum']}, got {value!r}")


def parse_action(text: str, schema: dict[str, Any]) -> dict[str, Any]:
    """The action a policy's reply stands for, under the environment's action ``schema`` (JSON schema).

    A reply that is a JSON object is the action; otherwise, for an action of one field, the whole
    reply (stripped) is that field's value, read by its type ("7" for an integer guess). Raises
    ValueError with a reason the policy can be shown. Checked here: required and unknown fields,
    JSON types, minimum/maximum, enum; the server validates the rest and its refusal reads the same.
    """
    fields, text = action_fields(schema), text.strip()
    if text.startswith("{"):
        try:
            action = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"the reply is not valid JSON ({err.msg})") from None
    elif len(fields) == 1:
        (name, spec), *_ = fields.items()
        action = {name: _coerce(text, name, spec)}
    else:
        raise ValueError("the reply is not a JSON object")
    missing = [name for name in schema.get("required", ()) if name not in action]
    unknown = sorted(set(action) - set(fields))
    if missing or unknown:
        raise ValueError(f"missing fields {missing}" if missing else f"unknown fields {unknown}")
    for name, value in action.items():
        _check_value(name, value, fields[name])
    return action


def reply_hint(schema: dict[str, Any]) -> str:
    """How to reply, for the message after a turn that did not parse."""
    fields = action_fields(schema)
    if len(fields) == 1:
        return f"Reply with just the {next(iter(fields))}."
    return f"Reply with a JSON object with the fields {', '.join(fields)}."


def observation_text(observation: dict[str, Any]) -> str:
    """The observation as the policy reads it: its only text field, else its fields as JSON."""
    texts = [value for value in observation.values() if isinstance(value, str)]
    return texts[0] if len(texts) == 1 and len(observation) == 1 else json.dumps(observation, sort_keys=True)


# --- the environment ---------------------------------------------------------------------------------
class OpenEnvEnv(Environment):
    """One hetrl episode = one WebSocket session on an OpenEnv server; see the module docstring."""

    def __init__(self, openenv: OpenEnvConfig, system_prompt: str | None = None) -> None:
        super().__init__(system_prompt)
        self.openenv = openenv
        self.url = openenv.url
        self.schema: dict[str, Any] = {}
        self._ws: websockets.ClientConnection | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.num_invalid_actions = 0

    async def reset(self, task: Task, seed: int) -> list[Message]:
        await self.close()  # a session an earlier reset left open
        timeout_s = self.openenv.timeout_s
        if self.url is None:  # the config holds exactly one of url and app
            self.url = await asyncio.to_thread(serve_app, self.openenv.app, timeout_s)
        self.schema = await asyncio.to_thread(_get_action_schema, self.url, timeout_s)
        ws_url = "ws" + self.url.removeprefix("http") + "/ws"
        try:
            self._ws = await websockets.connect(ws_url, open_timeout=timeout_s, max_size=MAX_MESSAGE_BYTES)
        except (OSError, TimeoutError, websockets.InvalidHandshake) as err:
            raise OpenEnvError(f"OpenEnv server {self.url}: no session at {ws_url} ({err!r})") from err
        self._loop = asyncio.get_running_loop()
        self.num_invalid_actions = 0
        data = await self._exchange("reset", {"seed": seed})
        return [*self.initial_messages(task), {"role": "user", "content": observation_text(data["observation"])}]

    async def step(self, action: Message) -> StepResult:
        if self._ws is None:
            raise RuntimeError("OpenEnvEnv.step before reset")
        try:
            parsed = parse_action(action.get("content") or "", self.schema)
            data = await self._exchange("step", parsed)
        except ValueError as err:  # the policy's reply, refused here or by the server: its turn is spent
            self.num_invalid_actions += 1
            message = f"Not a valid action: {err}. {reply_hint(self.schema)}"
            return StepResult(
                [{"role": "user", "content": message}],
                reward=self.openenv.invalid_action_reward,
                info={"num_invalid_actions": self.num_invalid_actions},
            )
        reward = data.get("reward")
        return StepResult(
            [{"role": "user", "content": observation_text(data["observation"])}],
            reward=None if reward is None else float(reward),
            done=bool(data.get("done")),
            info={"num_invalid_actions": self.num_invalid_actions},
        )

    async def close(self) -> None:
        """End the session (the server then drops its environment). Safe to call twice, and from another event
        loop than the reset's (the warm start resets an environment per demonstration, each under a fresh
        ``asyncio.run``, and never closes it; tests close under one of their own): a socket whose loop is not
        this one is shut down directly, which the server sees as the end of the session."""
        ws, self._ws = self._ws, None
        if ws is None:
            return
        if self._loop is not asyncio.get_running_loop():
            sock = ws.transport.get_extra_info("socket")
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except (AttributeError, OSError):  # no socket left, or the server has already hung up
                pass
            return
        try:  # the server answers a close message by closing the connection: waiting for that, not closing
            # first, spares its log a ClientDisconnected traceback per episode
            await asyncio.wait_for(ws.send(json.dumps({"type": "close"})), self.openenv.timeout_s)
            await asyncio.wait_for(ws.wait_closed(), self.openenv.timeout_s)
        except (OSError, TimeoutError, websockets.ConnectionClosed):
            ws.transport.abort()  # the server went away or hangs: the session is over either way

    async def _exchange(self, kind: str, data: dict[str, Any]) -> dict[str, Any]:
        """Send one message of the session and wait for its answer, under the deadline.

        Raises ValueError when the server refuses a step's action as invalid (the policy's fault), and
        OpenEnvError for anything else: a timeout, a lost connection, another refusal.
        """
        assert self._ws is not None
        try:
            await asyncio.wait_for(self._ws.send(json.dumps({"type": kind, "data": data})), self.openenv.timeout_s)
            raw = await asyncio.wait_for(self._ws.recv(), self.openenv.timeout_s)
        except TimeoutError:
            raise OpenEnvError(
                f"OpenEnv server {self.url} did not answer a {kind} within {self.openenv.timeout_s} s "
                "(env.openenv.timeout_s)"
            ) from None
        except (OSError, websockets.ConnectionClosed) as err:
            raise OpenEnvError(f"OpenEnv server {self.url} closed the session during a {kind} ({err!r})") from err
        try:
            answer = json.loads(raw)
        except ValueError:  # not the policy's fault: must not read as a refused action
            raise OpenEnvError(f"OpenEnv server {self.url} answered a {kind} with no JSON: {raw[:200]!r}") from None
        if answer.get("type") == "observation":
            return answer["data"]
        error = answer.get("data", {})
        if kind == "step" and error.get("code") == "VALIDATION_ERROR":
            raise ValueError("; ".join(e.get("msg", "") for e in error.get("errors", ())) or error.get("message"))
        raise OpenEnvError(f"OpenEnv server {self.url} refused a {kind}: {error.get('message')} ({error.get('code')})")


class OpenEnvSource(ProceduralSource):
    """``size`` episode slots (see the module docstring); a slot's answer is drawn from ``demonstrations``."""

    name = "openenv"

    def __init__(self, size: int, seed: int, demonstrations: list[Any] | None = None) -> None:
        super().__init__(size, seed)
        self.demonstrations = list(demonstrations or [])

    def make(self, rng: random.Random, index: int) -> Task:
        answer = rng.choice(self.demonstrations) if self.demonstrations else None
        return Task(task_id=f"openenv/{index}", source=self.name, messages=[], answer=answer, metadata={"slot": index})
