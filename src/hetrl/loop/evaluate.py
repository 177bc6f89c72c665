"""Standalone evaluation of a checkpoint on the recipe's held-out tasks, in one process (no MPI).

``python launch.py eval recipe=NAME checkpoint=PATH`` lands here. The held-out draw, the sampling
parameters, the episode runner and the rubric are the training loop's own, so a checkpoint scores
here exactly what the loop's eval of the same weights printed (``summary.json``'s ``eval_before``
for ``RUN/initial_model``, ``eval_after`` for the final ``RUN/checkpoints``).

``PATH`` is either

* an HF checkpoint directory (``config.json`` + ``*.safetensors`` + tokenizer files), served as is;
* a run's trainer checkpoint: ``RUN/checkpoints`` (its ``latest`` is used) or one ``step_N``
  directory in it. It is loaded into a single-process :class:`~hetrl.trainer.policy.PolicyTrainer`
  (a torch.distributed world of 1; dist_checkpointing reshards any saved TP/PP/EP layout to it),
  exported to a temporary HF directory (:mod:`hetrl.loop.export`, as ``launch.py export`` does), and
  served from there.

The recipe's ``model:`` shape must match the checkpoint's (checked before anything heavy starts).
The report is printed and written as ``eval.json`` into the checkpoint directory (the resolved
``step_N`` one for trainer checkpoints) unless another path is given.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hetrl.config.loader import validate_tree
from hetrl.config.model import ModelConfig
from hetrl.config.schema import HetrlConfig
from hetrl.control import rundir
from hetrl.control.comm import naps
from hetrl.env.chat import ChatCodec
from hetrl.env.registry import env_factory
from hetrl.env.runner import run_episode
from hetrl.loop.driver import eval_tasks
from hetrl.loop.export import CheckpointError, CheckpointKind, export_trainer_checkpoint, resolve_checkpoint, run_dir_of
from hetrl.loop.orchestrator import sampling_for
from hetrl.models.hf import HF_ARCHITECTURES, hf_config, hf_config_dict
from hetrl.monitor.eval import eval_metrics
from hetrl.records import GenerationRequest, GenerationResult, Sample, SampleMeta, SamplingParams
from hetrl.reward.rubric import Rubric

EVAL_FILE = "eval.json"
# config.json keys that fix the tensor shapes: a mismatch means the recipe describes another model.
_SHAPE_KEYS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "tie_word_embeddings",
    "num_experts",
    "moe_intermediate_size",
)


@dataclass(frozen=True)
class EvalReport:
    """What one evaluation measured (``eval.json``)."""

    checkpoint: str
    kind: CheckpointKind
    recipe: str
    mean_reward: float
    num_tasks: int
    num_samples: int
    metrics: dict[str, float]  # eval/<task>/pass@<k>, eval/<task>/mean@<k>

    def lines(self) -> list[str]:
        """Human-readable summary, one metric a line."""
        head = (
            f"[hetrl] eval of {self.checkpoint} ({self.kind}): mean reward {self.mean_reward:.4f} over "
            f"{self.num_samples} samples of {self.num_tasks} tasks"
        )
        return [head, *(f"  {name} = {value:.4f}" for name, value in sorted(self.metrics.items()))]


# --------------------------------------------------------------------------- checkpoint formats


_VISION_SHAPE_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "image_size",
    "patch_size",
)


def _shape_of(config: dict[str, Any]) -> dict[str, Any]:
    """The shapes an HF config fixes; a vision-language config's text model under the same names, its vision tower as
    vision.*."""
    text = config.get("text_config") or config
    shape = {key: text.get(key) for key in _SHAPE_KEYS if text.get(key) is not None}
    vision = config.get("vision_config") or {}
    return shape | {f"vision.{key}": vision[key] for key in _VISION_SHAPE_KEYS if vision.get(key) is not None}


def _recipe_config(model: ModelConfig) -> dict[str, Any]:
    """The HF config a recipe's ``model:`` describes, as a dict (a vision-language one nested as HF saves it)."""
    return hf_config(model).to_dict() if model.is_vlm else hf_config_dict(model)


def check_model_shape(model: ModelConfig, found: dict[str, Any], where: str) -> None:
    """Raise if the HF config dict ``found`` (from ``where``) describes other shapes than ``model``."""
    expected, actual = _shape_of(_recipe_config(model)), _shape_of(found)
    wrong = [
        f"{key}: recipe {expected[key]}, checkpoint {actual[key]}"
        for key in expected
        if key in actual and actual[key] != expected[key]
    ]
    architectures = found.get("architectures") or []
    if architectures and HF_ARCHITECTURES[model.arch] not in architectures:
        wrong.append(
            f"architecture: recipe {HF_ARCHITECTURES[model.arch]} (model.arch={model.arch}), checkpoint {architectures}"
        )
    if wrong:
        raise CheckpointError(
            f"the recipe's model: section does not match the checkpoint {where}: "
            + "; ".join(wrong)
            + ". Evaluate with the recipe (and model.* overrides) the checkpoint was trained with."
        )


def _check_trainer_checkpoint_shape(cfg: HetrlConfig, step_dir: Path) -> None:
    """Compare the recipe's model with the run's saved config.yaml, when the checkpoint sits in a run."""
    import yaml

    run_config = run_dir_of(step_dir) / rundir.CONFIG
    if run_config.exists():
        run_model = validate_tree(yaml.safe_load(run_config.read_text())).model
        found = {**_recipe_config(run_model), "architectures": [HF_ARCHITECTURES[run_model.arch]]}
        check_model_shape(cfg.model, found, f"{step_dir} (per {run_config})")


# --------------------------------------------------------------------------- episodes


def eval_sampling(cfg: HetrlConfig, eos_token_id: int) -> SamplingParams:
    """The loop's eval sampling, from the one definition the orchestrator uses too."""
    return sampling_for(cfg, "eval", eos_token_id)


async def _run_episodes(
    engine: Any, cfg: HetrlConfig, codec: Any, tasks: list[tuple[Any, int]], sampling: SamplingParams
) -> list[Sample]:
    """Every held-out episode at once on one engine; ids and seeds as the orchestrator makes them."""
    make_env = env_factory(cfg.env, sandbox=cfg.reward.sandbox)
    waiting: dict[str, asyncio.Future] = {}
    request_ids = itertools.count()

    async def generate(
        prompt_ids: list[int], params: SamplingParams, images: list[Any] | None = None
    ) -> GenerationResult:
        request_id = f"eval-{next(request_ids)}"
        waiting[request_id] = asyncio.get_running_loop().create_future()
        engine.submit(GenerationRequest(request_id, prompt_ids, params, images=list(images or [])))
        return await waiting[request_id]

    async def episode(task: Any, seed: int, sample_id: str, group_id: str) -> Sample:
        env = make_env()
        try:
            return await run_episode(
                env,
                task,
                seed,
                generate,
                codec,
                SamplingParams(**{**sampling.__dict__, "seed": seed}),
                cfg.env.max_turns,
                cfg.env.max_episode_tokens,
                sample_id,
                group_id,
            )
        finally:
            await env.close()

    jobs = [
        asyncio.ensure_future(episode(task, seed * 1000 + i, f"e{g}.{i}", f"e{g}"))
        for g, (task, seed) in enumerate(tasks)
        for i in range(cfg.eval.k)
    ]
    pauses = naps()  # the engine idles while episodes wait on their tools: nap as every role's loop does
    while not all(job.done() for job in jobs):
        failed = [job for job in jobs if job.done() and job.exception() is not None]
        if failed:
            raise failed[0].exception()
        if engine.has_work():
            for result in engine.poll():
                waiting.pop(result.request_id).set_result(result)
            pauses = naps()
            await asyncio.sleep(0)
        else:
            await asyncio.sleep(next(pauses))
    return [job.result() for job in jobs]


def evaluate_hf(cfg: HetrlConfig, hf_dir: Path, tasks: list[tuple[Any, int]]) -> list[Sample]:
    """Generate and score the held-out episodes with the weights of ``hf_dir``; samples in id order."""
    # lazy: transformers and the engine (torch, vLLM) load only where episodes are generated
    from transformers import AutoTokenizer

    from hetrl.rollout.engine import GenerationEngine

    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    engine = GenerationEngine(hf_dir, cfg.rollout, dtype=cfg.engine_dtype, seed=cfg.run.seed)
    try:
        samples = asyncio.run(
            _run_episodes(engine, cfg, ChatCodec(tokenizer), tasks, eval_sampling(cfg, tokenizer.eos_token_id))
        )
    finally:
        engine.shutdown()
    rubric = Rubric.from_config(cfg.reward)
    try:
        return [rubric.score(sample).apply_to(sample) for sample in samples]
    finally:
        rubric.close()


# --------------------------------------------------------------------------- entry point


def evaluate_checkpoint(cfg: HetrlConfig, checkpoint: str | Path, out: str | Path | None = None) -> EvalReport:
    """Evaluate ``checkpoint`` on the recipe's held-out tasks; write the report to ``out`` (default: into the checkpoint
    dir)."""
    kind, path = resolve_checkpoint(checkpoint)
    if kind == "hf":
        check_model_shape(cfg.model, json.loads((path / "config.json").read_text()), str(path))
    else:
        _check_trainer_checkpoint_shape(cfg, path)
    tasks = eval_tasks(cfg)
    if kind == "hf":
        samples = evaluate_hf(cfg, path, tasks)
    else:
        with tempfile.TemporaryDirectory(prefix="hetrl-eval-") as tmp:
            samples = evaluate_hf(cfg, export_trainer_checkpoint(cfg, path, Path(tmp)), tasks)
    report = EvalReport(
        checkpoint=str(path),
        kind=kind,
        recipe=cfg.recipe,
        mean_reward=sum(s.reward for s in samples) / len(samples),
        num_tasks=len(tasks),
        num_samples=len(samples),
        metrics=eval_metrics([SampleMeta.of(s) for s in samples], ks=sorted({1, cfg.eval.k})),
    )
    target = Path(out) if out is not None else path / EVAL_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(asdict(report), indent=1))
    return report
