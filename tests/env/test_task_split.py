"""The held-out split (hetrl.env.tasks.split): eval prompts carved out of training by content, or
their overlap reported (a training-set reward) when the task space is too small; deterministic, and
resumable over the view."""

import json
from collections import Counter

from hetrl.config.env import EnvConfig, TaskSourceConfig
from hetrl.config.loader import load_config
from hetrl.env.registry import build_held_out_split
from hetrl.env.tasks.base import TaskStream
from hetrl.env.tasks.split import content_key
from hetrl.loop.driver import eval_tasks


def write_jsonl(path, num_rows: int, num_distinct: int, offset: int = 0):
    """``num_rows`` rows over ``num_distinct`` prompts; every third one written as a prepared conversation
    (the same content as the prompt form), each with its own id."""
    with open(path, "w") as f:
        for row in range(num_rows):
            question = f"What is {offset + row % num_distinct} + 1?"
            body = {"messages": [{"role": "user", "content": question}]} if row % 3 == 0 else {"prompt": question}
            row_json = {"id": f"{path.stem}-{row}", **body, "answer": str(offset + row % num_distinct + 1)}
            f.write(json.dumps(row_json) + "\n")
    return str(path)


def file_env(train_path: str, eval_path: str | None = None) -> EnvConfig:
    eval_tasks = TaskSourceConfig(source="file", path=eval_path) if eval_path else None
    return EnvConfig(tasks=TaskSourceConfig(source="file", path=train_path), eval_tasks=eval_tasks)


def split_files(train_path: str, eval_path: str | None = None, num_eval_tasks: int = 8, seed: int = 0):
    return build_held_out_split(file_env(train_path, eval_path), seed=seed, num_eval_tasks=num_eval_tasks)


def keys(tasks, source) -> list[bytes]:
    return [content_key(task, source) for task in tasks]


def training_tasks(split) -> list:
    return [split.training[i] for i in range(len(split.training))]


def test_held_out_prompts_never_reach_training(tmp_path):
    split = split_files(write_jsonl(tmp_path / "train.jsonl", 1000, 400), num_eval_tasks=32)
    source = split.training.source  # the file, which the view filters
    held = keys([task for task, _ in split.held_out], source)
    assert len(set(held)) == 32  # distinct content, although most prompts are in the file more than once
    assert not set(held) & set(keys(training_tasks(split), source))
    rows_per_prompt = Counter(keys([source[i] for i in range(len(source))], source))
    removed = sum(rows_per_prompt[k] for k in held)
    assert removed > 32  # every row of a held-out prompt, in either row form
    report = split.report
    assert (report.num_training, report.num_distinct, report.num_removed) == (1000, 400, removed)
    assert len(split.training) == 1000 - removed
    assert (report.num_overlap, report.too_small, report.overlap_fraction) == (32, False, 0.0)
    assert report.summary().startswith(f"32 of 32 held-out tasks found in the training source, carved out ({removed}")


def test_too_small_a_task_space_is_kept_whole_and_its_overlap_reported(tmp_path):
    split = split_files(write_jsonl(tmp_path / "train.jsonl", 200, 20))  # 8 of 20 distinct prompts: over a quarter
    assert split.report.too_small and len(split.training) == 200 and split.report.num_removed == 0
    assert split.report.overlap_fraction == 1.0 and split.report.reward_kind == "training-set"
    assert split.report.summary() == (
        "the task space is too small to split (20 distinct tasks in 200, 8 of them in the eval draw, at most 5 can "
        "be carved out); 8 of 8 eval tasks (100%) also appear in training: the eval reward is a training-set reward"
    )


def test_an_explicit_eval_source_is_carved_out_too_or_its_overlap_reported(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", 200, 20)
    # prompts 18..25: 18 and 19 are training prompts as well (2 of 20 distinct: carved).
    split = split_files(train, write_jsonl(tmp_path / "few.jsonl", 8, 8, offset=18))
    assert (split.report.num_overlap, split.report.num_removed, split.report.overlap_fraction) == (2, 20, 0.0)
    assert len(split.training) == 180
    held = keys([task for task, _ in split.held_out], split.training)
    assert not set(held) & set(keys(training_tasks(split), split.training))
    # prompts 14..21: 6 of 8 in training, 6 of its 20 distinct tasks: too many to carve.
    split = split_files(train, write_jsonl(tmp_path / "many.jsonl", 8, 8, offset=14))
    assert split.report.too_small and split.report.overlap_fraction == 0.75 and len(split.training) == 200
    split = split_files(train, write_jsonl(tmp_path / "none.jsonl", 8, 8, offset=100))
    assert split.report.summary() == "none of the 8 held-out tasks appears among the 200 training tasks (overlap 0%)"


def test_procedural_tasks_are_told_apart_by_all_they_show_the_policy():
    # shapes asks a handful of questions about ever different scenes: the scenes make the tasks.
    env = EnvConfig(name="multimodal", tasks=TaskSourceConfig(source="shapes", size=400))
    split = build_held_out_split(env, seed=0, num_eval_tasks=16)
    assert split.report.num_distinct > 300 and not split.report.too_small
    source = getattr(split.training, "source", split.training)
    assert not set(keys([t for t, _ in split.held_out], source)) & set(keys(training_tasks(split), source))


def test_split_is_deterministic_for_a_seed(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", 600, 300)

    def drawn(seed: int):
        split = split_files(train, num_eval_tasks=16, seed=seed)
        return [(t.task_id, s) for t, s in split.held_out], split.training.indices

    assert drawn(3) == drawn(3)
    assert drawn(3)[0] != drawn(4)[0]


def test_fewer_distinct_tasks_than_the_draw_repeat_them(tmp_path):
    split = split_files(write_jsonl(tmp_path / "train.jsonl", 9, 3), num_eval_tasks=5)
    held = keys([task for task, _ in split.held_out], split.training)
    assert len(held) == 5 and len(set(held[:3])) == 3 and split.report.too_small


def test_stream_over_the_training_view_resumes_and_names_positions(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", 300, 120)
    split = split_files(train)
    stream = TaskStream(split.training, seed=0)
    first = stream.take(300)  # past the end of the first epoch of the (smaller) view
    state = json.loads(json.dumps(stream.state_dict()))
    rest = [(t.task_id, s) for t, s in stream.take(50)]
    resumed = TaskStream(split_files(train).training, seed=0)
    resumed.load_state_dict(state)
    assert [(t.task_id, s) for t, s in resumed.take(50)] == rest
    again, seed = resumed.at(7)
    assert (again.task_id, seed) == (first[7][0].task_id, first[7][1])


def test_launch_eval_draws_the_runs_held_out_tasks_and_tiny_grpo_holds_them_out():
    cfg = load_config("tiny_grpo")
    split = build_held_out_split(cfg.env, seed=cfg.run.seed, num_eval_tasks=cfg.eval.num_tasks)
    assert [(t.task_id, s) for t, s in eval_tasks(cfg)] == [(t.task_id, s) for t, s in split.held_out]
    # 1-digit sums: 121 distinct questions, of which the recipe holds out as many as can be carved out.
    report = split.report
    assert (report.num_distinct, report.num_held_out, report.max_carvable) == (121, 30, 30)
    assert report.reward_kind == "held-out" and report.num_removed > 0 and len(split.training) < cfg.env.tasks.size
    held = set(keys([t for t, _ in split.held_out], split.training.source))
    assert not held & set(keys(training_tasks(split), split.training.source))
