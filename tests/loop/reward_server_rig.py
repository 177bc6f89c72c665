"""Run under ``mpiexec -n 3``: two reward-server replicas (ranks 0, 1) and one reward worker (rank 2).

The replicas hold a scripted judge that answers ``"<rank>:<prompt>"``, sleeps on prompts holding
"slow" (on rank 0 only) or "stuck" (on both), raises on "crash" (rank 0 only: its batched forward
failed) and answers "toolong" with that request's own error. The worker asks
from many threads at once, as its scoring threads do, and prints one JSON line of what it saw.
"""

import json
import sys
import threading
import time
from types import SimpleNamespace

from mpi4py import MPI

from hetrl.control.comm import flush_sends
from hetrl.loop.faults import Countdown
from hetrl.loop.reward_server_role import JUDGE, RewardServer, RewardServerClient
from hetrl.reward.serving import Completion, CompletionResult

TIMEOUT_S = 1.0


class ScriptedJudge:
    def __init__(self, rank: int) -> None:
        self.rank, self.batches = rank, []

    def complete(self, requests: list[Completion]) -> list[CompletionResult]:
        self.batches.append(len(requests))
        prompts = [r.prompt for r in requests]
        if self.rank == 0 and any("crash" in p for p in prompts):
            raise RuntimeError("the judge engine died")
        if any("stuck" in p for p in prompts) or (self.rank == 0 and any("slow" in p for p in prompts)):
            time.sleep(2.5 * TIMEOUT_S)
        return [
            ValueError("too long for the judge") if "toolong" in p else CompletionResult(f"{self.rank}:{p}")
            for p in prompts
        ]


def report(obj) -> None:
    """One JSON line in ONE write: print() writes the text and its newline apart when stdout is unbuffered, and
    mpiexec then interleaves another rank's line between them (seen in CI: two reports on one line)."""
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def context(world) -> SimpleNamespace:
    roles = {"reward_server": [0, 1], "reward": [2]}
    role = "reward_server" if world.Get_rank() < 2 else "reward"
    return SimpleNamespace(
        world=world,
        role=role,
        assignment=SimpleNamespace(role_rank=roles[role].index(world.Get_rank())),
        plan=SimpleNamespace(ranks_of=lambda role: roles.get(role, [])),
    )


def ask_all(client: RewardServerClient, prompts: list[str]) -> dict[str, str]:
    """Ask from one thread per prompt while this thread pumps, as a reward worker does."""
    answers: dict[str, str] = {}

    def ask(prompt: str) -> None:
        try:
            answers[prompt] = client.judge(Completion(prompt)).text
        except Exception as error:  # noqa: BLE001 - reported to the test
            answers[prompt] = f"error: {error}"

    threads = [threading.Thread(target=ask, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        client.pump()
        time.sleep(0.001)
    return answers


def main() -> int:
    world = MPI.COMM_WORLD
    ctx = context(world)
    if world.Get_rank() < 2:
        judge = ScriptedJudge(world.Get_rank())
        RewardServer(ctx, {JUDGE: judge}, Countdown([], "reward_server", world.Get_rank(), "server_crash")).run()
        report({"rank": world.Get_rank(), "batches": judge.batches})
        flush_sends()
        return 0
    client = RewardServerClient(ctx, timeout_s=TIMEOUT_S, max_attempts=2)
    deadline = time.monotonic() + 30
    while client.ready != {0, 1} and time.monotonic() < deadline:  # both replicas said Ready: spread over both
        client.pump()
        time.sleep(0.001)
    seen = {"many": ask_all(client, [f"q{i}" for i in range(16)])}
    seen["toolong"] = ask_all(client, ["toolong", "fine"])
    seen["slow"] = ask_all(client, ["slow"])
    seen["stuck"] = ask_all(client, ["stuck"])
    seen["crash"] = ask_all(client, ["crash", "after"])
    seen["resent"] = client.num_resent
    client.close()
    report(seen)
    flush_sends()
    return 0


if __name__ == "__main__":
    sys.exit(main())
