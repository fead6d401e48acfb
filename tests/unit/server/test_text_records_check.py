"""Text records at upload (chat, prompt/completion, text .jsonl): told by the first record,
checked for its shape naming the line, recorded as the dataset's batch layout; and at submission
refused for a model that has no tokenizer to read them with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ace3_server.services.batch_fit import records_problem
from ace3_server.upload_checks import UploadCheckError
from ace3_server.upload_checks.datasets import check_dataset_file

CHAT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


def _jsonl(path: Path, *records: object) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize(
    ("records", "kind"),
    [
        ((CHAT, CHAT), "chat"),
        (({"prompt": "2+2=", "completion": "4"},), "prompt_completion"),
        (({"text": "once upon a time"}, {"text": "the end"}), "text"),
    ],
)
def test_each_kind_is_told_by_its_first_record(tmp_path: Path, records: tuple, kind: str) -> None:
    layout = check_dataset_file(_jsonl(tmp_path / "d.jsonl", *records), "jsonl")
    assert layout == {"kind": "records", "records": kind}


def test_pairs_stay_pairs(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "d.jsonl", {"inputs": [1, 2], "target": 0})
    assert check_dataset_file(path, "jsonl") == {"kind": "pair"}


@pytest.mark.parametrize(
    ("records", "reason"),
    [
        ((CHAT, {"text": "x"}), "line 2: expected a chat record like the first one, not text"),
        (({"messages": []},), "line 1: 'messages' must be a non-empty list"),
        (({"messages": [{"role": "robot", "content": "x"}]},), "role 'robot' is not one of"),
        (
            ({"messages": [{"role": "user", "content": 3}]},),
            "messages[0]: 'content' must be a string",
        ),
        (({"messages": [{"role": "user", "content": "hi"}]},), "no assistant turn"),
        (({"prompt": "a", "completion": None},), "line 1: 'completion' must be a string"),
        (({"text": "a"}, "not an object"), "line 2: expected a text record"),
    ],
)
def test_a_record_of_the_wrong_shape_is_refused_naming_the_line(
    tmp_path: Path, records: tuple, reason: str
) -> None:
    with pytest.raises(UploadCheckError, match=reason.replace("[", r"\[").replace("]", r"\]")):
        check_dataset_file(_jsonl(tmp_path / "d.jsonl", *records), "jsonl")


def test_text_records_need_a_hugging_face_model_and_chats_its_template() -> None:
    chat = {"kind": "records", "records": "chat"}
    assert "a Hugging Face model's own tokenizer" in str(records_problem(chat, None))
    no_template = {"has_tokenizer": True, "has_chat_template": False}
    assert "no chat template" in str(records_problem(chat, no_template))
    prompts = {"kind": "records", "records": "prompt_completion"}
    assert records_problem(prompts, no_template) is None
    assert records_problem(chat, {"has_tokenizer": True, "has_chat_template": True}) is None
    assert records_problem({"kind": "pair"}, None) is None


def test_a_first_record_longer_than_the_head_read_leaves_the_layout_unknown(tmp_path: Path) -> None:
    long = {"text": "a " * 600_000}  # over the 1 MiB the check reads
    assert check_dataset_file(_jsonl(tmp_path / "d.jsonl", long, {"text": "b"}), "jsonl") is None


def test_packing_a_dataset_that_holds_no_text_records_is_refused() -> None:
    from types import SimpleNamespace

    import ace3
    from ace3_server.services.batch_fit import packing_problems

    packed = ace3.TrainingConfig(packing=True)
    pairs = {"dataset_id": SimpleNamespace(batch_layout={"kind": "pair"})}
    [problem] = packing_problems(pairs, packed)
    assert problem["loc"] == ["body", "config", "packing"]
    chats = {"dataset_id": SimpleNamespace(batch_layout={"kind": "records", "records": "chat"})}
    assert packing_problems(chats, packed) == []
    assert packing_problems(pairs, ace3.TrainingConfig()) == []
    unknown = {"dataset_id": SimpleNamespace(batch_layout=None)}
    assert packing_problems(unknown, packed) == []


TOOL_CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
TOOL_CHAT = {
    "messages": [
        {"role": "developer", "content": "you add"},
        {"role": "user", "content": "1 + 1?"},
        {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "2"},
        {"role": "assistant", "content": "2"},
    ],
    "tools": [{"type": "function", "function": {"name": "add", "parameters": {}}}],
}


def test_chats_with_tool_calls_are_chat_records_and_a_malformed_call_names_line_and_field(
    tmp_path: Path,
) -> None:
    path = _jsonl(tmp_path / "d.jsonl", CHAT, TOOL_CHAT)
    assert check_dataset_file(path, "jsonl") == {"kind": "records", "records": "chat"}
    bad_call = {**TOOL_CALL, "function": {"name": "add", "arguments": {"a": 1}}}
    messages = [*TOOL_CHAT["messages"][:2], {**TOOL_CHAT["messages"][2], "tool_calls": [bad_call]}]
    bad = {**TOOL_CHAT, "messages": messages}
    with pytest.raises(UploadCheckError, match=r"line 2: messages\[2\]\.tool_calls\[0\]\.function"):
        check_dataset_file(_jsonl(tmp_path / "d.jsonl", CHAT, bad), "jsonl")
    named = {"messages": [{"role": "critic", "content": "x"}], "id": 3}
    with pytest.raises(UploadCheckError, match=r"line 3: messages\[0\]: role 'critic' is not"):
        check_dataset_file(_jsonl(tmp_path / "d.jsonl", CHAT, TOOL_CHAT, named), "jsonl")
    with pytest.raises(UploadCheckError, match=r"line 1: tools\[0\]: 'type' must be"):
        retrieval = {**TOOL_CHAT, "tools": [{"type": "retrieval", "function": {"name": "x"}}]}
        check_dataset_file(_jsonl(tmp_path / "d.jsonl", retrieval), "jsonl")


def test_weights_and_null_tool_calls_at_upload(tmp_path: Path) -> None:
    # OpenAI's format: weight 0 or 1 on assistant messages; "tool_calls": null is no calls.
    weighted = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yo", "weight": 0, "tool_calls": None},
            {"role": "user", "content": "again"},
            {"role": "assistant", "content": "hello", "weight": 1, "tool_calls": []},
        ],
        "tools": None,
    }
    path = _jsonl(tmp_path / "d.jsonl", CHAT, weighted)
    assert check_dataset_file(path, "jsonl") == {"kind": "records", "records": "chat"}
    bad = {"messages": [{"role": "user", "content": "hi", "weight": 1}, *CHAT["messages"][1:]]}
    with pytest.raises(UploadCheckError, match=r"line 2: messages\[0\]\.weight: only an assistant"):
        check_dataset_file(_jsonl(tmp_path / "d.jsonl", CHAT, bad), "jsonl")
    unlearned = {"messages": [CHAT["messages"][0], {**CHAT["messages"][1], "weight": 0}]}
    with pytest.raises(UploadCheckError, match="line 3: every assistant turn has weight 0"):
        check_dataset_file(_jsonl(tmp_path / "d.jsonl", CHAT, weighted, unlearned), "jsonl")
