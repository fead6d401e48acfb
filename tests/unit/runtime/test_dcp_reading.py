"""A sharded checkpoint (``.dcp.tar``) is read without running pickled code, by
``ace3.load_checkpoint`` and by a resumed run alike: DCP metadata naming a function, a
non-tensor value that would unpickle code, metadata reading files outside the archive or
describing more data than it holds, and sparse members are refused with
``ace3.UnsafeCheckpointError`` before any of it runs; a real ZeRO checkpoint still loads."""

from __future__ import annotations

import io
import pathlib
import pickle
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

import ace3
from ace3.runtime.techniques.initial_weights import read_weights

CONFIG = {"epochs": 1, "batch_size": 16, "max_steps": 1, "zero_stage": 3, "seed": 0}


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    inputs = torch.linspace(-1.0, 1.0, 256).reshape(64, 4)
    return inputs, (inputs.sum(dim=1) > 0).long()


def _model() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, nn.Module]:
    """A real ZeRO-3 checkpoint (one step) and the module it was trained from."""
    save_dir = tmp_path_factory.mktemp("zero")
    module = _model()
    result = ace3.Trainer(
        ace3.TrainingConfig(**CONFIG),
        checkpoint_config=ace3.CheckpointConfig(save_dir=str(save_dir)),
    ).train(module, _data())
    return result.checkpoints[0], module


def _members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        handles = {member.name: tar.extractfile(member) for member in tar.getmembers()}
        return {name: handle.read() for name, handle in handles.items() if handle is not None}


def _pack(
    path: Path, members: dict[str, bytes], extra: tuple[tarfile.TarInfo, bytes] | None = None
) -> Path:
    """A tar of ``members`` (plain files), then ``extra`` (a member made by hand) if given."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if extra is not None:
            tar.addfile(extra[0], io.BytesIO(extra[1]))
    return path


def _metadata(members: dict[str, bytes]) -> Metadata:
    metadata = pickle.loads(members[".metadata"])  # the test's own checkpoint: trusted
    assert isinstance(metadata, Metadata)
    return metadata


class _WritesMarker:
    """Unpickles by calling ``pathlib.Path.write_text(marker, "ran")``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.write_text, (self.marker, "ran"))


class _ExecsMarker(_WritesMarker):
    """Unpickles by calling ``builtins.exec`` on code that writes the marker."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


def _load(archive: Path, tmp_path: Path) -> object:
    return ace3.load_checkpoint(archive)


def _resume(archive: Path, tmp_path: Path) -> object:
    """A run resuming from ``archive`` (dcp.load into the sharded model: what a job does)."""
    save_dir = tmp_path / "resume"
    _pack(save_dir / archive.name, _members(archive))
    config = ace3.TrainingConfig(**{**CONFIG, "max_steps": 2})
    checkpoints = ace3.CheckpointConfig(save_dir=str(save_dir))
    return ace3.Trainer(config, checkpoint_config=checkpoints).train(_model(), _data(), resume=True)


READERS = [pytest.param(_load, id="load_checkpoint"), pytest.param(_resume, id="resume")]


def test_a_real_zero_checkpoint_loads_whole(trained: tuple[Path, nn.Module]) -> None:
    archive, module = trained
    state = ace3.load_checkpoint(archive)
    assert (state["step"], state["zero_stage"]) == (1, 3)
    for name, value in module.state_dict().items():
        torch.testing.assert_close(state["model"][name], value)
    assert state["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)
    # init_from and a teacher's weights read it the same way, in-process too
    weights = read_weights(archive)
    assert weights.keys() == module.state_dict().keys()


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("payload", [_WritesMarker, _ExecsMarker])
def test_dcp_metadata_that_would_run_code_is_refused_before_it_runs(
    trained: tuple[Path, nn.Module],
    tmp_path: Path,
    payload: type[_WritesMarker],
    reader: Callable[[Path, Path], object],
) -> None:
    members = _members(trained[0])
    metadata = _metadata(members)
    marker = tmp_path / "marker"
    assert metadata.storage_meta is not None
    metadata.storage_meta.save_id = payload(marker)  # unpickled first thing
    crafted = _pack(
        tmp_path / "c" / trained[0].name, {**members, ".metadata": pickle.dumps(metadata)}
    )
    expected = r"pathlib\.Path\.write_text" if payload is _WritesMarker else r"builtins\.exec"
    with pytest.raises(ace3.UnsafeCheckpointError, match=f"DCP metadata names {expected}"):
        reader(crafted, tmp_path)
    assert not marker.exists()


@pytest.mark.parametrize("reader", READERS)
def test_a_non_tensor_value_that_would_run_code_is_refused_before_it_runs(
    trained: tuple[Path, nn.Module], tmp_path: Path, reader: Callable[[Path, Path], object]
) -> None:
    """The metadata is clean; the optimizer's ``lr`` is read from a file holding a pickle
    that calls ``Path.write_text``."""
    members = _members(trained[0])
    metadata = _metadata(members)
    marker = tmp_path / "marker"
    buffer = io.BytesIO()
    torch.save(_WritesMarker(marker), buffer)
    value = buffer.getvalue()
    lr = next(i for i in metadata.storage_data if i.fqn == "optimizer.param_groups.0.lr")
    metadata.storage_data[lr] = _StorageInfo("__9_0.distcp", 0, len(value))
    crafted = _pack(
        tmp_path / "c" / trained[0].name,
        {**members, ".metadata": pickle.dumps(metadata), "__9_0.distcp": value},
    )
    with pytest.raises(ace3.UnsafeCheckpointError, match=r"optimizer\.param_groups\.0\.lr"):
        reader(crafted, tmp_path)
    assert not marker.exists()


def _read_outside(metadata: Metadata, outside: Path) -> None:
    for info in metadata.storage_data.values():
        info.relative_path = str(outside)


def _read_up(metadata: Metadata, outside: Path) -> None:
    for info in metadata.storage_data.values():
        info.relative_path = f"../{outside.name}"


def _claim_terabytes(metadata: Metadata, outside: Path) -> None:
    item = metadata.state_dict_metadata["model.0.weight"]
    assert isinstance(item, TensorStorageMetadata)
    item.size = torch.Size([1 << 40])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_read_outside, "not a data file of the checkpoint"),
        (_read_up, "not a data file of the checkpoint"),
        (_claim_terabytes, "describes 4,398,046,5"),
    ],
)
def test_dcp_metadata_reaching_outside_the_archive_is_refused(
    trained: tuple[Path, nn.Module],
    tmp_path: Path,
    change: Callable[[Metadata, Path], None],
    message: str,
) -> None:
    """Storage entries naming a file outside the extracted directory (absolute, or up from
    it: a copy of the real shards is there, so torch would read it), or a tensor of 4 TiB."""
    members = _members(trained[0])
    outside = tmp_path / "outside.distcp"
    outside.write_bytes(members["__0_0.distcp"])
    metadata = _metadata(members)
    change(metadata, outside)
    crafted = _pack(tmp_path / trained[0].name, {**members, ".metadata": pickle.dumps(metadata)})
    with pytest.raises(ace3.UnsafeCheckpointError, match=message):
        ace3.load_checkpoint(crafted)


def test_a_sparse_member_is_refused_before_extraction(
    trained: tuple[Path, nn.Module], tmp_path: Path
) -> None:
    """A member of 513 bytes whose holes would extract as 64 MiB (PAX GNU sparse 1.0: a map
    of one 1-byte segment at offset 0, then the segment)."""
    data = b"1\n0\n1\n".ljust(512, b"\0") + b"x"
    info = tarfile.TarInfo("GNUSparseFile.0/__9_0.distcp")
    info.size = len(data)
    info.pax_headers = {
        "GNU.sparse.major": "1",
        "GNU.sparse.minor": "0",
        "GNU.sparse.name": "__9_0.distcp",
        "GNU.sparse.realsize": str(1 << 26),
    }
    crafted = _pack(tmp_path / trained[0].name, _members(trained[0]), (info, data))
    with tarfile.open(crafted) as tar:
        assert tar.getmember("__9_0.distcp").issparse()
    with pytest.raises(ace3.UnsafeCheckpointError, match=r"'__9_0\.distcp', which is not a plain"):
        ace3.load_checkpoint(crafted)


def test_metadata_that_sets_a_class_attribute_is_refused_and_the_class_unchanged(
    trained: tuple[Path, nn.Module], tmp_path: Path
) -> None:
    """BUILD applied to an allowed class (not an instance) would set the class's attribute for
    the whole process: here ``PosixPath._str``, so that every path opened later names a file
    the checkpoint chose. Hidden in a dead branch (POP) of otherwise valid metadata."""
    members = _members(trained[0])
    redirect = str(tmp_path / "redirected")
    poison = (
        b"cpathlib\nPosixPath\nN}X\x04\x00\x00\x00_str"
        + b"X" + len(redirect).to_bytes(4, "little") + redirect.encode()
        + b"s\x86b0"
    )  # fmt: skip
    valid = members[".metadata"]
    assert valid[:2] == b"\x80\x04"  # (protocol 4: the poison goes after the header and frame)
    crafted_bytes = valid[:2] + poison + valid[2:]
    before = dict(vars(pathlib.PosixPath))
    crafted = _pack(tmp_path / "c" / trained[0].name, {**members, ".metadata": crafted_bytes})
    try:
        with pytest.raises(
            ace3.UnsafeCheckpointError, match="sets the state of the class PosixPath"
        ):
            ace3.load_checkpoint(crafted)
        assert dict(vars(pathlib.PosixPath)) == before
        assert str(tmp_path / "x") != redirect
    finally:  # (were it let through, the rest of the session's paths would be poisoned)
        for name in set(vars(pathlib.PosixPath)) - set(before):
            delattr(pathlib.PosixPath, name)
