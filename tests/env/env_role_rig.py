"""Run under ``mpiexec -n 3``: world rank 0 drives tool episodes whose envs live on env ranks 1 and 2.

``python env_role_rig.py MODE OUT``; rank 0 writes a JSON report to OUT. Modes:
  compare  3 groups x 2 episodes through the env role, and the same locally: are the Samples equal?
  rerun    every episode that loses its env rank (HETRL_INJECT_FAULT=env:<rank>:env_crash@<n>) runs again, as the
           orchestrator would re-queue it: do all finish, and where?
  none     keep re-running until no env rank is left: the error the rollout rank raises
"""

import asyncio
import dataclasses
import json
import sys

from env_helpers import run_groups
from mpi4py import MPI

from hetrl.config import load_config
from hetrl.control.comm import RoleContext, flush_sends
from hetrl.control.plan import Component, Plan, RankAssignment, RolloutLayout, TrainerLayout
from hetrl.env.chat import ChatCodec
from hetrl.env.registry import build_task_stream, env_factory
from hetrl.env.remote import EnvServerLost
from hetrl.env.runner import run_episode
from hetrl.env.scripted import ScriptedPolicy
from hetrl.loop.env_role import EnvRoleClient, run_env
from hetrl.loop.faults import RankFaults
from hetrl.models.tokenizer import build_char_tokenizer
from hetrl.records import SamplingParams

ROLES = ("rollout", "env", "env")
PLAN = Plan(
    1,
    0,
    TrainerLayout(1, 1, 1, 1, 1, 1, 1),
    RolloutLayout("colocated", 0, 1, 1),
    0,
    (Component("local", "local", 1, 3, 0, ("rollout", "env")),),
    tuple(RankAssignment(r, role, ROLES[:r].count(role), "local", 0) for r, role in enumerate(ROLES)),
    num_env_workers=2,
)
CFG = load_config("tiny_tool_grpo", ["env.placement=role", "env.max_turns=4"])
SAMPLING = SamplingParams(max_tokens=128)


def script(conversation):
    turn = conversation.count("<|im_start|>tool")
    calc = '<tool_call>{"name": "calculator", "arguments": {"expression": "6 * 7"}}</tool_call>'
    return [calc, "<tool_call>{bad</tool_call>", "<answer>42</answer>"][turn]


async def pumping(client, until):
    while not until.done():
        client.pump()
        await asyncio.sleep(0.001)


async def with_pump(client, work):
    job = asyncio.ensure_future(work)
    await asyncio.gather(job, pumping(client, job))
    return job.result()


def samples_of(samples):
    return [dataclasses.asdict(s) for s in samples]


async def rerun_until_done(client, codec):
    """Episodes as the orchestrator runs them: a lost one goes out again, to whichever rank is left."""
    policy = ScriptedPolicy(codec, script, record=False)
    stream = build_task_stream(CFG.env.tasks, seed=2)
    lost, placed, errors = 0, [], []

    async def episode(index):
        nonlocal lost
        task, seed = stream.next()
        while True:
            try:
                env = client.make_env()
            except RuntimeError as error:
                errors.append(str(error))
                return None
            try:
                try:
                    sample = await run_episode(
                        env, task, seed, policy.generate, codec, SAMPLING, 4, 4096, f"s{index}", "g"
                    )
                finally:
                    await env.close()
            except EnvServerLost:
                lost += 1
                continue
            placed.append(env._link.rank)
            return sample.sample_id

    done = await asyncio.gather(*(episode(i) for i in range(8)))
    return {
        "done": [d for d in done if d],
        "lost": lost,
        "placed_on": placed,
        "errors": errors[:1],
        "live": [s for s in client.servers if s not in client.down],
    }


def drive(mode):
    codec = ChatCodec(build_char_tokenizer())
    client = EnvRoleClient(RoleContext(MPI.COMM_WORLD, None, PLAN, PLAN.assignments[0]), CFG.env.call_timeout_s)
    if mode == "compare":

        def groups(make_env):
            return run_groups(
                make_env,
                build_task_stream(CFG.env.tasks, seed=2),
                codec,
                ScriptedPolicy(codec, script, record=False).generate,
                num_groups=3,
                group_size=2,
                max_turns=4,
                concurrency=8,
                max_tokens=SAMPLING.max_tokens,
            )

        remote = asyncio.run(with_pump(client, groups(client.make_env)))
        local = asyncio.run(groups(env_factory(CFG.env)))
        report = {
            "equal": samples_of(remote) == samples_of(local),
            "turns": [s.num_turns for s in remote],
            "reported_load": client.reported,
        }
    else:
        report = asyncio.run(with_pump(client, rerun_until_done(client, codec)))
    client.close()
    flush_sends()
    return report


def main():
    mode, out = sys.argv[1], sys.argv[2]
    rank = MPI.COMM_WORLD.Get_rank()
    if rank == 0:
        report = drive(mode)
        with open(out, "w") as f:
            json.dump(report, f)
    else:
        assignment = PLAN.assignments[rank]
        faults = RankFaults.from_env(assignment.role, assignment.role_rank)
        run_env(RoleContext(MPI.COMM_WORLD, None, PLAN, assignment), CFG, faults.countdown("env_crash"))
        flush_sends()


if __name__ == "__main__":
    main()
