"""A composable rubric: weighted reward functions plus zero-weight metrics, built from RewardConfig.

Function names resolve through ``REWARD_ALLOWLIST`` (config/reward.py) and are imported only when
used. Objects a recipe cannot express (a sandbox pool, a judge's generate function, a reward-model
server) are passed as ``resources`` and handed to the factories whose signature names them. The one
resource a rubric builds itself is the sandbox pool: when a function takes ``sandbox_pool`` (``code``)
and the caller supplied none, ``from_config`` builds ONE ``SandboxPool(config.sandbox)`` -- the
recipe's ``reward.sandbox.*`` -- shares it between those functions and closes it in ``close``.

Invariants of ``score`` (it never raises): a source that errors scores 0 with flag
``reward/error:<source>``; a nan/inf or out-of-range value scores 0 with a ``hack/`` flag; any
``hack/`` flag from any source zeroes the TOTAL, so one fooled verifier cannot pay for a hack. A source
whose served model did not answer (``ScoringUnavailable``: ``reward.server.max_attempts`` tries spent)
scores 0 with flag ``reward/unavailable:<source>`` and zeroes the TOTAL too: the other sources alone would
pay a verdict the sample did not earn, and sending it again could wait forever on a model that is gone.
Its metric ``reward/unavailable_frac`` (1 or 0, on every sample) counts such samples in each step.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from dataclasses import dataclass
from typing import Any

from hetrl.config.reward import REWARD_ALLOWLIST, RewardConfig
from hetrl.reward.base import RewardFn, RewardOutcome, Scorable, ScoringUnavailable, as_value
from hetrl.reward.hacking import OUT_OF_RANGE_REWARD, check_value, is_hack
from hetrl.sandbox.pool import SandboxPool

log = logging.getLogger(__name__)
UNAVAILABLE_FLAG = "reward/unavailable"  # ":<source>" follows: its served model never answered


@dataclass
class WeightedFn:
    source: str
    fn: RewardFn
    weight: float


def resolve(name: str) -> Any:
    """The factory registered under ``name`` (lazy import; only allowlisted names)."""
    if name not in REWARD_ALLOWLIST:
        raise ValueError(f"unknown reward function {name!r}; valid: {sorted(REWARD_ALLOWLIST)}")
    module, attr = REWARD_ALLOWLIST[name].split(":")
    return getattr(importlib.import_module(module), attr)


def _construct(factory: Any, kwargs: dict[str, Any], resources: dict[str, Any]) -> RewardFn:
    params = inspect.signature(factory).parameters
    wanted = {k: v for k, v in resources.items() if k in params and k not in kwargs}
    return factory(**kwargs, **wanted)


def _takes(factory: Any, name: str) -> bool:
    return name in inspect.signature(factory).parameters


class Rubric:
    def __init__(
        self,
        functions: list[WeightedFn],
        clip_min: float = -10.0,
        clip_max: float = 10.0,
        owned: list[Any] | None = None,
    ) -> None:
        sources = [f.source for f in functions]
        if len(set(sources)) != len(sources):
            raise ValueError(f"reward sources must be unique (set `source:` to use a function twice), got {sources}")
        self.functions = functions
        self.clip_min, self.clip_max = clip_min, clip_max
        self.owned = list(owned or [])  # resources this rubric built (its sandbox pool): closed in ``close``

    @classmethod
    def from_config(cls, config: RewardConfig, resources: dict[str, Any] | None = None) -> Rubric:
        # The math verifier gets a worker process per scoring thread: sympy answers then check side by side.
        resources = {"timeout_s": config.math_timeout_s, "workers": config.workers, **(resources or {})}
        factories = [(f, resolve(f.name)) for f in config.functions]
        owned: list[Any] = []
        try:
            if "sandbox_pool" not in resources and any(
                _takes(factory, "sandbox_pool") and "sandbox_pool" not in f.kwargs for f, factory in factories
            ):
                resources["sandbox_pool"] = SandboxPool(config.sandbox)
                owned.append(resources["sandbox_pool"])
            fns = [
                WeightedFn(f.resolved_source, _construct(factory, f.kwargs, resources), f.weight)
                for f, factory in factories
            ]
        except BaseException:
            for resource in owned:
                resource.close()
            raise
        return cls(fns, config.clip_min, config.clip_max, owned)

    def score(self, sample: Scorable) -> RewardOutcome:
        per_source: dict[str, float] = {}
        flags: list[str] = []
        metrics: dict[str, float] = {}
        for wf in self.functions:
            try:
                value = as_value(wf.fn(sample))
            except ScoringUnavailable as exc:
                log.warning("reward source %s could not score %s: %s", wf.source, sample.sample_id, exc)
                flags.append(f"{UNAVAILABLE_FLAG}:{wf.source}")
                per_source[wf.source] = 0.0
                continue
            except Exception as exc:  # a broken reward source must not stop the stream
                log.warning("reward source %s failed on %s: %s", wf.source, sample.sample_id, exc)
                flags.append(f"reward/error:{wf.source}")
                metrics[f"reward_error/{wf.source}"] = 1.0
                per_source[wf.source] = 0.0
                continue
            bad = check_value(value.score)
            per_source[wf.source] = 0.0 if bad else value.score
            flags += bad + value.flags
            metrics.update(value.metrics)
        total = sum(wf.weight * per_source[wf.source] for wf in self.functions if wf.weight != 0)
        if not self.clip_min <= total <= self.clip_max:
            flags.append(OUT_OF_RANGE_REWARD)
        unavailable = any(flag.startswith(UNAVAILABLE_FLAG) for flag in flags)
        if is_hack(flags) or unavailable:
            total = 0.0
        metrics["reward/hacked"] = float(is_hack(flags))
        metrics["reward/unavailable_frac"] = float(unavailable)  # hetrl.monitor.names: averaged over the step
        return RewardOutcome(total=total, per_source=per_source, flags=sorted(set(flags)), metrics=metrics)

    def close(self) -> None:
        for wf in self.functions:
            close = getattr(wf.fn, "close", None)
            if callable(close):
                close()
        owned, self.owned = self.owned, []
        for resource in owned:
            resource.close()
