"""A vision-language checkpoint is checked on the login node against the LLaVA hetrl trains (config/paths.py)."""

from __future__ import annotations

import json

import pytest

from hetrl.config.loader import ConfigError, load_config
from hetrl.config.paths import check_paths


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory):
    from hetrl.models.hf import build_random_hf_checkpoint

    return build_random_hf_checkpoint(load_config("tiny_vlm_grpo").model, tmp_path_factory.mktemp("llava"))


def _edit(path, **changes):
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_hetrls_own_llava_passes_and_another_layout_is_refused(llava_dir, tmp_path):
    check_paths(load_config("tiny_vlm_grpo", [f"model.hf_checkpoint={llava_dir}"]))  # what hetrl writes
    import shutil

    other = shutil.copytree(llava_dir, tmp_path / "llava-1.5-style")
    _edit(other / "config.json", vision_feature_layer=-2)
    processor = json.loads((other / "processor_config.json").read_text())
    _edit(
        other / "processor_config.json",
        image_processor={**processor["image_processor"], "do_center_crop": True, "size": {"shortest_edge": 64}},
    )
    with pytest.raises(ConfigError) as refused:
        check_paths(load_config("tiny_vlm_grpo", [f"model.hf_checkpoint={other}"]))
    assert "vision_feature_layer=-2; hetrl's LLaVA needs -1" in str(refused.value)
    assert "without a centre crop" in str(refused.value)
