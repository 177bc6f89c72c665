"""Task sources, the user-data loader's bad-row report, and the resumable stream."""

import json

import pytest

from hetrl.config.env import TaskSourceConfig
from hetrl.env.registry import build_task_source, build_task_stream
from hetrl.env.scoring import score_answer
from hetrl.env.tasks.files import FileSource


def test_reasoning_gym_is_seeded_and_scored():
    for name in ("basic_arithmetic", "countdown", "gsm_symbolic"):
        cfg = TaskSourceConfig(source="reasoning_gym", name=name, size=5)
        a, b = build_task_source(cfg, seed=3), build_task_source(cfg, seed=3)
        assert [a[i].messages for i in range(5)] == [b[i].messages for i in range(5)]
        assert a[0].messages != build_task_source(cfg, seed=4)[0].messages
        task = a[1]
        assert score_answer(f"so <answer>{task.answer}</answer>", task) == 1.0
        assert score_answer("<answer>no idea</answer>", task) < 1.0
        assert score_answer(str(task.answer), task) == 0.0  # no answer tags: nothing to check


def test_reasoning_gym_answer_instruction_is_configurable():
    def user_text(**fields) -> str:
        return build_task_source(TaskSourceConfig(size=2, **fields), seed=3)[0].messages[0]["content"]

    question = user_text(answer_instruction="")
    assert (
        "<answer>" not in question
        and user_text() == f"{question}\n\nGive your final answer inside <answer></answer> tags."
    )
    assert user_text(answer_instruction="Answer with a number.") == f"{question}\n\nAnswer with a number."
    with pytest.raises(ValueError, match="answer_instruction is not used by task source 'human_eval'"):
        build_task_source(TaskSourceConfig(source="human_eval", answer_instruction=""), seed=0)


def test_unknown_names_list_the_valid_ones():
    with pytest.raises(ValueError, match="valid names: .*human_eval.*reasoning_gym"):
        build_task_source(TaskSourceConfig(source="hub"), seed=0)
    with pytest.raises(ValueError, match="reasoning_gym dataset 'no_such_task'"):
        build_task_source(TaskSourceConfig(name="no_such_task"), seed=0)
    with pytest.raises(ValueError, match="path is required"):
        build_task_source(TaskSourceConfig(source="file"), seed=0)


def test_human_eval_tasks():
    source = build_task_source(TaskSourceConfig(source="human_eval"), seed=0)
    assert len(source) == 164 and source[0].task_id == "HumanEval/0"
    assert source[0].answer["entry_point"] == "has_close_elements" and "def check" in source[0].answer["tests"]


ROWS = [
    '{"prompt": "1+1?", "answer": "2"}',
    '{"prompt": "2+2?"}',
    "not json at all",
    '{"messages": [{"role": "user", "content": "write f"}], "tests": "assert f() == 1", "id": "code-1"}',
    "",
    '{"prompt": "x", "messages": [{"role": "user", "content": "y"}], "answer": 1}',
    '{"messages": [{"role": "robot", "content": "hi"}], "answer": 1}',
    '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "answer": 1}',
    "[1, 2]",
    '{"prompt": "   ", "answer": 3}',
    '{"messages": [{"role": "user", "content": "q"}], "tests": []}',
    '{"prompt": "3*3?", "answer": 9, "difficulty": "easy"}',
]


def test_jsonl_loader_reports_bad_rows(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(ROWS) + "\n")
    source = FileSource(path)
    report = source.report
    assert len(source) == 3 and report.num_loaded == 3 and report.num_rows == 11  # the blank line is not a row
    reasons = {b.row: b.reason for b in report.bad_rows}
    assert sorted(reasons) == [2, 3, 6, 7, 8, 9, 10, 11]
    assert "needs an 'answer'" in reasons[2] and "not valid JSON" in reasons[3]
    assert "exactly one of 'prompt' or 'messages'" in reasons[6] and "'role'" in reasons[7]
    assert "last message is the assistant's" in reasons[8] and "must be an object" in reasons[9]
    assert "non-empty string" in reasons[10] and "'tests'" in reasons[11]
    summary = report.summary()
    assert "loaded 3 of 11 rows, skipped 8" in summary and "row 3: not valid JSON" in summary
    code = source[1]
    assert code.task_id == "code-1" and code.answer["tests"] == "assert f() == 1"
    assert source[2].metadata == {"difficulty": "easy"} and source[2].answer == 9


def test_file_without_usable_rows_is_an_error(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": 1}\n{"answer": 2}\n')
    with pytest.raises(ValueError, match=r"no usable task(.|\n)*row 1: 'prompt' must be(.|\n)*row 2:"):
        FileSource(path)
    with pytest.raises(ValueError, match="must be .jsonl"):
        FileSource(tmp_path / "data.csv")


def test_parquet_loader(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [
        {"prompt": "1+1?", "answer": "2", "messages": None},
        {"prompt": None, "answer": "3", "messages": None},
        {"prompt": None, "answer": "4", "messages": [{"role": "user", "content": "2+2?"}]},
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "t.parquet")
    source = build_task_source(TaskSourceConfig(source="file", path=str(tmp_path / "t.parquet")), seed=0)
    assert len(source) == 2 and [b.row for b in source.report.bad_rows] == [2]
    assert source[1].messages == [{"role": "user", "content": "2+2?"}]


def test_stream_resumes_at_cursor_across_epochs():
    cfg = TaskSourceConfig(source="file_ops", size=4)
    stream = build_task_stream(cfg, seed=11)
    first = [(t.task_id, s) for t, s in stream.take(6)]
    assert sorted(t for t, _ in first[:4]) == [f"file_ops/{i}" for i in range(4)]  # one epoch = each task once
    state = json.loads(json.dumps(stream.state_dict()))
    rest = [(t.task_id, s) for t, s in stream.take(7)]
    resumed = build_task_stream(cfg, seed=11)
    resumed.load_state_dict(state)
    assert [(t.task_id, s) for t, s in resumed.take(7)] == rest
    assert len({s for _, s in first + rest}) == 13  # a fresh episode seed per draw
    other = build_task_stream(cfg, seed=12)
    with pytest.raises(ValueError, match="seed=11"):
        other.load_state_dict(state)


def test_stream_at_names_any_position_without_moving():
    stream = build_task_stream(TaskSourceConfig(size=3), seed=5)
    drawn = [stream.next() for _ in range(7)]  # across two epoch boundaries
    for cursor, (task, seed) in enumerate(drawn):
        again, again_seed = stream.at(cursor)
        assert (again.task_id, again_seed) == (task.task_id, seed)
    ahead_task, ahead_seed = stream.at(9)
    assert stream.cursor == 7
    stream.next(), stream.next()
    assert stream.next()[0].task_id == ahead_task.task_id and stream.cursor == 10
    with pytest.raises(ValueError, match="cursor must be >= 0"):
        stream.at(-1)
