"""PPO's value model: one step on the trainer reproduces across layouts, starts from HF weights,
and is saved and resumed with the policy; the trainer computes the step's advantages itself."""

from __future__ import annotations

from pathlib import Path

import torch
from rank_pool import may_start_processes
from samples import make_samples, whole_step

from hetrl.config.algorithm import AlgorithmConfig
from hetrl.config.critic import CriticConfig
from hetrl.config.model import ModelConfig
from hetrl.config.trainer import TrainerConfig

MODEL = ModelConfig(
    arch="llama", num_layers=2, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4, num_query_groups=2
)
PPO = AlgorithmConfig(name="ppo", group_size=2, value_clip=0.5, kl_coef=0.05, kl_in_reward=True, gamma=1.0, lam=0.9)
BASE = TrainerConfig(precision="fp32", lr=1e-3, micro_batch_size=2, grad_clip=1.0)


def _rewarded(n: int = 8):
    samples = make_samples(n, vocab=MODEL.vocab_size)
    for i, s in enumerate(samples):
        s.reward = float(i % 3) - 0.5
    return samples


def _ppo_steps(tcfg: TrainerConfig, steps: int = 2, minibatches: int = 2) -> dict:
    from hetrl.trainer.critic import ValueTrainer
    from hetrl.trainer.parallel import destroy_parallel
    from hetrl.trainer.policy import PolicyTrainer
    from hetrl.trainer.rl_step import train_on_batch

    samples = _rewarded()
    policy = PolicyTrainer(MODEL, tcfg, PPO, seed=5, max_len=16)
    critic = ValueTrainer(MODEL, tcfg, CriticConfig(lr=1e-2), PPO, policy.groups, seed=5, max_len=16)
    try:
        history = [
            train_on_batch(policy, critic, *whole_step(samples), num_minibatches=minibatches, max_tokens=16)[0]
            for _ in range(steps)
        ]
        batch = policy.make_batch(samples)
        return {"history": history, "values": critic.compute_values(batch), "logprobs": policy.compute_logprobs(batch)}
    finally:
        destroy_parallel()


def _layouts(rank: int, world_size: int) -> dict:
    return {
        "dp2": _ppo_steps(BASE),
        "tp2": _ppo_steps(BASE.model_copy(update={"tensor_parallel": 2})),
        "tp2_sp": _ppo_steps(BASE.model_copy(update={"tensor_parallel": 2, "sequence_parallel": True})),
        "pp2": _ppo_steps(BASE.model_copy(update={"pipeline_parallel": 2})),
        "cp2": _ppo_steps(BASE.model_copy(update={"context_parallel": 2})),
    }


def test_ppo_step_with_critic_reproduces_across_layouts(two_ranks) -> None:
    """TP=2 (with and without sequence parallelism), PP=2 and CP=2 reproduce DP=2 within 1e-5: the values, the value
    loss and the policy."""
    results = two_ranks.run(_layouts)
    base = results[0]["dp2"]
    first, second = base["history"]
    assert first["loss/value"] > 0 and first["critic/grad_norm"] > 0
    assert second["loss/value"] < first["loss/value"]  # the critic learns the returns
    assert abs(first["advantage/mean"]) < 1e-5 and first["advantage/std"] > 0.5  # whitened GAE
    for layout in ("tp2", "tp2_sp", "pp2", "cp2"):
        for rank_result in results:
            run = rank_result[layout]
            for step, (got, want) in enumerate(zip(run["history"], base["history"])):
                for key in (
                    "loss/value",
                    "value/mean",
                    "critic/grad_norm",
                    "loss/policy",
                    "grad_norm",
                    "advantage/mean",
                    "advantage/std",
                ):
                    assert abs(got[key] - want[key]) < 1e-5, f"{layout} step {step} {key}: {got[key]} vs {want[key]}"
                # A token whose value has not moved sits exactly on the clip boundary: round-off may tip it.
                assert abs(got["value/clip_frac"] - want["value/clip_frac"]) < 0.05
            torch.testing.assert_close(run["values"], base["values"], atol=1e-5, rtol=0)
            torch.testing.assert_close(run["logprobs"], base["logprobs"], atol=1e-5, rtol=0)


def _init_from_hf(rank: int, world_size: int, policy_dir: str, classifier_dir: str, tp: int) -> dict:
    from hetrl.trainer.critic import ValueTrainer
    from hetrl.trainer.parallel import destroy_parallel
    from hetrl.trainer.policy import PolicyTrainer

    tcfg = BASE.model_copy(update={"tensor_parallel": tp})
    policy = PolicyTrainer(MODEL, tcfg, AlgorithmConfig(name="ppo", group_size=2), seed=5)
    try:
        out = {}
        for init in ("fresh", "policy", classifier_dir):
            critic = ValueTrainer(MODEL, tcfg, CriticConfig(init=init), policy.algo_cfg, policy.groups, seed=5)
            critic.load_initial_weights(init, policy_dir)
            out[init] = {name: p.detach().clone() for name, p in critic.module.named_parameters()}
            out[init]["values"] = critic.compute_values(policy.make_batch(make_samples(4, vocab=MODEL.vocab_size)))
        return out
    finally:
        destroy_parallel()


def test_critic_starts_from_the_policy_or_an_hf_token_classifier(two_ranks, tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForTokenClassification

    from hetrl.trainer.batch import build_train_batch

    hf_cfg = LlamaConfig(
        vocab_size=MODEL.vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MODEL.max_position_embeddings,
        rms_norm_eps=MODEL.norm_epsilon,
        rope_theta=MODEL.rope_theta,
        tie_word_embeddings=MODEL.tie_word_embeddings,
        num_labels=1,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(hf_cfg).save_pretrained(tmp_path / "policy")
    classifier = LlamaForTokenClassification(hf_cfg).eval()
    classifier.save_pretrained(tmp_path / "classifier")
    results = two_ranks.run(_init_from_hf, str(tmp_path / "policy"), str(tmp_path / "classifier"), 2)[0]
    fresh, from_policy, from_hf = results["fresh"], results["policy"], results[str(tmp_path / "classifier")]
    body = [name for name in fresh if name.startswith("decoder.") and "linear" in name and "norm" not in name]
    assert body
    assert all(not torch.equal(fresh[n], from_policy[n]) for n in body)  # the body came from the policy...
    torch.testing.assert_close(
        fresh["output_layer.weight"], from_policy["output_layer.weight"]
    )  # ...the head stayed fresh
    # The classifier's values equal HF's logits at the positions that predict each completion token.
    samples = make_samples(4, vocab=MODEL.vocab_size)
    batch = build_train_batch(samples, micro_batch_size=4)
    mb = batch.micro_batches[0]
    with torch.no_grad():
        logits = classifier(input_ids=mb.tokens).logits[..., 0]
    expected = logits.reshape(-1)[mb.gather_index] * mb.loss_mask
    torch.testing.assert_close(from_hf["values"][mb.sample_indices, : expected.shape[1]], expected, atol=1e-5, rtol=0)


def _save_and_resume(rank: int, world_size: int, root: str) -> dict:
    from hetrl.trainer.checkpoint import load_checkpoint, save_checkpoint
    from hetrl.trainer.critic import ValueTrainer
    from hetrl.trainer.parallel import destroy_parallel
    from hetrl.trainer.policy import PolicyTrainer
    from hetrl.trainer.rl_step import train_on_batch

    def build():
        policy = PolicyTrainer(MODEL, BASE, PPO, seed=5, max_len=16)
        return policy, ValueTrainer(MODEL, BASE, CriticConfig(lr=1e-2), PPO, policy.groups, seed=9, max_len=16)

    samples = _rewarded()
    policy, critic = build()
    try:
        train_on_batch(policy, critic, *whole_step(samples), num_minibatches=1, max_tokens=16)
        with may_start_processes():
            save_checkpoint(
                root,
                1,
                policy.model,
                policy.optimizer,
                policy.scheduler,
                pg_collection=policy.groups.pg_collection,
                critic=(critic.model, critic.optimizer, critic.scheduler),
            )
        after_save = train_on_batch(policy, critic, *whole_step(samples), num_minibatches=1, max_tokens=16)[0]
    finally:
        destroy_parallel()
    policy, critic = build()
    try:
        load_checkpoint(
            root,
            policy.model,
            policy.optimizer,
            policy.scheduler,
            pg_collection=policy.groups.pg_collection,
            critic=(critic.model, critic.optimizer, critic.scheduler),
        )
        resumed = train_on_batch(policy, critic, *whole_step(samples), num_minibatches=1, max_tokens=16)[0]
        return {"after_save": after_save, "resumed": resumed}
    finally:
        destroy_parallel()


def test_critic_is_saved_and_resumed_with_the_policy(two_ranks, tmp_path: Path) -> None:
    result = two_ranks.run(_save_and_resume, str(tmp_path / "ckpt"))[0]
    for key in ("loss/value", "value/mean", "critic/grad_norm", "critic/lr", "loss/policy", "grad_norm"):
        assert result["resumed"][key] == result["after_save"][key], key
