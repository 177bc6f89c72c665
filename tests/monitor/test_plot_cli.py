"""`python -m hetrl.plot RUN`: one non-empty PNG per panel, drawing the right series."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
from PIL import Image

from hetrl.plot import plot_run


def test_plots_written_with_right_series(synthetic_run, tmp_path):
    written = plot_run(synthetic_run, tmp_path)
    by_panel = {p.stem: series for p, series in written.items()}
    assert set(by_panel) == {"reward", "length", "kl", "entropy", "mismatch", "throughput", "time"}
    assert by_panel["reward"][:3] == ["reward/mean", "reward/correct/mean", "reward/format/mean"]
    assert "reward/task/gsm/mean" in by_panel["reward"]
    assert by_panel["length"] == ["response_length/mean", "response_length/max", "response_length/truncated_frac"]
    assert by_panel["kl"] == ["approx_kl"]  # policy_kl and loss/kl were never logged
    assert by_panel["entropy"] == ["entropy"]
    assert by_panel["mismatch"] == ["mismatch/k3_kl", "mismatch/max_abs_logprob_diff", "mismatch/prob_ratio_mean"]
    assert by_panel["throughput"] == ["throughput/rollout_tokens_per_s", "throughput/trainer_tokens_per_s"]
    assert by_panel["time"] == ["time/step", "time/train"]  # the phases this run timed
    for path in written:
        with Image.open(path) as img:
            assert img.format == "PNG" and img.width > 100 and img.height > 100
            pixels = np.asarray(img.convert("L"))
        assert pixels.std() > 5  # something was drawn, not a blank canvas


def test_panel_without_data_skipped(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "entropy": 1.0}\n{"step": 1, "entropy": 0.9}\n')
    proc = subprocess.run(
        [sys.executable, "-m", "hetrl.plot", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in (tmp_path / "plots").iterdir()] == ["entropy.png"]
    assert "skipped (no data): kl, length, mismatch, reward, throughput, time" in proc.stdout


def test_missing_metrics_is_a_clear_error(tmp_path, capsys):
    from hetrl.plot import main

    assert main([str(tmp_path)]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err
