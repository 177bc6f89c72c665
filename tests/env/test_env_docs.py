"""The worked example in docs/environments.md runs and does what it says."""

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "environments.md"


def test_worked_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)
    env_code, run_code = blocks[1], blocks[2]
    assert len(env_code.strip().splitlines()) < 50
    exec(compile(env_code + "\n" + run_code, str(DOC), "exec"), {"__name__": "doc_example"})
    stop_reason, turns, rewards = capsys.readouterr().out.split(maxsplit=2)
    secret = __import__("random").Random(3).randint(1, 100)  # the example's seed
    assert stop_reason == "done" and int(turns) == secret and rewards.strip() == str({"env": 1.0 / secret})
