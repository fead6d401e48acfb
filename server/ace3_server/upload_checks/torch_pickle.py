"""``.pt`` datasets: the pickle a ``torch.save`` file holds, read opcode by opcode
(``pickletools.genops``), never unpickled.

The engine loads the file with ``torch.load(weights_only=True)``, whose unpickler implements a
fixed set of opcodes and resolves only the globals of an allow-list (tensor rebuild functions,
storage and dtype names, ``collections.OrderedDict``, ...): any other opcode or global fails
the job. So do a persistent id naming a storage the archive lacks, and a top-level object that
is not a dict holding one of the engine's key pairs nor a pair ``(inputs, targets)``. This
module checks each of those by running the opcodes on symbolic values: it learns the shape of
what would be built (dicts and their string keys, tuples, list lengths) and nothing else.
"""

from __future__ import annotations

import _compat_pickle
import pickletools
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ace3_server.upload_checks.errors import UploadCheckError
from ace3_server.upload_checks.npz import KEY_PAIRS, expected_keys

# torch._weights_only_unpickler's opcodes (torch 2.13): any other one fails torch.load.
ALLOWED_OPCODES = frozenset(
    [
        "GLOBAL",
        "NEWOBJ",
        "REDUCE",
        "BUILD",
        "APPEND",
        "APPENDS",
        "SETITEM",
        "SETITEMS",
        "MARK",
        "TUPLE",
        "TUPLE1",
        "TUPLE2",
        "TUPLE3",
        "NONE",
        "NEWFALSE",
        "NEWTRUE",
        "EMPTY_TUPLE",
        "EMPTY_LIST",
        "EMPTY_DICT",
        "EMPTY_SET",
        "BININT",
        "BININT1",
        "BININT2",
        "BINFLOAT",
        "BINUNICODE",
        "SHORT_BINSTRING",
        "BINPERSID",
        "BINGET",
        "LONG_BINGET",
        "BINPUT",
        "LONG_BINPUT",
        "LONG1",
        "PROTO",
        "STOP",
    ]
)
_TENSOR_TYPES = [
    "Double",
    "Float",
    "Half",
    "BFloat16",
    "Long",
    "Int",
    "Short",
    "Char",
    "Byte",
    "Bool",
]
_STORAGES = [*_TENSOR_TYPES, "ComplexDouble", "ComplexFloat"]
_QSTORAGES = ["QInt32", "QInt8", "QUInt2x4", "QUInt4x2", "QUInt8"]
_DTYPES = (
    [
        "bfloat16",
        "bits16",
        "bits1x8",
        "bits2x4",
        "bits4x2",
        "bits8",
        "bool",
        "complex128",
        "complex32",
        "complex64",
        "float16",
        "float32",
        "float64",
        "float4_e2m1fn_x2",
        "float8_e4m3fn",
        "float8_e4m3fnuz",
        "float8_e5m2",
        "float8_e5m2fnuz",
        "float8_e8m0fnu",
        "int16",
        "int32",
        "int64",
        "int8",
        "qint32",
        "qint8",
        "quint2x4",
        "quint4x2",
        "quint8",
        "uint16",
        "uint32",
        "uint64",
        "uint8",
        "per_channel_affine",
        "per_channel_affine_float_qparams",
        "per_channel_symmetric",
        "per_tensor_affine",
        "per_tensor_symmetric",
    ]
    + [f"int{n}" for n in range(1, 8)]
    + [f"uint{n}" for n in range(1, 8)]
)
_REBUILDS = [
    "_rebuild_parameter",
    "_rebuild_parameter_with_state",
    "_rebuild_qtensor",
    "_rebuild_tensor",
    "_rebuild_tensor_v2",
    "_rebuild_tensor_v3",
    "_rebuild_sparse_tensor",
    "_rebuild_meta_tensor_no_storage",
    "_rebuild_nested_tensor",
    "_rebuild_wrapper_subclass",
    "_rebuild_device_tensor_from_numpy",
    "_rebuild_device_tensor_from_cpu_tensor",
]
ALLOWED_GLOBALS = frozenset(
    [
        "collections.OrderedDict", "collections.Counter", "torch.nn.parameter.Parameter",
        "torch.serialization._get_layout", "torch.Size", "torch.Tensor", "torch.device",
        "_codecs.encode", "builtins.bytearray", "builtins.set", "builtins.complex",
        "torch._tensor._rebuild_from_type_v2", "torch.storage.TypedStorage",
        "torch.storage.UntypedStorage",
        *(f"torch.{name}" for name in _DTYPES),
        *(f"torch._utils.{name}" for name in _REBUILDS),
        *(f"torch.{t}Storage" for t in _STORAGES + _QSTORAGES),
        *(f"torch.cuda.{t}Storage" for t in _STORAGES),
        *(f"torch{where}.{t}Tensor" for where in ("", ".cuda") for t in _TENSOR_TYPES),
        *(f"torch{where}.sparse.{t}Tensor" for where in ("", ".cuda") for t in _TENSOR_TYPES
          if t not in ("Bool",)),
    ]
)  # fmt: skip
"""torch._weights_only_unpickler._get_allowed_globals() of torch 2.13, by name."""
_MAPPINGS = frozenset({"collections.OrderedDict", "collections.Counter"})
# torch.save's legacy (pre-1.6) format starts with this pickled magic number.
LEGACY_MAGIC = b"\x80\x02\x8a\x0a" + (0x1950A86A20F9469CFC6C).to_bytes(10, "little") + b"."


@dataclass
class _Dict:
    keys: list[object] = field(default_factory=list)


@dataclass
class _List:
    length: int = 0


@dataclass(frozen=True)
class _Global:
    name: str


_OTHER = object()  # a tensor, a number, anything whose shape does not matter here


def _global_name(arg: object) -> str:
    module, _, name = str(arg).partition(" ")
    if (module, name) in _compat_pickle.NAME_MAPPING:
        module, name = _compat_pickle.NAME_MAPPING[(module, name)]
    elif module in _compat_pickle.IMPORT_MAPPING:
        module = _compat_pickle.IMPORT_MAPPING[module]
    return f"{module}.{name}"


class _Machine:
    """Runs the opcodes on symbolic values (see the module docstring)."""

    def __init__(self) -> None:
        self.stack: list[Any] = []
        self.marks: list[list[Any]] = []
        self.memo: dict[int, Any] = {}
        self.storages: list[str] = []

    def pop_mark(self) -> list[Any]:
        items, self.stack = self.stack, self.marks.pop()
        return items

    def step(self, name: str, arg: Any) -> None:
        stack = self.stack
        if name == "GLOBAL":
            full = _global_name(arg)
            if full not in ALLOWED_GLOBALS:
                raise UploadCheckError(
                    f"its pickle names the global {full}, which torch.load(weights_only=True) "
                    "refuses: save only tensors, numbers, strings and plain containers"
                )
            stack.append(_Global(full))
        elif name in ("BINUNICODE", "SHORT_BINSTRING"):
            stack.append(str(arg))
        elif name == "EMPTY_DICT":
            stack.append(_Dict())
        elif name == "EMPTY_LIST":
            stack.append(_List())
        elif name == "EMPTY_TUPLE":
            stack.append(())
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            count = int(name[-1])
            members = tuple(stack[-count:])
            if len(members) != count:
                raise IndexError(name)
            del stack[-count:]
            stack.append(members)
        elif name == "TUPLE":
            members = tuple(self.pop_mark())  # (before self.stack is read: pop_mark swaps it)
            self.stack.append(members)
        elif name == "MARK":
            self.marks.append(stack)
            self.stack = []
        elif name in ("BINPUT", "LONG_BINPUT"):
            self.memo[int(arg)] = stack[-1]
        elif name in ("BINGET", "LONG_BINGET"):
            stack.append(self.memo[int(arg)])
        elif name == "SETITEM":
            key = stack[-2]
            del stack[-2:]
            if isinstance(stack[-1], _Dict):
                stack[-1].keys.append(key)
        elif name == "SETITEMS":
            items = self.pop_mark()
            if isinstance(self.stack[-1], _Dict):
                self.stack[-1].keys.extend(items[::2])
        elif name == "APPEND":
            stack.pop()
            if isinstance(stack[-1], _List):
                stack[-1].length += 1
        elif name == "APPENDS":
            items = self.pop_mark()
            if isinstance(self.stack[-1], _List):
                self.stack[-1].length += len(items)
        elif name == "REDUCE":
            stack.pop()
            func = stack[-1]
            stack[-1] = _Dict() if isinstance(func, _Global) and func.name in _MAPPINGS else _OTHER
        elif name == "NEWOBJ":
            del stack[-2:]
            stack.append(_OTHER)
        elif name == "BUILD":
            stack.pop()
            if not stack:  # (the object built on must exist)
                raise IndexError("BUILD")
        elif name == "BINPERSID":
            pid = stack.pop()
            if isinstance(pid, tuple) and len(pid) > 2 and isinstance(pid[2], str):
                self.storages.append(pid[2])
            stack.append(_OTHER)
        elif name not in ("PROTO", "STOP"):
            stack.append(_OTHER)  # NONE, booleans, numbers, EMPTY_SET


def _run(handle: IO[bytes]) -> tuple[Any, list[str]]:
    """Run one pickle from ``handle``; its symbolic result and the storage keys it names."""
    machine = _Machine()
    opcodes: Iterator[tuple[pickletools.OpcodeInfo, Any, int | None]] = pickletools.genops(handle)
    try:
        for opcode, arg, _ in opcodes:
            if opcode.name not in ALLOWED_OPCODES:
                raise UploadCheckError(
                    f"its pickle uses the opcode {opcode.name}, which torch.load(weights_only="
                    "True) does not implement"
                )
            machine.step(opcode.name, arg)
        result = machine.stack.pop()
    except (IndexError, KeyError, ValueError) as exc:
        if isinstance(exc, UploadCheckError):
            raise
        raise UploadCheckError(f"its pickle is corrupt or truncated ({exc})") from exc
    return result, machine.storages


def _check_shape(result: Any) -> None:
    if isinstance(result, _Dict):
        keys = [k for k in result.keys if isinstance(k, str)]
        if not any(x in keys and y in keys for x, y in KEY_PAIRS):
            raise UploadCheckError(f"expected keys {expected_keys()}; found {sorted(keys)}")
        return
    length = (
        result.length
        if isinstance(result, _List)
        else len(result)
        if isinstance(result, tuple)
        else None
    )
    if length != 2:
        got = f"a {length}-item sequence" if length is not None else "something else"
        raise UploadCheckError(
            f"expected a dict with 'inputs' and 'targets' or a tuple (inputs, targets), got {got}"
        )


def _check_zip(archive: zipfile.ZipFile) -> None:
    names = set(archive.namelist())
    pickles = [n for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(pickles) != 1:
        raise UploadCheckError("not a torch.save file: its zip archive holds no <name>/data.pkl")
    prefix = pickles[0].rsplit("/", 1)[0]
    with archive.open(pickles[0]) as handle:
        result, storages = _run(handle)
    missing = sorted({key for key in storages if f"{prefix}/data/{key}" not in names})
    if missing:
        raise UploadCheckError(f"its pickle names storages the archive lacks: {missing[:5]}")
    _check_shape(result)


def check_pt(path: Path) -> None:
    """Check a ``.pt`` dataset (see the module docstring)."""
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                _check_zip(archive)
        except UploadCheckError:
            raise
        except Exception as exc:  # BadZipFile, OSError, zlib.error, ... from a corrupt archive
            raise UploadCheckError(f"not a readable torch.save archive: {exc}") from exc
        return
    with path.open("rb") as handle:
        if handle.read(len(LEGACY_MAGIC)) != LEGACY_MAGIC:
            raise UploadCheckError(
                "not a torch.save file (neither its zip format nor the legacy one)"
            )
        _run(handle)  # the protocol version
        _run(handle)  # the system information
        result, _ = _run(handle)
    _check_shape(result)
