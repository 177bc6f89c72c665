"""Static checks of the Apptainer definition (Apptainer is not installable here; clusters build it)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEFINITION = ROOT / "containers" / "hetrl.def"
BUILD = ROOT / "containers" / "build.sh"
REQUIRED_SECTIONS = {"arguments", "labels", "files", "post", "environment", "runscript", "test", "help"}


def parse(text: str) -> tuple[dict[str, str], dict[str, list[str]]]:
    """(header keys, {section: body lines}) the way apptainer reads a definition file."""
    header: dict[str, str] = {}
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        match = re.match(r"^%(\w+)\s*$", line)
        if match:
            current = match.group(1)
            if current in sections:
                raise ValueError(f"section %{current} twice")
            sections[current] = []
        elif current is None:
            key, _, value = line.partition(":")
            header[key.strip()] = value.strip()
        else:
            sections[current].append(line.strip())
    return header, sections


@pytest.fixture(scope="module")
def definition() -> tuple[dict[str, str], dict[str, list[str]]]:
    return parse(DEFINITION.read_text())


def test_header_builds_from_an_ngc_pytorch_image(definition) -> None:
    header, sections = definition
    assert header["Bootstrap"] == "docker"
    assert header["From"].startswith("nvcr.io/nvidia/pytorch:")
    assert REQUIRED_SECTIONS <= set(sections)


def test_every_template_argument_is_defined(definition) -> None:
    _, sections = definition
    defined = {line.split("=", 1)[0] for line in sections["arguments"]}
    used = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", DEFINITION.read_text()))
    assert used == defined, f"used {sorted(used)} vs defined {sorted(defined)}"


def test_files_copied_exist_in_the_repository(definition) -> None:
    _, sections = definition
    for line in sections["files"]:
        source, destination = line.split()
        assert (ROOT / source).exists(), f"%files source {source} missing"
        assert destination.startswith("/opt/hetrl/")
    assert any(line.startswith("pip install -e /opt/hetrl") for line in sections["post"])


def test_stack_is_installed_and_tested(definition) -> None:
    _, sections = definition
    post = "\n".join(sections["post"])
    for package in ("vllm==", "megatron-core==", "mpich", "mpi4py"):
        assert package in post
    tested = "\n".join(sections["test"])
    for module in ("megatron.core", "transformer_engine", "vllm", "mpi4py"):
        assert module in tested


def test_entry_points_referenced_exist(definition) -> None:
    _, sections = definition
    text = DEFINITION.read_text()
    modules = set(re.findall(r"(?:-m |import |, )(hetrl(?:\.\w+)+)", text))  # run or imported
    assert "hetrl.launch.worker" in modules and "python -m hetrl.launch.worker" in " ".join(sections["runscript"])
    for module in modules:
        path = ROOT / "src" / Path(*module.split("."))
        assert path.with_suffix(".py").is_file() or (path / "__init__.py").is_file(), f"{module} does not exist"
    for doc in re.findall(r"\b(docs/[\w.]+\.md|containers/[\w.]+\.sh)", text):
        assert (ROOT / doc).exists(), f"{doc} referenced but missing"


def test_build_script_is_valid_and_targets_the_definition() -> None:
    subprocess.run(["bash", "-n", str(BUILD)], check=True)
    text = BUILD.read_text()
    assert "containers/hetrl.def" in text and "apptainer test" in text
    assert BUILD.stat().st_mode & 0o111, "build.sh must be executable"
