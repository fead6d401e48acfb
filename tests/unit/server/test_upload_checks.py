"""The upload checkers (ace3_server.upload_checks) on small generated files: what the engine
reads is accepted, what it would certainly fail on is refused with the reason."""

from __future__ import annotations

import io
import json
import pickle
import zipfile
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
import torch._weights_only_unpickler as weights_only

from ace3_server.upload_checks import UploadCheckError
from ace3_server.upload_checks.datasets import check_dataset_tree
from ace3_server.upload_checks.model_source import check_model_source
from ace3_server.upload_checks.npz import check_npz
from ace3_server.upload_checks.text_data import HEAD_BYTES, check_csv, check_jsonl
from ace3_server.upload_checks.torch_pickle import ALLOWED_GLOBALS, check_pt

EXAMPLE_MODEL = Path(__file__).parents[3] / "examples" / "digits" / "model.py"


# -- model source ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "source",
    [
        "def build_model():\n    pass\n",
        "async def build_model():\n    pass\n",
        "class build_model:\n    pass\n",
        "build_model = lambda: None\n",
        "build_model: object = None\n",
        "from .model import build_model\n",
        "from pkg.model import make as build_model\n",
        "import factories as build_model\n",
        "try:\n    from fast import build_model\nexcept ImportError:\n    def build_model(): ...\n",
        "if True:\n    a, (b, build_model) = 1, (2, 3)\n",
        "from pkg.model import *\n",
        "def __getattr__(name):\n    return None\n",
        "globals()['build_model'] = print\n",
    ],
)
def test_a_module_binding_the_factory_at_module_level_is_accepted(source: str) -> None:
    check_model_source(source.encode(), "m.py", "build_model")


def test_the_example_and_a_named_class_factory_are_accepted() -> None:
    check_model_source(EXAMPLE_MODEL.read_bytes(), "model.py", "build_model")
    check_model_source(b"import torch\nclass Net(torch.nn.Module):\n    pass\n", "m.py", "Net")


@pytest.mark.parametrize("source", [b"", b"   \n\n", b"# only a comment\n\n# another\n"])
def test_an_empty_model_file_is_refused(source: bytes) -> None:
    with pytest.raises(UploadCheckError, match=r"m\.py is empty"):
        check_model_source(source, "m.py", "build_model")


def test_a_module_without_the_factory_says_what_it_looked_for_and_found() -> None:
    source = (
        b"class Net:\n    def build_model(self): ...\n"
        b"def make():\n    build_model = 1\n    return build_model\n"
        b"'''build_model'''\n"
    )
    with pytest.raises(UploadCheckError) as refused:
        check_model_source(source, "m.py", "build_model")
    message = str(refused.value)
    assert "m.py defines no 'build_model' at module level" in message
    assert "factory=" in message and "Net, make" in message
    with pytest.raises(UploadCheckError, match=r"defines no 'Model'.*Net, make"):
        check_model_source(source, "m.py", "Model")


def test_invalid_python_is_refused() -> None:
    with pytest.raises(UploadCheckError, match=r"not valid Python"):
        check_model_source(b"def build_model(:\n", "m.py", "build_model")


# -- npz --------------------------------------------------------------------------------------------
def _npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return path


@pytest.mark.parametrize(
    "keys", [("inputs", "targets"), ("x", "y"), ("X", "y"), ("features", "labels")]
)
def test_every_key_pair_the_engine_reads_is_accepted(tmp_path: Path, keys: tuple[str, str]) -> None:
    arrays = {keys[0]: np.zeros((4, 3), np.float32), keys[1]: np.arange(4), "extra": np.ones(2)}
    assert set(keys) <= set(check_npz(_npz(tmp_path / "d.npz", **arrays)))


def test_compressed_bool_and_fortran_arrays_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    np.savez_compressed(path, x=np.asfortranarray(np.ones((5, 2))), y=np.zeros(5, bool))
    check_npz(path)


def test_npz_problems_are_named(tmp_path: Path) -> None:
    wrong_keys = _npz(tmp_path / "k.npz", a=np.ones(3), b=np.ones(3))
    with pytest.raises(
        UploadCheckError, match=r"expected arrays inputs/targets or x/y.*\['a', 'b'\]"
    ):
        check_npz(wrong_keys)
    lengths = _npz(tmp_path / "n.npz", x=np.ones((3, 2)), y=np.ones(4))
    with pytest.raises(UploadCheckError, match=r"3 x but 4 y"):
        check_npz(lengths)
    text = _npz(tmp_path / "t.npz", x=np.array(["a", "b"]), y=np.ones(2))
    with pytest.raises(UploadCheckError, match=r"needs numbers"):
        check_npz(text)
    scalar = _npz(tmp_path / "s.npz", x=np.array(1.0), y=np.ones(1))
    with pytest.raises(UploadCheckError, match=r"scalar"):
        check_npz(scalar)
    with pytest.raises(UploadCheckError, match=r"empty"):
        check_npz(_npz(tmp_path / "e.npz", x=np.ones((0, 2)), y=np.ones(0)))


def test_a_corrupt_or_truncated_npz_is_refused(tmp_path: Path) -> None:
    good = _npz(tmp_path / "g.npz", x=np.ones((64, 8)), y=np.ones(64)).read_bytes()
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"this is not a zip at all")
    with pytest.raises(UploadCheckError, match=r"not a readable .npz"):
        check_npz(garbage)
    cut = tmp_path / "cut.npz"
    cut.write_bytes(good[: len(good) // 2])
    with pytest.raises(UploadCheckError, match=r"not a readable .npz"):
        check_npz(cut)
    not_npy = tmp_path / "plain.npz"
    with zipfile.ZipFile(not_npy, "w") as archive:
        archive.writestr("x.npy", b"plain bytes, no header")
        archive.writestr("y.npy", b"plain bytes, no header")
    with pytest.raises(UploadCheckError, match=r"member 'x.npy': not a .npy array"):
        check_npz(not_npy)
    short = tmp_path / "short.npz"
    buffer = io.BytesIO()
    np.save(buffer, np.ones((10, 10)))
    with zipfile.ZipFile(short, "w") as archive:
        archive.writestr("x.npy", buffer.getvalue()[:-80])
        archive.writestr("y.npy", buffer.getvalue())
    with pytest.raises(UploadCheckError, match=r"'x.npy' is .* bytes but its header describes"):
        check_npz(short)
    objects = tmp_path / "objects.npz"
    np.savez(objects, x=np.array([{"a": 1}, None], dtype=object), y=np.ones(2))
    with pytest.raises(UploadCheckError, match=r"Python objects"):
        check_npz(objects)


def test_a_bad_npy_header_dict_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "h.npz"
    header = b"{'descr': '<f8', 'shape': 'many'}"
    record = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x.npy", record)
    with pytest.raises(UploadCheckError, match=r"dict of descr, fortran_order and shape"):
        check_npz(path)


# -- csv and jsonl -----------------------------------------------------------------------------
def _write(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def test_csv_shapes_the_engine_reads_are_accepted(tmp_path: Path) -> None:
    check_csv(_write(tmp_path / "a.csv", "a,b,target\n1,2,0\n\n3.5,-4e3,1\n"))
    check_csv(_write(tmp_path / "b.csv", "x,y\n" + "1,2\n" * 400_000))  # past the window


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty CSV file"),
        ("only\n1\n", "the header has 1 column"),
        ("a,b\n1,2\n3\n", "line 3 has 1 cells but the header has 2"),
        ("a,b\n1,two\n", "line 2, column 'b': 'two' is not a number"),
        ("a,b\n", "no data rows after the header"),
        ("a,b\n1,\n", "line 2, column 'b': '' is not a number"),
    ],
)
def test_csv_problems_are_named(tmp_path: Path, text: str, reason: str) -> None:
    with pytest.raises(UploadCheckError, match=reason):
        check_csv(_write(tmp_path / "d.csv", text))


def test_text_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UploadCheckError, match=r"not UTF-8"):
        check_csv(_write(tmp_path / "d.csv", b"a,b\n1,\xff\n"))
    with pytest.raises(UploadCheckError, match=r"not UTF-8"):
        check_jsonl(_write(tmp_path / "d.jsonl", b'{"inputs": [1], "target": "\xff"}\n'))


def test_jsonl_records_the_engine_reads_are_accepted(tmp_path: Path) -> None:
    lines = [
        {"inputs": [[1, 2], [3, 4]], "target": 1},
        {"inputs": [[0.5, 2], [3, True]], "target": 0},
    ]
    check_jsonl(_write(tmp_path / "a.jsonl", "\n".join(json.dumps(r) for r in lines) + "\n\n"))
    for key in ("targets", "label"):
        check_jsonl(_write(tmp_path / "b.jsonl", json.dumps({"inputs": 3, key: [1, 2]})))
    long = json.dumps({"inputs": [1.0] * 8, "target": 1}) + "\n"
    check_jsonl(_write(tmp_path / "c.jsonl", long * (HEAD_BYTES // len(long) + 5)))


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "no records"),
        ("not json\n", "line 1 is not valid JSON"),
        ("[1, 2]\n", "line 1: expected"),
        ('{"inputs": [1]}\n', "line 1: no 'target'"),
        ('{"x": [1], "target": 1}\n', "line 1: expected"),
        ('{"inputs": ["a"], "target": 1}\n', "line 1: 'inputs' must be a number"),
        ('{"inputs": [[1], [2, 3]], "target": 1}\n', "line 1: 'inputs' must be"),
        (
            '{"inputs": [1, 2], "target": 1}\n{"inputs": [1], "target": 1}\n',
            "line 2: inputs of shape",
        ),
    ],
)
def test_jsonl_problems_are_named(tmp_path: Path, text: str, reason: str) -> None:
    with pytest.raises(UploadCheckError, match=reason):
        check_jsonl(_write(tmp_path / "d.jsonl", text))


# -- pt -----------------------------------------------------------------------------------------
def test_the_allow_list_is_torchs_own() -> None:
    assert set(weights_only._get_allowed_globals()) == ALLOWED_GLOBALS


@pytest.mark.parametrize(
    "obj",
    [
        {"inputs": torch.zeros(4, 3), "targets": torch.arange(4)},
        OrderedDict(x=torch.zeros(4, 3), y=torch.arange(4), note="a string"),
        (torch.zeros(4, 3), torch.zeros(4)),
        [torch.zeros(4, 3, dtype=torch.bfloat16), torch.arange(4)],
        {"features": [[1.0, 2.0], [3.0, 4.0]], "labels": [0, 1]},
        {"X": torch.nn.Parameter(torch.ones(2, 2)), "y": torch.ones(2)[:1]},
    ],
)
def test_torch_saves_the_engine_reads_are_accepted(tmp_path: Path, obj: object) -> None:
    path = tmp_path / "d.pt"
    torch.save(obj, path)
    check_pt(path)
    legacy = tmp_path / "legacy.pt"
    torch.save(obj, legacy, _use_new_zipfile_serialization=False)
    check_pt(legacy)


class Custom:
    pass


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        ({"a": torch.ones(2), "b": torch.ones(2)}, r"expected keys .*; found \['a', 'b'\]"),
        (torch.ones(3), "got something else"),
        ((torch.ones(3), torch.ones(3), torch.ones(3)), "got a 3-item sequence"),
        ({"inputs": Custom(), "targets": 1}, "global tests.unit.server.test_upload_checks.Custom"),
    ],
)
def test_torch_saves_the_engine_refuses_are_refused(
    tmp_path: Path, obj: object, reason: str
) -> None:
    path = tmp_path / "d.pt"
    torch.save(obj, path)
    with pytest.raises(UploadCheckError, match=reason):
        check_pt(path)


def _with_pickle(path: Path, data: bytes) -> None:
    """A torch.save archive whose data.pkl is replaced by ``data``."""
    source = io.BytesIO()
    torch.save({"x": torch.ones(2), "y": torch.ones(2)}, source)
    source.seek(0)
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(path, "w") as out:
        for info in original.infolist():
            body = data if info.filename.endswith("/data.pkl") else original.read(info)
            out.writestr(info.filename, body)


def test_a_pickle_that_runs_code_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "evil.pt"

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (print, ("pwned",))

    _with_pickle(path, pickle.dumps({"x": Evil(), "y": 1}, protocol=2))
    with pytest.raises(UploadCheckError, match=r"global builtins\.print"):
        check_pt(path)
    _with_pickle(path, pickle.dumps({"x": 1, "y": 2}, protocol=4))
    with pytest.raises(UploadCheckError, match=r"opcode FRAME"):
        check_pt(path)
    _with_pickle(path, b"\x80\x02}q\x00(X")  # cut in the middle
    with pytest.raises(UploadCheckError, match=r"corrupt or truncated"):
        check_pt(path)


def test_a_pt_naming_a_missing_storage_or_not_torch_is_refused(tmp_path: Path) -> None:
    source = io.BytesIO()
    torch.save({"x": torch.ones(2), "y": torch.ones(2)}, source)
    path = tmp_path / "d.pt"
    with (
        zipfile.ZipFile(io.BytesIO(source.getvalue())) as original,
        zipfile.ZipFile(path, "w") as out,
    ):
        for info in original.infolist():
            if "/data/" not in info.filename:
                out.writestr(info.filename, original.read(info))
    with pytest.raises(UploadCheckError, match=r"storages the archive lacks"):
        check_pt(path)
    path.write_bytes(b"not a torch file")
    with pytest.raises(UploadCheckError, match=r"not a torch.save file"):
        check_pt(path)


# -- directories ----------------------------------------------------------------------------------
def test_a_directorys_one_data_file_is_checked_and_named(tmp_path: Path) -> None:
    _write(tmp_path / "train.csv", "a,b\n1,x\n")
    with pytest.raises(UploadCheckError, match=r"train.csv: line 2"):
        check_dataset_tree(tmp_path)
    _write(tmp_path / "dataset.py", "def build_dataset(split): ...\n")
    check_dataset_tree(tmp_path)  # the dataset.py decides


def test_records_named_for_a_directory_need_its_one_jsonl_file(tmp_path: Path) -> None:
    from ace3.config.text_records import named_layout
    from ace3_server.upload_checks.text_data import RecordsError

    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "train.jsonl").write_text(json.dumps({"text": "a", "id": 3}) + "\n")
    assert check_dataset_tree(tree, "text") == named_layout("text")
    with pytest.raises(RecordsError, match=r"train\.jsonl: line 1: records='chat'"):
        check_dataset_tree(tree, "chat")
    (tree / "dataset.py").write_text("def build_dataset(split): ...\n")
    with pytest.raises(RecordsError, match=r"not read from one \.jsonl file"):
        check_dataset_tree(tree, "text")
    assert check_dataset_tree(tree) is None
    # (the first record longer than the head read: the named kind is taken on trust)
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"text": "x" * HEAD_BYTES}) + "\n")
    assert check_jsonl(long, "text") == "text"
