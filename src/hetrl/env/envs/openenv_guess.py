"""Guess the number, as an OpenEnv environment server: the one hetrl ships, for ``env.name: openenv``.

Written against openenv-core's server API only (``Environment``, ``Action``, ``Observation``,
``create_app``), so it is what a hub's environment looks like: ``uvicorn
hetrl.env.envs.openenv_guess:app`` serves it on its own, and a recipe names it as
``env.openenv.app`` to have each process that runs episodes start it on 127.0.0.1 (see
``hetrl.env.envs.openenv_adapter``). Importing it needs the ``openenv`` extra.

The game: ``reset(seed)`` picks a number in 1..``HIGH`` from the seed alone; each guess is answered
"higher" or "lower" until the hit (reward 1.0) or the last of ``NUM_GUESSES`` misses (reward: partial
credit for how close that guess was, so a tiny policy gets a dense signal).
"""

from __future__ import annotations

import random
from typing import Any

from openenv.core.env_server import Action, Environment, Observation, State, create_app
from pydantic import Field

HIGH = 10
NUM_GUESSES = 3
PARTIAL_CREDIT = 0.5  # a last guess off by d earns PARTIAL_CREDIT * (1 - d / (HIGH - 1)), below a hit's 1.0


class GuessAction(Action):
    guess: int = Field(..., ge=1, le=HIGH, description=f"The guessed number, 1..{HIGH}.")


class GuessObservation(Observation):
    message: str = Field(..., description="What the game says: the rules, or how the last guess fared.")


class GuessNumberEnvironment(Environment[GuessAction, GuessObservation, State]):
    """One game per session; sessions share nothing, so a server runs many at once."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State()
        self._secret = 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GuessObservation:
        self._secret = random.Random(seed).randint(1, HIGH)
        self._state = State(episode_id=episode_id, step_count=0)
        # Short texts: the tiny recipe's policy reads characters, and three turns must fit its context.
        return GuessObservation(message=f"Guess my number, 1 to {HIGH}. {NUM_GUESSES} tries.")

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        if action.guess == self._secret:
            return GuessObservation(message="Yes!", reward=1.0, done=True)
        if self._state.step_count >= NUM_GUESSES:
            closeness = 1.0 - abs(action.guess - self._secret) / (HIGH - 1)
            return GuessObservation(message=f"No, it was {self._secret}.", reward=PARTIAL_CREDIT * closeness, done=True)
        return GuessObservation(message="Higher." if action.guess < self._secret else "Lower.", reward=0.0)

    @property
    def state(self) -> State:
        return self._state


# Sessions are cheap (two integers): the bound only stops a runaway client.
app = create_app(
    GuessNumberEnvironment, GuessAction, GuessObservation, env_name="guess_number", max_concurrent_envs=1024
)
