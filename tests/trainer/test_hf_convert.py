"""HF <-> megatron conversion: logits match HF's, export(import(x)) == x bit for bit, in every layout.

Every layout runs on the session's two gloo ranks (``two_ranks``); HF checkpoints are random-init
tiny models built here (init_std 0.2 so that logits are far from flat and a wrong head, group or
expert order would show).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from hetrl.config.model import ModelConfig
from hetrl.config.trainer import TrainerConfig
from hetrl.models.hf import build_random_hf_checkpoint

# vocab 127 is not a multiple of TP=2: the embedding is padded and the padding must round-trip away.
SMALL = dict(
    hidden_size=64, num_layers=2, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=96, vocab_size=127
)
MOE = dict(num_experts=4, moe_ffn_hidden_size=48, moe_router_topk=2)
TOKENS = torch.randint(0, 127, (2, 11), generator=torch.Generator().manual_seed(3))

# name -> (model overrides, trainer layout)
CASES = {
    "llama_tp2": (dict(arch="llama"), dict(tensor_parallel=2)),
    "qwen2_tp2": (dict(arch="qwen2"), dict(tensor_parallel=2)),
    "qwen3_tied_tp2": (dict(arch="qwen3", tie_word_embeddings=True), dict(tensor_parallel=2)),
    "qwen3_moe_ep2": (dict(arch="qwen3_moe", **MOE), dict(expert_parallel=2)),
    "qwen3_moe_tp2": (dict(arch="qwen3_moe", **MOE), dict(tensor_parallel=2)),
    "llama_tied_pp2": (dict(arch="llama", tie_word_embeddings=True), dict(pipeline_parallel=2)),
}


def model_cfg(name: str) -> ModelConfig:
    return ModelConfig(**SMALL, **CASES[name][0])


def trainer_cfg(name: str) -> TrainerConfig:
    return TrainerConfig(precision="fp32", **CASES[name][1])


def read_safetensors(directory: Path) -> dict[str, torch.Tensor]:
    """All tensors of an HF directory; a name stored twice (in two files) is an error."""
    tensors = {}
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), "pt") as handle:
            for key in handle.keys():
                if key in tensors:
                    raise AssertionError(f"{key} is stored twice in {directory}")
                tensors[key] = handle.get_tensor(key)
    return tensors


def _import_forward_export(rank: int, world_size: int, name: str, hf_dir: Path, out_dir: Path) -> dict:
    """Import ``hf_dir`` into the case's layout, return full logits (last stage), export to ``out_dir``."""
    import torch.distributed as dist

    from hetrl.trainer.exporter import save_hf_checkpoint
    from hetrl.trainer.hf_convert import load_hf_checkpoint
    from hetrl.trainer.model import build_gpt_model
    from hetrl.trainer.parallel import destroy_parallel, init_parallel

    mcfg, tcfg = model_cfg(name), trainer_cfg(name)
    groups = init_parallel(tcfg)
    try:
        model = build_gpt_model(mcfg, tcfg, pg_collection=groups.pg_collection, seed=11).eval()
        load_hf_checkpoint(model, hf_dir, groups.pg_collection)
        logits = None
        if tcfg.pipeline_parallel == 1:
            with torch.no_grad():
                local = model(TOKENS, torch.arange(TOKENS.shape[1]).expand_as(TOKENS), None)
            shards = [torch.empty_like(local) for _ in range(groups.tp_size)]
            dist.all_gather(shards, local.contiguous(), group=groups.tp)
            logits = torch.cat(shards, dim=-1)[..., : mcfg.vocab_size]
        save_hf_checkpoint(model, mcfg, out_dir, max_shard_bytes=40_000, pg_collection=groups.pg_collection)
        return {"logits": logits}
    finally:
        destroy_parallel()


@pytest.fixture(scope="module")
def converted(two_ranks, tmp_path_factory):
    """Each case imported, run and exported once: name -> (hf_dir, export_dir, rank results)."""
    results = {}
    for name in CASES:
        hf_dir = build_random_hf_checkpoint(
            model_cfg(name), tmp_path_factory.mktemp(f"{name}_hf"), seed=5, init_std=0.2
        )
        out_dir = tmp_path_factory.mktemp(f"{name}_export")
        results[name] = (hf_dir, out_dir, two_ranks.run(_import_forward_export, name, hf_dir, out_dir))
    return results


def hf_logits(hf_dir: Path) -> torch.Tensor:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(TOKENS).logits


@pytest.mark.parametrize("name", [n for n in CASES if "pp2" not in n])
def test_imported_logits_match_hf(converted, name: str) -> None:
    hf_dir, _, ranks = converted[name]
    reference = hf_logits(hf_dir)
    assert reference.std() > 0.5  # far from flat: a permuted head or expert would not hide
    for result in ranks:  # TP ranks gathered the same logits; EP ranks ran the same batch
        torch.testing.assert_close(result["logits"], reference, rtol=0, atol=1e-4)


@pytest.mark.parametrize("name", list(CASES))
def test_export_of_import_is_bit_exact(converted, name: str) -> None:
    hf_dir, out_dir, _ = converted[name]
    original, exported = read_safetensors(hf_dir), read_safetensors(out_dir)
    assert sorted(exported) == sorted(original)
    for key, tensor in original.items():
        assert exported[key].dtype == tensor.dtype, key
        assert torch.equal(exported[key], tensor), key


def test_export_writes_a_loadable_sharded_hf_checkpoint(converted) -> None:
    """40 kB shards force several files: the index must let transformers load them."""
    hf_dir, out_dir, _ = converted["llama_tp2"]
    assert len(list(out_dir.glob("model-*-of-*.safetensors"))) > 1
    torch.testing.assert_close(hf_logits(out_dir), hf_logits(hf_dir), rtol=0, atol=0)


def _import_mismatched(rank: int, world_size: int, hf_dir: Path) -> str:
    from hetrl.trainer.hf_convert import load_hf_checkpoint
    from hetrl.trainer.model import build_gpt_model
    from hetrl.trainer.parallel import destroy_parallel, init_parallel

    tcfg = TrainerConfig(precision="fp32", tensor_parallel=2)
    groups = init_parallel(tcfg)
    try:
        model = build_gpt_model(ModelConfig(**SMALL, arch="llama"), tcfg, pg_collection=groups.pg_collection)
        try:
            load_hf_checkpoint(model, hf_dir, groups.pg_collection)
        except ValueError as err:
            return str(err)
        return "no error"
    finally:
        destroy_parallel()


def test_architecture_mismatch_is_an_error_on_every_rank(two_ranks, converted) -> None:
    """A Qwen2 checkpoint (qkv biases) into a Llama model: the biases must not be dropped silently."""
    hf_dir = converted["qwen2_tp2"][0]
    for message in two_ranks.run(_import_mismatched, hf_dir):
        assert "q_proj.bias" in message and "no parameter" in message
