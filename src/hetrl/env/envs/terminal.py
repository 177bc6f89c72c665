"""Computer use: the policy works in a sandboxed shell and is scored on the final file system.

Each ``shell`` call is one sandbox execution. The sandbox forgets everything after a run, so the
episode's file system lives here, in the trusted process, as ``{path: bytes}`` plus directories: a
small harness restores it under /work/fs, runs the command there with bash, and sends the new state
back over the sandbox's channel. The checker then judges that state, never the policy's claims.

Tasks come from ``FileOpsSource``: seeded file-manipulation problems, each with a checker.
"""

from __future__ import annotations

import base64
import json
import random
from typing import Any

from hetrl.env.base import Message, Task
from hetrl.env.envs.tool_use import ToolEnv
from hetrl.env.execution import CodeRunner
from hetrl.env.tasks.base import ProceduralSource

COMMAND_TIMEOUT_S = 5.0
_HARNESS = r"""
import base64, json, os, subprocess, sys
req = json.load(sys.stdin)
root = "/work/fs"
os.makedirs(root, exist_ok=True)
for d in req["dirs"]:
    os.makedirs(os.path.join(root, d), exist_ok=True)
for name, data in req["files"].items():
    path = os.path.join(root, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(base64.b64decode(data))
try:
    proc = subprocess.run(["/bin/bash", "-c", req["command"]], cwd=root, capture_output=True, timeout=req["timeout_s"])
    code, out, err = proc.returncode, proc.stdout, proc.stderr
except subprocess.TimeoutExpired as exc:
    code, out, err = 124, exc.stdout or b"", (exc.stderr or b"") + b"\ncommand timed out"
files, dirs = {}, []
for here, subdirs, names in os.walk(root):
    rel = os.path.relpath(here, root)
    if rel != ".":
        dirs.append(rel)
    for name in names:
        path = os.path.join(here, name)
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, "rb") as f:
                files[os.path.relpath(path, root)] = base64.b64encode(f.read()).decode()
state = json.dumps({"files": files, "dirs": dirs, "exit_code": code}).encode()
fd = int(os.environ["HETRL_CHANNEL_FD"])
while state:
    state = state[os.write(fd, state):]
sys.stdout.buffer.write(out)
sys.stderr.buffer.write(err)
"""


class FileSystem:
    """The episode's files (relative path -> bytes) and directories, as the harness reports them."""

    def __init__(self, files: dict[str, bytes] | None = None, dirs: set[str] | None = None) -> None:
        self.files = dict(files or {})
        self.dirs = set(dirs or ())

    def text(self, path: str) -> str | None:
        data = self.files.get(path)
        return None if data is None else data.decode("utf-8", errors="replace")

    def request(self, command: str) -> str:
        files = {k: base64.b64encode(v).decode() for k, v in self.files.items()}
        return json.dumps(
            {"files": files, "dirs": sorted(self.dirs), "command": command, "timeout_s": COMMAND_TIMEOUT_S}
        )

    @classmethod
    def from_channel(cls, payload: bytes) -> tuple[FileSystem, int]:
        """The new state and the command's exit code, from the harness's channel bytes."""
        state = json.loads(payload)
        for path in [*state["files"], *state["dirs"]]:
            if path.startswith("/") or ".." in path.split("/"):
                raise ValueError(f"harness reported an unsafe path {path!r}")
        fs = cls({k: base64.b64decode(v) for k, v in state["files"].items()}, set(state["dirs"]))
        return fs, int(state["exit_code"])


# --- tasks: (initial files, instruction, checker) per family, all derived from the task's params --
def _sort_numbers(rng: random.Random) -> dict[str, Any]:
    numbers = [rng.randint(-500, 500) for _ in range(rng.randint(5, 12))]
    return {
        "files": {"numbers.txt": "\n".join(map(str, numbers)) + "\n"},
        "instruction": "Write the numbers of numbers.txt, sorted ascending (numerically), one per line, to sorted.txt.",
        "expect": {"sorted.txt": "\n".join(map(str, sorted(numbers))) + "\n"},
    }


def _count_errors(rng: random.Random) -> dict[str, Any]:
    lines = [f"{rng.choice(['INFO', 'ERROR', 'WARN'])} event {i}" for i in range(rng.randint(6, 15))]
    count = sum(line.startswith("ERROR") for line in lines)
    return {
        "files": {"app.log": "\n".join(lines) + "\n"},
        "instruction": "Count the lines of app.log that start with ERROR and write just that number to count.txt.",
        "expect": {"count.txt": f"{count}\n"},
    }


def _organise_logs(rng: random.Random) -> dict[str, Any]:
    names = [f"{w}.{rng.choice(['log', 'txt'])}" for w in rng.sample(["alpha", "beta", "gamma", "delta", "omega"], 4)]
    files = {n: f"contents of {n}\n" for n in names}
    expect = {(f"logs/{n}" if n.endswith(".log") else n): text for n, text in files.items()}
    return {
        "files": files,
        "instruction": "Create a directory logs and move every .log file into it; leave other files.",
        "expect": expect,
        "exact": True,
        "dirs": ["logs"],
    }


FAMILIES = {"sort_numbers": _sort_numbers, "count_errors": _count_errors, "organise_logs": _organise_logs}


def check_state(fs: FileSystem, spec: dict[str, Any]) -> float:
    """1.0 if every expected file has the expected content (trailing whitespace aside; with ``exact``,
    no other files exist and the listed directories do), else 0.0."""
    for path, content in spec["expect"].items():
        got = fs.text(path)
        if got is None or got.rstrip() != content.rstrip():
            return 0.0
    if spec.get("exact") and (set(fs.files) != set(spec["expect"]) or not set(spec.get("dirs", [])) <= fs.dirs):
        return 0.0
    return 1.0


class FileOpsSource(ProceduralSource):
    """Seeded terminal tasks cycling through ``FAMILIES``; the task's answer is its spec."""

    name = "file_ops"

    def make(self, rng: random.Random, index: int) -> Task:
        family = sorted(FAMILIES)[index % len(FAMILIES)]
        spec = FAMILIES[family](rng)
        message = f"You are in a directory with these files: {', '.join(sorted(spec['files']))}.\n{spec['instruction']}"
        return Task(
            task_id=f"file_ops/{index}",
            source=self.name,
            messages=[{"role": "user", "content": message}],
            answer=spec,
            metadata={"family": family},
        )


class TerminalEnv(ToolEnv):
    """One tool, ``shell``; the reward is ``check_state`` on the file system when the policy stops."""

    base_prompt = (
        "You operate a Linux shell in a sandbox (no network). Use the shell tool to complete the task; "
        "reply without a tool call when you are done."
    )

    def __init__(self, runner: CodeRunner, system_prompt: str | None = None) -> None:
        self.runner = runner
        self.fs = FileSystem()
        super().__init__([self.shell], system_prompt)

    async def reset(self, task: Task, seed: int) -> list[Message]:
        spec = task.answer
        self.fs = FileSystem({k: v.encode() for k, v in spec["files"].items()})
        return await super().reset(task, seed)

    async def shell(self, command: str) -> str:
        """Run a bash command in the task directory; returns its exit code, stdout and stderr.

        Args:
            command: The command line, e.g. "ls -l".
        """
        result = await self.runner.run(_HARNESS, stdin=self.fs.request(command), channel=True)
        if not result.channel:
            return f"error: the command could not run ({result.reason})\n{result.stderr[-1000:]}"
        self.fs, exit_code = FileSystem.from_channel(result.channel)
        return f"exit code {exit_code}\n{result.stdout}{result.stderr}".rstrip()

    async def finish(self, action: Message) -> float:
        return check_state(self.fs, self.task.answer)
