"""The run viewer's server (``python -m hetrl.view``) over a synthetic run: what each API answers, the
filters, live metrics, bad input shown as messages, and a run directory left as it was.
The pages themselves are driven in a real browser by test_view_browser.py (slow)."""

from __future__ import annotations

import json
import os
import re
import selectors
import subprocess
import sys
import urllib.request
from pathlib import Path

import h5py
import pytest
import torch
from monitor_synth import NUM_STEPS, make_samples
from starlette.testclient import TestClient

from hetrl.monitor import names
from hetrl.monitor.rollout_store import RolloutReader, RolloutStore, select_rows
from hetrl.trainer import advantages
from hetrl.view import run_data
from hetrl.view.app import build_app

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def client(synthetic_run) -> TestClient:
    return TestClient(build_app(synthetic_run))


def _example(template: str) -> str:
    return re.sub(r"<k>", "1", re.sub(r"<[a-z_]+>", "x", template))


def test_every_documented_metric_has_a_family():
    orphans = [spec.name for spec in names.METRICS if run_data.family_of(_example(spec.name)) == run_data.OTHER_FAMILY]
    assert not orphans, f"add these to hetrl.view.run_data.FAMILIES: {orphans}"
    assert run_data.family_of("loss/entropy") == "policy" and run_data.family_of("entropy") == "policy"
    assert run_data.family_of("reward/task/gsm/mean") == "reward" and run_data.family_of("my/own") == "other"


def test_every_page_and_its_script_are_served(client):
    for path in ("/", "/metrics", "/rollouts", "/timeline"):
        page = client.get(path)
        assert page.status_code == 200 and f'data-page="{path.strip("/") or "overview"}"' in page.text
    for asset in ("viewer.js", "viewer.css", "uPlot.iife.min.js", "uPlot.min.css"):
        assert client.get(f"/static/{asset}").status_code == 200
    page = client.get("/").text
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page), "a page must load nothing from the internet"


def test_step_groups_apply_browse_filters(client, synthetic_run):
    rows = RolloutReader(synthetic_run).rows(3)
    for query, keywords in [
        ("flag=any", {"flag": "any"}),
        ("task=gsm&min_len=5&max_len=30", {"task": "gsm", "min_len": 5, "max_len": 30}),
        ("finish=length", {"finish": "length"}),
        ("min_reward=0.5&max_reward=1.0", {"min_reward": 0.5, "max_reward": 1.0}),
        ("worst=2", {"worst": 2}),
        ("best=1", {"best": 1}),
    ]:
        got = client.get(f"/api/step/3?{query}").json()
        shown = {s["sample_id"] for g in got["groups"] for s in g["samples"]}
        assert shown == {r.sample_id for r in select_rows(rows, **keywords)}, query
        assert got["num_samples"] == len(rows) and got["missing"] == []
    got = client.get("/api/step/3").json()
    means = [g["mean_reward"] for g in got["groups"]]
    assert means == sorted(means) and got["tasks"] == ["countdown", "gsm"]
    assert client.get("/api/step/3?worst=1&best=1").status_code == 400
    assert client.get("/api/step/3?min_len=abc").json()["missing"] == ["filter min_len='abc' is not a int"]


def test_a_sample_carries_its_tokens_and_the_engine_trainer_gap(client):
    samples, trainer = make_samples(2)
    detail = client.get(f"/api/sample/2/{samples[1].sample_id}").json()
    assert [t["id"] for t in detail["tokens"]] == samples[1].completion_ids
    assert [t["mask"] for t in detail["tokens"]] == samples[1].loss_mask
    assert [t["gap"] for t in detail["tokens"]] == pytest.approx(
        [t - e for t, e in zip(trainer[1], samples[1].logprobs)], abs=1e-6
    )
    assert detail["rewards"] == samples[1].rewards and detail["prompt"] == samples[1].prompt_text
    # turns cut where the loss mask changes, and cover the completion
    turns = detail["turns"]
    assert turns[0]["start"] == 0 and turns[-1]["end"] == len(samples[1].completion_ids)
    assert all(a["end"] == b["start"] and a["who"] != b["who"] for a, b in zip(turns, turns[1:]))
    assert client.get("/api/sample/2/nope").json()["missing"] == ["rollouts: no sample 'nope' in step 2"]


def test_group_advantages_are_the_trainers():
    rows = [
        type("Row", (), {"sample_id": f"s{i}", "group_id": f"g{i // 3}", "reward": r})()
        for i, r in enumerate([0.0, 1.0, 2.0, 5.0, 5.0, 5.0, 1.0])
    ]
    rewards, groups = torch.tensor([r.reward for r in rows], dtype=torch.float64), [r.group_id for r in rows]
    for estimator, expected in [
        ("grpo", advantages.group_normalized(rewards, groups)),
        ("grpo_no_std", advantages.group_normalized(rewards, groups, scale_by_std=False)),
        ("rloo", advantages.rloo(rewards, groups)),
    ]:
        got = run_data.group_advantages(rows, estimator)
        assert list(got.values()) == pytest.approx(expected.tolist()), estimator
    assert run_data.group_advantages(rows, "gae") == {r.sample_id: None for r in rows}
    assert list(run_data.group_advantages(rows, "grpo").values())[:3] == pytest.approx([-1.0, 0.0, 1.0])


def test_metrics_come_in_increments_and_a_half_written_line_waits(tmp_path):
    run = tmp_path / "live"
    run.mkdir()
    lines = [json.dumps({"step": s, "time": 0.0, "reward/mean": 0.1 * s, "loss/kl": "nan"}) + "\n" for s in range(3)]
    (run / "metrics.jsonl").write_text(lines[0] + lines[1])
    client = TestClient(build_app(run))
    first = client.get("/api/metrics").json()
    assert [r["step"] for r in first["rows"]] == [0, 1] and first["rows"][1]["loss/kl"] is None
    assert first["families"] == {"loss/kl": "policy", "reward/mean": "reward"}
    with (run / "metrics.jsonl").open("a") as fh:
        fh.write(lines[2][:20])  # the writer is mid-line
    half = client.get(f"/api/metrics?offset={first['offset']}").json()
    assert half["rows"] == [] and half["offset"] == first["offset"]
    with (run / "metrics.jsonl").open("a") as fh:
        fh.write(lines[2][20:])
    rest = client.get(f"/api/metrics?offset={half['offset']}").json()
    assert [r["step"] for r in rest["rows"]] == [2] and rest["rows"][0]["reward/mean"] == pytest.approx(0.2)


def _tree(path: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(path.rglob("*"))}


def test_bad_input_is_a_message_and_nothing_is_written(tmp_path, synthetic_run):
    missing = TestClient(build_app(tmp_path / "nothing_here"))
    for path in ("/api/overview", "/api/metrics", "/api/steps", "/api/step/0", "/api/sample/0/x", "/api/timeline"):
        answer = missing.get(path)
        assert answer.status_code == 200 and answer.json()["missing"], path
        assert "Traceback" not in answer.text
    assert "no rollout directory" in missing.get("/api/steps").json()["missing"][0]

    partial = tmp_path / "partial"
    (partial / "rollouts").mkdir(parents=True)
    (partial / "rollouts" / "rollouts-0000.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 100)  # cut short
    for path in ("/api/steps", "/api/step/0"):
        [message] = TestClient(build_app(partial)).get(path).json()["missing"]
        assert "cannot be read" in message and "rollouts-0000.h5" in message

    foreign = tmp_path / "foreign"
    (foreign / "rollouts").mkdir(parents=True)
    with h5py.File(foreign / "rollouts" / "rollouts-0000.h5", "w") as f:
        f["something"] = [1, 2, 3]
    [message] = TestClient(build_app(foreign)).get("/api/steps").json()["missing"]
    assert "not a hetrl rollout file" in message

    older = tmp_path / "older"
    with RolloutStore(older / "rollouts") as store:
        store.append(0, *make_samples(0))
    with h5py.File(next((older / "rollouts").glob("*.h5")), "a") as f:  # format v1: no routing, no images
        for name in ("ragged/routed_experts", "ragged/image_bytes", "ragged/image_lengths", "samples/routing_layers"):
            del f[name]
    old = TestClient(build_app(older))
    assert old.get("/api/steps").json()["steps"] == {"0": 6}
    assert old.get(f"/api/sample/0/{make_samples(0)[0][0].sample_id}").json()["num_images"] == 0

    before = _tree(synthetic_run)
    client = TestClient(build_app(synthetic_run))
    for path in ("/", "/api/overview", "/api/metrics", "/api/steps", "/api/step/1?flag=any", "/api/timeline"):
        assert client.get(path).status_code == 200
    assert client.get(f"/api/sample/1/{make_samples(1)[0][0].sample_id}").status_code == 200
    assert _tree(synthetic_run) == before, "the viewer wrote into the run directory"


def _start(args: list[str]) -> tuple[subprocess.Popen, str]:
    """Start ``python -m hetrl.view`` and wait (at most 60 s) for the line with its URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "hetrl.view", *args],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    if not sel.select(timeout=60):
        proc.kill()
        pytest.fail("python -m hetrl.view printed no URL within 60 s")
    return proc, proc.stdout.readline()


def test_cli_prints_its_url_serves_and_warns_off_localhost(synthetic_run, tmp_path):
    proc, line = _start([str(synthetic_run), "--port", "0"])
    try:
        url = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert url, line
        with urllib.request.urlopen(url.group(0) + "api/steps", timeout=30) as resp:
            assert json.loads(resp.read())["steps"] == {str(s): 6 for s in range(NUM_STEPS)}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    proc, line = _start([str(synthetic_run), "--port", "0", "--host", "0.0.0.0"])
    proc.terminate()
    _, err = proc.communicate(timeout=30)
    assert "warning: binding 0.0.0.0" in err and "http://0.0.0.0:" in line
    for command in (["-m", "hetrl.view"], [str(ROOT / "launch.py"), "view"]):  # launch.py view is the same command
        gone = subprocess.run(
            [sys.executable, *command, str(tmp_path / "nope")], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        assert gone.returncode == 2 and "no run directory" in gone.stderr, command
