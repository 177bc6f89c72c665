import threading

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hetrl.config.reward import RewardConfig  # noqa: E402
from hetrl.reward.reward_model import RewardModelServer  # noqa: E402
from hetrl.reward.rubric import Rubric  # noqa: E402
from hetrl.types import Sample  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        num_labels=1, pad_token_id=0, max_position_embeddings=128,
    )
    path = tmp_path_factory.mktemp("rm")
    transformers.LlamaForSequenceClassification(config).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def server(checkpoint):
    srv = RewardModelServer(checkpoint, batch_size=4, max_length=32, max_wait_s=0.05)
    yield srv
    srv.close()


def test_batched_scores_match_single(server):
    seqs = [([1, 2, 3], [4, 5]), ([9], [10, 11, 12, 13, 14]), ([7, 7], [8])]
    singles = [server.forward([p + c])[0] for p, c in seqs]
    before = server.batches_run
    batched = server.score_batch(seqs)
    assert batched == pytest.approx(singles, abs=1e-5)  # padding does not leak into the score
    assert server.batches_run - before == 1
    assert len(set(round(x, 6) for x in batched)) == 3


def test_concurrent_requests_are_batched(server):
    results = {}

    def ask(i):
        results[i] = server.score([1, 2], [3 + i])

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    before = server.batches_run
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8 and server.batches_run - before < 8


def test_left_truncation_keeps_the_response(server):
    long_prompt = list(range(1, 60))
    assert server.score(long_prompt, [5, 6]) == pytest.approx(server.forward([(long_prompt + [5, 6])[-32:]])[0], abs=1e-5)


def test_usable_as_reward_function(server):
    rubric = Rubric.from_config(RewardConfig(functions=[{"name": "reward_model", "weight": 0.5}]), resources={"reward_model": server})
    sample = Sample("s", "g", "t", [1, 2], [3, 4], [1, 1], [0.0, 0.0], [0, 0])
    out = rubric.score(sample)
    assert out.total == pytest.approx(0.5 * server.score([1, 2], [3, 4]), abs=1e-6) and not out.flags
