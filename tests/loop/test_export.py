"""``launch.py export RUN [step=N] out=DIR``: a run's policy as an HF checkpoint that transformers and
vLLM load as they are. The errors a user sees come first (no model needed); the real export of a
TP=2 run is slow (it needs a run)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hetrl.launch.cli import main
from hetrl.loop.export import CheckpointError, export_run
from tests.loop.test_evaluate import fake_trainer_run

ROOT = Path(__file__).resolve().parents[2]


def test_export_refuses_what_it_cannot_export(tmp_path):
    (tmp_path / "not_a_run").mkdir()
    with pytest.raises(CheckpointError, match="not a run directory"):
        export_run(tmp_path / "not_a_run", tmp_path / "out")
    fake_trainer_run(tmp_path / "run")
    with pytest.raises(CheckpointError, match="no checkpoint of step 7; saved steps: 3"):
        export_run(tmp_path / "run", tmp_path / "out", step=7)
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("the user's")
    with pytest.raises(CheckpointError, match="not an empty directory"):
        export_run(tmp_path / "run", full)
    assert (full / "keep.txt").read_text() == "the user's"  # nothing of the user's is touched


def test_export_of_a_run_without_checkpoints(tmp_path):
    shutil.rmtree(fake_trainer_run(tmp_path / "run"))
    (tmp_path / "run" / "checkpoints").mkdir()
    with pytest.raises(CheckpointError, match="has no trainer checkpoint yet"):
        export_run(tmp_path / "run", tmp_path / "out")


def test_export_command_line_errors(tmp_path, capsys):
    fake_trainer_run(tmp_path / "run")
    for args in (
        [],
        [str(tmp_path / "run")],
        [str(tmp_path / "run"), "out=x", "step=last"],
        [str(tmp_path / "run"), "out=x", "steps=3"],
    ):
        assert main(["export", *args]) == 2
        assert "error: export needs one RUN_DIR" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "run"), f"out={tmp_path / 'out'}", "step=9"]) == 2
    assert "no checkpoint of step 9" in capsys.readouterr().err


GENERATE = """
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
model, tokenizer = AutoModelForCausalLM.from_pretrained(sys.argv[1]), AutoTokenizer.from_pretrained(sys.argv[1])
prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Calculate 3 + 4."}], add_generation_prompt=True,
return_tensors="pt", return_dict=True)
out = model.generate(**prompt, max_new_tokens=12, do_sample=False, pad_token_id=tokenizer.pad_token_id)
print(repr(tokenizer.decode(out[0, prompt["input_ids"].shape[1]:], skip_special_tokens=True)))
"""


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.vllm
def test_export_a_tp2_run_and_generate(tmp_path, launch, warm_started_model):
    """A run trained under TP=2 exports, at its latest and at an earlier step, to directories
    transformers loads and generates from (the warm-started policy answers in its format), and
    that vLLM serves (``launch.py eval`` of the exported directory)."""
    launch(
        tmp_path,
        f"model.hf_checkpoint={warm_started_model}",
        "warm_start.steps=0",
        "run.steps=2",
        "run.prompts_per_step=4",
        "trainer.tensor_parallel=2",
        "checkpoint.every=1",
        "eval.num_tasks=4",
        "eval.k=1",
    )
    run_dir = tmp_path / "tiny_grpo"
    saved = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
    assert len(saved) == 2, saved
    first = int(saved[0].removeprefix("step_"))
    for out, step in ((tmp_path / "latest", []), (tmp_path / "first", [f"step={first}"])):
        export = subprocess.run(
            [sys.executable, str(ROOT / "launch.py"), "export", str(run_dir), f"out={out}", *step],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert export.returncode == 0, export.stdout + export.stderr
        assert f"exported the policy of {run_dir}" in export.stdout
        assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
        assert "chat_template" in (out / "tokenizer_config.json").read_text() or (out / "chat_template.jinja").exists()
    weights = [(tmp_path / name / "model.safetensors").read_bytes() for name in ("latest", "first")]
    assert weights[0] != weights[1]  # two checkpoints, two policies
    generated = subprocess.run(
        [sys.executable, "-c", GENERATE, str(tmp_path / "latest")], capture_output=True, text=True, timeout=300
    )
    assert generated.returncode == 0, generated.stderr[-3000:]
    assert "<answer>" in generated.stdout, generated.stdout
    scored = subprocess.run(
        [
            sys.executable,
            str(ROOT / "launch.py"),
            "eval",
            f"recipe={run_dir / 'config.yaml'}",
            f"checkpoint={tmp_path / 'latest'}",
            "--out",
            str(tmp_path / "eval.json"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert scored.returncode == 0, scored.stdout + scored.stderr
    assert json.loads((tmp_path / "eval.json").read_text())["kind"] == "hf"
