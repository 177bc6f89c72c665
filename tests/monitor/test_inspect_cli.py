"""`python -m hetrl.browse RUN` filters and views."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
from monitor_synth import NUM_STEPS, make_samples

from hetrl.browse import main


def _run_json(run, *args) -> list[dict]:
    out = io.StringIO()
    assert main([str(run), "--json", *args], out=out) == 0
    return [json.loads(line) for line in out.getvalue().splitlines()]


def _all_expected():
    return [(step, s) for step in range(NUM_STEPS) for s in make_samples(step)[0]]


def test_step_and_worst_best(synthetic_run):
    step4 = [s for step, s in _all_expected() if step == 4]
    got = _run_json(synthetic_run, "--step", "4", "--worst", "2")
    assert [g["sample_id"] for g in got] == [s.sample_id for s in sorted(step4, key=lambda s: s.reward)[:2]]
    got = _run_json(synthetic_run, "--step", "4", "--best", "1")
    assert [g["sample_id"] for g in got] == [max(step4, key=lambda s: s.reward).sample_id]
    assert {g["step"] for g in _run_json(synthetic_run, "--step", "2")} == {2}


def test_flag_filters(synthetic_run):
    expected = _all_expected()
    any_flag = _run_json(synthetic_run, "--flag", "any")
    assert [g["sample_id"] for g in any_flag] == [s.sample_id for _, s in expected if s.flags]
    one = _run_json(synthetic_run, "--flag", "repeated_answer")
    assert one and all(g["flags"] == ["repeated_answer"] for g in one)
    assert len(one) == sum("repeated_answer" in s.flags for _, s in expected)


def test_length_and_task_filters(synthetic_run):
    got = _run_json(synthetic_run, "--min-len", "10", "--max-len", "20", "--task", "gsm")
    expected = [s for _, s in _all_expected() if 10 <= len(s.completion_ids) <= 20 and s.task_name == "gsm"]
    assert [g["sample_id"] for g in got] == [s.sample_id for s in expected]
    assert all(10 <= len(g["completion_ids"]) <= 20 for g in got)


def test_finish_and_reward_filters(synthetic_run):
    got = _run_json(synthetic_run, "--finish", "length", "--min-reward", "0.2", "--max-reward", "0.9")
    expected = [s for _, s in _all_expected() if s.finish_reason == "length" and 0.2 <= s.reward <= 0.9]
    assert expected and [g["sample_id"] for g in got] == [s.sample_id for s in expected]


def test_json_carries_token_level_mismatch(synthetic_run):
    (rec,) = _run_json(synthetic_run, "--step", "0", "--best", "1")
    samples, trainer = make_samples(0)
    i = [s.sample_id for s in samples].index(rec["sample_id"])
    assert rec["trainer_logprobs"] == trainer[i]
    assert rec["logprob_diff"] == pytest.approx([t - e for t, e in zip(trainer[i], samples[i].logprobs)], abs=1e-6)


def test_table_view_with_tokens_as_module(synthetic_run):
    proc = subprocess.run(
        [sys.executable, "-m", "hetrl.browse", str(synthetic_run), "--step", "1", "--worst", "1", "--tokens"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    samples, _ = make_samples(1)
    worst = min(samples, key=lambda s: s.reward)
    assert "1 rollouts" in proc.stdout and worst.sample_id in proc.stdout
    assert "engine_lp" in proc.stdout and "trainer_lp" in proc.stdout and "mismatch/k3_kl=" in proc.stdout
    assert worst.prompt_text in proc.stdout


def test_worst_and_best_exclusive(synthetic_run):
    with pytest.raises(SystemExit):
        main([str(synthetic_run), "--worst", "1", "--best", "1"], out=io.StringIO())


def test_missing_run_is_a_clear_error(tmp_path, capsys):
    assert main([str(tmp_path / "nope")], out=io.StringIO()) == 2
    assert "no rollout directory" in capsys.readouterr().err


def test_images_are_listed_and_written(tmp_path):
    """A multimodal sample's images: their sizes in the table view and in JSON, the PNG files with --images."""
    import dataclasses

    from PIL import Image

    from hetrl.monitor.rollout_store import RolloutStore

    samples, _ = make_samples(0)
    sample = dataclasses.replace(
        samples[0], images=[Image.new("RGB", (32, 24), "red"), Image.new("RGB", (8, 8), "blue")]
    )
    with RolloutStore(tmp_path / "run" / "rollouts") as store:
        store.append(0, [sample])
    out = io.StringIO()
    assert main([str(tmp_path / "run"), "--images", str(tmp_path / "shots")], out=out) == 0
    assert "images: 2 (32x24, 8x8)" in out.getvalue()
    written = sorted(p.name for p in (tmp_path / "shots").iterdir())
    assert written == [f"{sample.sample_id}-0.png", f"{sample.sample_id}-1.png"]
    assert Image.open(tmp_path / "shots" / written[0]).getpixel((0, 0)) == (255, 0, 0)
    [record] = _run_json(tmp_path / "run")
    assert record["images"] == ["32x24", "8x8"]
