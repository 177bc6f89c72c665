#!/usr/bin/env python
"""Train a policy with RL: ``python launch.py recipe=moe_grpo nodes=128 [key=value ...] [--dry-run]``."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "src"))

from hetrl.launch.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
