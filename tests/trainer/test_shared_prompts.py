"""Shared-prompt rows (trainer.shared_prompts): the layout, and training that equals one row per sample (DP, TP, PP)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from samples import make_samples

from hetrl.config.algorithm import AlgorithmConfig
from hetrl.config.model import ModelConfig
from hetrl.config.trainer import TrainerConfig
from hetrl.records import SampleMeta
from hetrl.trainer.batch import build_train_batch
from hetrl.trainer.shards import shard_indices
from hetrl.trainer.shared_prompts import PAD_BRANCH, prompt_groups, tree_length

DENSE = ModelConfig(arch="llama", num_layers=2)
ALGO = AlgorithmConfig(name="grpo", group_size=4, kl_coef=0.1, entropy_coef=0.01)
ADVANTAGES = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 0.3, -0.3, 0.7, -0.2, 0.1, -0.6])


def grouped_samples(vocab: int = 128) -> list:
    """Three GRPO groups of 4: each group's samples share its first sample's prompt (one has a 1-token prompt)."""
    samples = make_samples(12, vocab=vocab, seed=3)
    samples[8] = dataclasses.replace(samples[8], prompt_ids=samples[8].prompt_ids[:1])
    return [
        dataclasses.replace(s, prompt_ids=samples[4 * (i // 4)].prompt_ids, group_id=f"g{i // 4}")
        for i, s in enumerate(samples)
    ]


def test_each_completion_token_is_read_where_its_branch_predicts_it():
    samples = grouped_samples()
    batch = build_train_batch(samples, micro_batch_size=2, shared_prompts=True)
    # a tree per prompt, a micro-batch's trees in one row
    assert [mb.tokens.shape[0] for mb in batch.micro_batches] == [1, 1]
    assert sum(int(mb.tree_ids[0].max()) + 1 for mb in batch.micro_batches) == 3
    assert (
        batch.num_tokens
        == sum(tree_length(samples[i : i + 4]) for i in (0, 4, 8))
        < sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    )
    for mb in batch.micro_batches:
        labels, positions = mb.labels.flatten(), mb.position_ids.flatten()
        for i, k in enumerate(mb.sample_indices):
            s, c = samples[k], len(samples[k].completion_ids)
            at = mb.gather_index[i, :c]
            assert labels[at].tolist() == s.completion_ids  # each completion token is its predicting position's label
            assert positions[at].tolist() == list(
                range(len(s.prompt_ids) - 1, len(s.prompt_ids) - 1 + c)
            )  # as in a row of its own
            assert mb.loss_mask[i, :c].tolist() == [float(m) for m in s.loss_mask]
        assert set(mb.tree_ids[1].unique().tolist()) <= {PAD_BRANCH, 0, 1, 2, 3, 4}


def test_a_row_is_one_group_even_when_two_groups_share_a_prompt():
    """A task drawn twice in a step: two rows of 4 branches, not one of 8 that every other row is padded to."""
    samples = grouped_samples()
    twice = samples[:4] + [dataclasses.replace(s, prompt_ids=samples[0].prompt_ids) for s in samples[4:8]]
    assert prompt_groups(twice) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def dense_tree_attention(query, key, value, tree_ids, scale):
    """The rule tree_attention implements, as a dense ``T x T`` mask: a query sees earlier keys of its own tree
    that are in the prompt (branch 0) or in its own branch; padding sees earlier padding."""
    tree, branch = tree_ids
    length = tree.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    same_tree = tree[:, :, None] == tree[:, None, :]
    allowed = causal & same_tree & ((branch[:, :, None] == branch[:, None, :]) | (branch == 0)[:, None, :])
    q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
    k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None], scale=scale)
    return out.permute(2, 0, 1, 3).flatten(2)


@pytest.mark.parametrize("scores", ["matmul", "sdpa"])
def test_tree_attention_equals_the_dense_tree_mask(scores, monkeypatch):
    """Values and gradients at every real position, over trees of different prompt lengths (one of a single
    token: no shared keys), branch counts and lengths, two rows of several trees, padding, and grouped-query
    heads; with score blocks as matmuls (short ones) and through scaled_dot_product_attention (long ones)."""
    from hetrl.trainer import shared_prompts
    from hetrl.trainer.shared_prompts import tree_attention

    if scores == "sdpa":
        monkeypatch.setattr(shared_prompts, "_MATMUL_SCORES_MAX", 0)

    samples = grouped_samples()
    micro = build_train_batch(
        samples[:7] + samples[8:] + samples[:4], micro_batch_size=2, shared_prompts=True
    ).micro_batches
    length = max(mb.tree_ids.shape[2] for mb in micro)
    tree_ids = torch.cat(
        [torch.nn.functional.pad(mb.tree_ids, (0, length - mb.tree_ids.shape[2]), value=PAD_BRANCH) for mb in micro],
        dim=1,
    )
    rows = tree_ids.shape[1]
    assert (
        rows == 2
        and (tree_ids == PAD_BRANCH).any()
        and int(tree_ids[0].max()) == 1
        and len(set(tree_ids[1].max(1).values.tolist())) > 1
    )
    heads, groups, dim = 4, 2, 8
    gen = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(length, rows, h, dim, generator=gen, dtype=torch.float64, requires_grad=True)
        for h in (heads, groups, groups)
    )
    real = (tree_ids[0] != PAD_BRANCH).t()[:, :, None]  # [T, R, 1]
    weights = torch.randn(length, rows, heads * dim, generator=gen, dtype=torch.float64)
    results = []
    for attend in (tree_attention, dense_tree_attention):
        out = attend(q, k, v, tree_ids, 0.3)
        (out * weights * real).sum().backward()
        results.append((out * real, *(t.grad.clone() for t in (q, k, v))))
        for t in (q, k, v):
            t.grad = None
    for got, expected in zip(*results):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    assert (results[0][0] == 0).sum() < results[0][0].numel()  # not all zero


def test_data_parallel_shards_keep_a_prompts_samples_together():
    samples = grouped_samples()
    metas = [SampleMeta.of(s) for s in samples]
    shards = [shard_indices(metas, rank, 2, shared_prompts=True) for rank in range(2)]
    assert sorted(shards[0] + shards[1]) == list(range(12))
    groups = prompt_groups(samples)
    assert all(any(set(g) <= set(shard) for shard in shards) for g in groups)
    with pytest.raises(ValueError, match="3 groups cannot feed 4 data-parallel ranks"):
        shard_indices(metas, 0, 4, shared_prompts=True)


def _train(tcfg: TrainerConfig) -> dict:
    from hetrl.trainer.parallel import destroy_parallel
    from hetrl.trainer.policy import PolicyTrainer

    trainer = PolicyTrainer(DENSE, tcfg, ALGO, seed=11, max_len=16)
    try:
        batch = trainer.make_batch(grouped_samples(DENSE.vocab_size)).with_advantages(ADVANTAGES)
        first = trainer.compute_logprobs(batch)
        history = [trainer.train_step(batch) for _ in range(2)]
        params = {name: p.detach().clone() for name, p in trainer.module.named_parameters()}
        return {
            "history": history,
            "first_logprobs": first,
            "final_logprobs": trainer.compute_logprobs(batch),
            "params": params,
            "tokens": batch.num_tokens,
        }
    finally:
        destroy_parallel()


def _shared_vs_one_row_per_sample(rank: int, world_size: int) -> dict:
    base = TrainerConfig(precision="fp32", lr=1e-3, micro_batch_size=2, grad_clip=1.0)
    shared = base.model_copy(update={"shared_prompts": True, "micro_batch_size": 1})
    return {
        "rows": _train(base),
        "dp2": _train(shared),
        "dp2_trees_in_a_row": _train(
            shared.model_copy(update={"micro_batch_size": 2})
        ),  # a rank's two groups in one row
        "tp2": _train(shared.model_copy(update={"tensor_parallel": 2})),
        "pp2": _train(shared.model_copy(update={"pipeline_parallel": 2})),
    }


def test_shared_prompts_train_as_one_row_per_sample(two_ranks) -> None:
    """Reference KL and entropy bonus included; log-probs before and after two steps, losses, grad norms."""
    results = two_ranks.run(_shared_vs_one_row_per_sample)
    for rank_result in results:
        base = rank_result["rows"]
        for layout in ("dp2", "dp2_trees_in_a_row", "tp2", "pp2"):
            run = rank_result[layout]
            torch.testing.assert_close(
                run["first_logprobs"], base["first_logprobs"], atol=1e-5, rtol=0, msg=lambda m, x=layout: f"{x}: {m}"
            )
            torch.testing.assert_close(
                run["final_logprobs"], base["final_logprobs"], atol=1e-5, rtol=0, msg=lambda m, x=layout: f"{x}: {m}"
            )
            for step, (got, want) in enumerate(zip(run["history"], base["history"])):
                for key in ("loss/total", "loss/policy", "loss/kl", "entropy", "grad_norm"):
                    assert abs(got[key] - want[key]) <= 1e-5 * max(1.0, abs(want[key])), (
                        f"{layout} step {step} {key}: {got[key]} vs {want[key]}"
                    )
    tokens = {layout: sum(r[layout]["tokens"] for r in results) for layout in ("rows", "dp2")}
    assert tokens["dp2"] < tokens["rows"], tokens  # a prompt is computed once per group
    assert results[0]["rows"]["first_logprobs"].abs().sum() > 0
