"""The trainer and the IPC weight transport on a real GPU (CUDA, NCCL, bf16). Skipped without one.

CI machines have no GPU; a device session runs these with ``tests/gpu/device_check.sh``. One
process, one GPU: a world of one NCCL rank (multi-rank layouts are covered on CPU over gloo). With
transformer-engine installed, its layer spec is checked against the local one, packed rows too.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from hetrl.config.algorithm import AlgorithmConfig
from hetrl.config.trainer import TrainerConfig
from hetrl.models.hf import build_random_hf_checkpoint
from tests.gpu.models import MODEL
from tests.trainer.samples import make_samples

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module", autouse=True)
def nccl_world():
    import torch.distributed as dist

    from hetrl.trainer.parallel import destroy_parallel

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=os.environ.get("HETRL_TEST_PORT", "29577"),
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
    )
    dist.init_process_group("nccl")
    yield
    destroy_parallel(destroy_world=True)


def _trainer(precision: str = "fp32", **trainer):
    from hetrl.trainer.policy import PolicyTrainer

    cfg = TrainerConfig(precision=precision, lr=1e-3, micro_batch_size=4, **trainer)
    return PolicyTrainer(
        MODEL, cfg, AlgorithmConfig(name="grpo", group_size=2), seed=3, max_len=16, with_reference=False
    )


def _logprobs(**trainer) -> torch.Tensor:
    from hetrl.trainer.parallel import destroy_parallel

    policy = _trainer(**trainer)
    try:
        return policy.compute_logprobs(policy.make_batch(make_samples(8, vocab=MODEL.vocab_size)))
    finally:
        destroy_parallel()


def test_the_cpu_compatibility_layer_stays_off_and_weights_live_on_the_gpu():
    from hetrl.trainer import megatron_compat
    from hetrl.trainer.parallel import destroy_parallel

    assert megatron_compat.ensure_applied() is False
    policy = _trainer()
    try:
        assert all(p.is_cuda for p in policy.module.parameters())
        assert policy.groups.device.type == "cuda"
    finally:
        destroy_parallel()


def test_imported_checkpoint_matches_hf_logits_on_gpu(tmp_path: Path):
    import transformers

    from hetrl.trainer.hf_convert import load_hf_checkpoint
    from hetrl.trainer.model import build_gpt_model
    from hetrl.trainer.parallel import destroy_parallel, init_parallel

    hf_dir = build_random_hf_checkpoint(MODEL, tmp_path / "hf", seed=5, init_std=0.2)
    tokens = torch.randint(0, MODEL.vocab_size, (2, 11), generator=torch.Generator().manual_seed(3)).cuda()
    reference = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).cuda().eval()
    tcfg = TrainerConfig(precision="fp32", transformer_impl="local")
    groups = init_parallel(tcfg)
    try:
        model = build_gpt_model(MODEL, tcfg, pg_collection=groups.pg_collection, seed=11).eval()
        load_hf_checkpoint(model, hf_dir, groups.pg_collection)
        with torch.no_grad():
            got = model(tokens, torch.arange(tokens.shape[1], device="cuda").expand_as(tokens), None)[
                ..., : MODEL.vocab_size
            ]
            want = reference(tokens).logits
    finally:
        destroy_parallel()
    torch.testing.assert_close(got, want, rtol=0, atol=2e-4)


def test_packed_rows_match_unpacked_on_gpu():
    unpacked = _logprobs(transformer_impl="local")
    packed = _logprobs(transformer_impl="local", pack_length=32)
    torch.testing.assert_close(packed, unpacked, rtol=0, atol=2e-4)


def test_shared_prompt_trees_match_one_row_per_sample_on_gpu():
    """Tree attention (index gathers, matmul score blocks) on CUDA: each sample a tree, all in one row."""
    rows = _logprobs(transformer_impl="local")
    torch.testing.assert_close(_logprobs(transformer_impl="local", shared_prompts=True), rows, rtol=0, atol=2e-4)


def test_transformer_engine_spec_matches_the_local_spec():
    pytest.importorskip("transformer_engine")
    local = _logprobs(transformer_impl="local")
    torch.testing.assert_close(_logprobs(transformer_impl="transformer_engine"), local, rtol=0, atol=2e-4)
    torch.testing.assert_close(
        _logprobs(transformer_impl="transformer_engine", pack_length=32), local, rtol=0, atol=2e-4
    )


def test_a_bf16_policy_gradient_step_moves_logprobs_the_advantaged_way():
    from hetrl.trainer.parallel import destroy_parallel

    policy = _trainer("bf16", transformer_impl="local")
    try:
        samples = make_samples(8, vocab=MODEL.vocab_size)
        advantages = torch.tensor([1.0, -1.0] * 4)
        batch = policy.make_batch(samples).with_advantages(advantages)
        before = policy.compute_logprobs(batch)
        metrics = [policy.train_step(batch, old_logprobs=before) for _ in range(3)]
        after = policy.compute_logprobs(batch)
    finally:
        destroy_parallel()
    assert all(torch.isfinite(torch.tensor(m["loss/total"])) and m["grad_norm"] > 0 for m in metrics)
    moved = (after - before).sum(dim=1)
    assert (moved[advantages > 0] > 0).all() and (moved[advantages < 0] < 0).all(), moved


def _ipc_state() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    return {f"layer{i}.weight": torch.randn(64, 64, generator=generator) for i in range(8)}


def _ipc_sender(port: int) -> None:
    """Trainer rank 0 in a process of its own (a CUDA IPC handle does not open in its own process)."""
    from hetrl.transport.weights import bucketize, build_weight_sender, init_weight_sync_group

    group = init_weight_sync_group("127.0.0.1", port, rank=0, world_size=2, backend="nccl", timeout_s=60)
    state = {name: tensor.cuda() for name, tensor in _ipc_state().items()}
    build_weight_sender("ipc", group=group, verify=True).send(bucketize(state.items(), 1 << 16), version=1)


def test_ipc_push_arrives_whole_and_verified():
    """Sender and receiver processes share the GPU; only handles and acknowledgements cross."""
    import torch.multiprocessing as mp

    from hetrl.transport.weights import build_weight_receiver, init_weight_sync_group
    from tests.rollout.helpers import free_port

    port = free_port()
    sender = mp.get_context("spawn").Process(target=_ipc_sender, args=(port,))
    sender.start()
    group = init_weight_sync_group("127.0.0.1", port, rank=1, world_size=2, backend="nccl", timeout_s=60)
    staged = build_weight_receiver("ipc", group=group, verify=True, shared_memory=True).receive()
    sender.join(timeout=60)
    assert sender.exitcode == 0 and staged.version == 1
    for name, tensor in _ipc_state().items():
        assert staged.tensors[name].device.type == "cpu"  # staged in /dev/shm, as for a TP engine
        assert torch.equal(staged.tensors[name], tensor)
