"""The OpenEnv adapter (env.name=openenv) against OpenEnv servers served in this process on 127.0.0.1:
the shipped guess-the-number game, a copy that counts its sessions, and servers that never answer."""

import asyncio
import random
import socket
import threading
import time

import pytest
from env_helpers import play
from openenv.core.env_server import create_app

from hetrl.config.env import EnvConfig, OpenEnvConfig
from hetrl.env.base import Task
from hetrl.env.envs import openenv_guess
from hetrl.env.envs.openenv_adapter import OpenEnvEnv, OpenEnvError, OpenEnvSource, parse_action, serve_app
from hetrl.env.episodes import EpisodeRunner, group_items
from hetrl.env.registry import env_factory
from hetrl.env.scripted import ScriptedPolicy
from hetrl.records import SamplingParams

GUESS_APP = "hetrl.env.envs.openenv_guess:app"
TASK = Task("openenv/0", "openenv", [])
SCHEMA = {
    "properties": {"metadata": {"type": "object"}, "guess": {"type": "integer", "minimum": 1, "maximum": 10}},
    "required": ["guess"],
}


def secret(seed):
    return random.Random(seed).randint(1, openenv_guess.HIGH)


class CountingGuess(openenv_guess.GuessNumberEnvironment):
    """The shipped game, recording each session's environment: its resets and whether it was closed."""

    made: list["CountingGuess"] = []

    def __init__(self):
        super().__init__()
        self.seeds, self.closed = [], False
        CountingGuess.made.append(self)

    def reset(self, seed=None, episode_id=None, **kwargs):
        self.seeds.append(seed)
        return super().reset(seed, episode_id, **kwargs)

    def close(self):
        self.closed = True


class HangingGuess(openenv_guess.GuessNumberEnvironment):
    """Takes a session, then answers its reset only once the test lets it (after the client's deadline)."""

    release = threading.Event()

    def reset(self, seed=None, episode_id=None, **kwargs):
        HangingGuess.release.wait(10)
        return super().reset(seed, episode_id, **kwargs)


def _app(env_cls):
    return create_app(env_cls, openenv_guess.GuessAction, openenv_guess.GuessObservation, max_concurrent_envs=64)


counting_app, hanging_app = _app(CountingGuess), _app(HangingGuess)


def openenv_env(timeout_s=30.0, **keys):
    return OpenEnvEnv(OpenEnvConfig(timeout_s=timeout_s, **({"app": GUESS_APP} | keys)))


def test_reset_shows_the_game_and_a_hit_ends_it_with_reward_one(codec):
    sample, policy = play(openenv_env(), TASK, codec, lambda c: str(secret(7)), seed=7, max_turns=3)
    assert "Guess my number, 1 to 10. 3 tries." in codec.decode(policy.calls[0][0])
    assert sample.info["stop_reason"] == "done" and sample.num_turns == 1 and sample.rewards == {"env": 1.0}


def test_misses_get_hints_then_partial_credit_when_the_tries_run_out(codec):
    wrong = 1 if secret(3) != 1 else 2
    sample, policy = play(openenv_env(), TASK, codec, lambda c: str(wrong), seed=3, max_turns=5)
    assert sample.num_turns == openenv_guess.NUM_GUESSES and sample.info["stop_reason"] == "done"
    assert "Higher." in codec.decode(policy.calls[1][0])  # a guess of 1 (or 2) is below the secret
    closeness = 1 - abs(wrong - secret(3)) / (openenv_guess.HIGH - 1)
    assert sample.rewards["env"] == pytest.approx(openenv_guess.PARTIAL_CREDIT * closeness)
    assert sample.info["turn_rewards"][:2] == [0.0, 0.0]


def test_a_reply_that_does_not_parse_is_an_observation_and_a_penalty(codec):
    replies = iter(["seven", '{"guess": 11}', str(secret(5))])
    env = openenv_env(invalid_action_reward=-0.25)
    sample, policy = play(env, TASK, codec, lambda c: next(replies), seed=5, max_turns=3)
    second = codec.decode(policy.calls[1][0])
    assert "Not a valid action: guess must be an integer, got 'seven'. Reply with just the guess." in second
    assert "guess must be in 1..10, got 11" in codec.decode(policy.calls[2][0])
    assert sample.info["turn_rewards"] == [-0.25, -0.25, 1.0] and sample.info["num_invalid_actions"] == 2
    assert sample.rewards["env"] == pytest.approx(0.5) and sample.info["stop_reason"] == "done"


def test_parse_action_reads_the_schema():
    assert parse_action(" 7\n", SCHEMA) == {"guess": 7}
    assert parse_action('{"guess": 3}', SCHEMA) == {"guess": 3}
    for text, reason in [
        ("7.5", "guess must be an integer"),
        ("true", "guess must be an integer"),
        ('{"guess": true}', "guess must be an integer, got True"),
        ('{"guess": 0}', "must be in 1..10"),
        ('{"guess": 3, "why": "x"}', r"unknown fields \['why'\]"),
        ("{}", r"missing fields \['guess'\]"),
        ('{"guess": ', "not valid JSON"),
    ]:
        with pytest.raises(ValueError, match=reason):
            parse_action(text, SCHEMA)
    two = {"properties": {"x": {"type": "integer"}, "y": {"type": "string"}}, "required": ["x"]}
    assert parse_action('{"x": 1, "y": "a"}', two) == {"x": 1, "y": "a"}
    with pytest.raises(ValueError, match="not a JSON object"):
        parse_action("1", two)


def test_each_episode_is_one_session_reset_from_its_seed_and_runs_reproduce(codec):
    """Episodes through the driver: one server session each, reset with the episode's seed and closed
    after; the same items played twice give the same samples."""
    env_cfg = EnvConfig(name="openenv", openenv={"app": GUESS_APP})
    url = serve_app(f"{__name__}:counting_app", timeout_s=30)
    make_env = env_factory(env_cfg.model_copy(update={"openenv": OpenEnvConfig(url=url)}))
    assert make_env().openenv.url == url

    def run_twice():
        items = group_items("g0", TASK, seed=11, group_size=4) + group_items("g1", TASK, seed=12, group_size=4)
        policy = ScriptedPolicy(codec, lambda c: str(1 + c.count("Higher.") * 3))  # 1, 4, 7
        runner = EpisodeRunner(make_env, codec, policy.generate, max_turns=3, max_episode_tokens=400, concurrency=3)

        async def go():
            await asyncio.gather(*(runner.start(item, SamplingParams(max_tokens=4)) for item in items))
            return runner.take()

        samples, failed = asyncio.run(go())
        assert failed == []
        return items, sorted(samples, key=lambda s: s.sample_id)

    CountingGuess.made.clear()
    items, first = run_twice()
    time.sleep(0.2)  # the server drops a session's environment just after the client's close
    assert sorted(s for e in CountingGuess.made for s in e.seeds) == sorted(i.seed for i in items)
    assert all(len(e.seeds) == 1 and e.closed for e in CountingGuess.made) and len(CountingGuess.made) == 8
    _, second = run_twice()
    assert [(s.completion_ids, s.rewards) for s in first] == [(s.completion_ids, s.rewards) for s in second]
    assert {s.info["stop_reason"] for s in first} == {"done"}


def test_a_server_that_never_answers_misses_the_deadline_with_its_url():
    url = serve_app(f"{__name__}:hanging_app", timeout_s=30)
    env = OpenEnvEnv(OpenEnvConfig(url=url, timeout_s=0.5))

    async def reset_then_close():
        try:
            await env.reset(TASK, 0)
        finally:  # as the episode driver does; the server then answers the reset, reads the close and ends
            HangingGuess.release.set()
            await env.close()

    started = time.monotonic()
    with pytest.raises(OpenEnvError, match=f"OpenEnv server {url} did not answer a reset within 0.5 s"):
        asyncio.run(reset_then_close())
    assert time.monotonic() - started < 3


def test_a_silent_or_dead_server_is_an_error_naming_its_url():
    listener = socket.create_server(("127.0.0.1", 0))  # accepts connections, never says a word
    silent = f"http://127.0.0.1:{listener.getsockname()[1]}"
    accepted = []
    threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True).start()
    started = time.monotonic()
    with pytest.raises(OpenEnvError, match=f"OpenEnv server {silent}: no action schema at {silent}/schema"):
        asyncio.run(OpenEnvEnv(OpenEnvConfig(url=silent, timeout_s=0.5)).reset(TASK, 0))
    assert time.monotonic() - started < 3
    listener.close()
    with pytest.raises(OpenEnvError, match=f"OpenEnv server {silent}: no action schema"):  # now nothing listens
        asyncio.run(OpenEnvEnv(OpenEnvConfig(url=silent, timeout_s=0.5)).reset(TASK, 0))


def test_the_task_source_gives_slots_with_demonstration_answers():
    source = OpenEnvSource(size=50, seed=0, demonstrations=[1, 2, 3])
    assert [source[i].task_id for i in (0, 49)] == ["openenv/0", "openenv/49"]
    assert {source[i].answer for i in range(50)} == {1, 2, 3} and source[4].messages == []
    assert OpenEnvSource(size=5, seed=0)[0].answer is None


@pytest.mark.parametrize(
    "keys, message",
    [
        ({"name": "openenv"}, "set it \\(url or app\\) for name=openenv"),
        ({"name": "math", "openenv": {"app": GUESS_APP}}, "openenv is only read by name=openenv"),
        ({"name": "openenv", "openenv": {"app": "os:system"}}, "unknown OpenEnv app 'os:system'"),
        ({"name": "openenv", "openenv": {"url": "http://h:1", "app": GUESS_APP}}, "exactly one of url"),
        ({"name": "openenv", "openenv": {"url": "h:1"}}, "must start with http"),
        ({"name": "openenv", "openenv": {"url": "http://h:1", "timeout_s": 0}}, "greater than 0"),
        (
            {"name": "openenv", "openenv": {"url": "http://h:1"}, "tasks": {"source": "openenv", "options": {"x": 1}}},
            "not options of task source 'openenv'",
        ),
    ],
)
def test_config_refuses(keys, message):
    with pytest.raises(ValueError, match=message):
        EnvConfig(**keys)
