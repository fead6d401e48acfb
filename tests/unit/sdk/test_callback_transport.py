"""Carrying callbacks to a job: specs from built-ins and from user classes (in a script run as
__main__, and in this module), JSON round trips, rebuilding in a fresh namespace, refusals."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
import threading
from contextlib import redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

import ace3
from ace3.config.specs import CallbackSpec
from ace3.errors import UnsupportedFeatureError
from ace3.training.callbacks import Callback, CallbackError, EarlyStopping, ModelCheckpoint
from ace3.training.callbacks.transport import callback_spec, callbacks_from_specs

REPO = Path(__file__).resolve().parents[3]

SCRIPT = '''
import json
import math
import os.path as osp
from collections import OrderedDict

import ace3
from ace3.training.callbacks.transport import callback_spec

TARGET = 0.95
LABELS = ("low", "high")
model = object()          # a global named like the attribute the methods use: never carried
client = open(__file__)   # an unsendable global nobody uses


def describe(epoch):
    return f"epoch {epoch} ({osp.basename('a/b.txt')})"


class CustomCallback(ace3.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        print(f"Starting epoch {epoch}")

    def on_epoch_end(self, epoch, logs=None):
        val_acc = logs.get("val_accuracy", 0)
        if val_acc > 0.95:
            print("Target accuracy reached!")
            self.model.stop_training = True

    def on_batch_end(self, batch, logs=None):
        if batch % 100 == 0:
            print(f"Processed batch {batch}")


class Base(ace3.Callback):
    def note(self, text):
        self.notes.append(text)


class Tracker(Base):
    """Keeps notes and the best loss; uses a helper, constants, modules and a class."""

    def __init__(self, limit):
        self.limit = limit
        self.notes = []
        self.best = math.inf
        self.table = OrderedDict()

    def on_epoch_begin(self, epoch, logs=None):
        self.note(describe(epoch))

    def on_epoch_end(self, epoch, logs=None):
        self.best = min(self.best, logs["val_loss"])
        self.note(LABELS[int(logs["val_accuracy"] > TARGET)])
        if epoch >= self.limit:
            self.model.stop_training = True


specs = [callback_spec(CustomCallback()), callback_spec(Tracker(limit=2))]
print(json.dumps([spec.model_dump(mode="json") for spec in specs]))
'''


@pytest.fixture(scope="module")
def script_specs(tmp_path_factory: pytest.TempPathFactory) -> list[CallbackSpec]:
    path = tmp_path_factory.mktemp("script") / "train.py"
    path.write_text(SCRIPT)
    result = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, cwd=path.parent, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return [CallbackSpec.model_validate(item) for item in json.loads(result.stdout)]


def _with_model(callback: Callback) -> Callback:
    callback.set_model(SimpleNamespace(stop_training=False))
    return callback


def test_the_documents_custom_callback_travels_from_a_script(script_specs):
    spec = script_specs[0]
    assert spec.kind == "source" and spec.name == "CustomCallback" and spec.params == {}
    assert "import ace3" in spec.source and "class CustomCallback(ace3.Callback):" in spec.source
    assert "model =" not in spec.source and "client" not in spec.source
    (callback,) = callbacks_from_specs([spec])
    assert isinstance(callback, ace3.Callback) and type(callback).__name__ == "CustomCallback"
    _with_model(callback)
    out = io.StringIO()
    with redirect_stdout(out):
        callback.on_epoch_begin(3)
        callback.on_batch_end(0, {})
        callback.on_epoch_end(3, {"val_accuracy": 0.5})
        assert callback.model.stop_training is False
        callback.on_epoch_end(3, {"val_accuracy": 0.97})
    assert callback.model.stop_training is True
    assert out.getvalue().splitlines() == [
        "Starting epoch 3",
        "Processed batch 0",
        "Target accuracy reached!",
    ]


def test_a_script_callback_with_helpers_bases_and_state_round_trips(script_specs):
    spec = script_specs[1]
    assert spec.kind == "source" and spec.name == "Tracker"
    source = spec.source
    for line in (
        "import math",
        "import os.path as osp",
        "from collections import OrderedDict as OrderedDict",
        "TARGET = 0.95",
        "LABELS = ('low', 'high')",
        "def describe(epoch):",
        "class Base(ace3.Callback):",
    ):
        assert line in source, line
    assert source.index("class Base(") < source.index("class Tracker(")
    # JSON state, with the non-finite float carried exactly.
    assert spec.params == {"limit": 2, "notes": [], "best": {"__ace3_float__": "inf"}, "table": {}}
    wire = CallbackSpec.model_validate_json(spec.model_dump_json())
    (tracker,) = callbacks_from_specs([wire])
    assert tracker.limit == 2 and tracker.best == math.inf and tracker.notes == []
    _with_model(tracker)
    tracker.on_epoch_begin(1)
    tracker.on_epoch_end(1, {"val_loss": 0.4, "val_accuracy": 0.99})
    tracker.on_epoch_end(2, {"val_loss": 0.7, "val_accuracy": 0.10})
    assert tracker.notes == ["epoch 1 (b.txt)", "high", "low"]
    assert tracker.best == 0.4 and tracker.model.stop_training is True


def test_builtins_travel_by_name_and_init_arguments():
    stopper = EarlyStopping(monitor="val_accuracy", patience=3, min_delta=0.01, mode="max")
    spec = callback_spec(stopper)
    assert spec.kind == "builtin" and spec.name == "EarlyStopping" and spec.source is None
    assert spec.params == {
        "monitor": "val_accuracy",
        "patience": 3,
        "min_delta": 0.01,
        "mode": "max",
        "restore_best_weights": False,
        "verbose": True,
    }
    checkpoint = ModelCheckpoint("./c/model-{epoch:02d}-{val_loss:.2f}.pt", save_best_only=True)
    specs = [
        CallbackSpec.model_validate_json(s.model_dump_json())
        for s in map(callback_spec, [stopper, checkpoint])
    ]
    rebuilt = callbacks_from_specs(specs)
    assert type(rebuilt[0]) is EarlyStopping and rebuilt[0].patience == 3
    assert type(rebuilt[1]) is ModelCheckpoint and rebuilt[1].save_best_only is True
    assert rebuilt[1].filepath == checkpoint.filepath


# -- user classes in an importable module (this one) ----------------------------------------------

SCALE = 3


def _scaled(value):
    return value * SCALE


class ModuleCallback(Callback):
    def __init__(self) -> None:
        self.values: list[float] = []

    def on_epoch_end(self, epoch, logs=None):
        self.values.append(_scaled(logs["val_loss"]))


class StrictStopping(EarlyStopping):
    """A user subclass of a built-in: carried as source, the built-in imported."""

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)


def test_module_level_helpers_are_carried_as_source():
    spec = callback_spec(ModuleCallback())
    assert spec.kind == "source"
    assert "def _scaled(value):" in spec.source and "SCALE = 3" in spec.source
    assert spec.params == {"values": []}
    (callback,) = callbacks_from_specs([spec])
    callback.on_epoch_end(1, {"val_loss": 2.0})
    assert callback.values == [6.0]


def test_a_subclass_of_a_builtin_imports_the_builtin_and_keeps_its_state():
    spec = callback_spec(StrictStopping(patience=1, verbose=False))
    assert "from ace3.training.callbacks import EarlyStopping as EarlyStopping" in spec.source
    assert spec.params["patience"] == 1 and spec.params["best"] is None
    (callback,) = callbacks_from_specs([spec])
    assert isinstance(callback, EarlyStopping) and type(callback) is not EarlyStopping
    _with_model(callback)
    callback.on_epoch_end(1, {"val_loss": 1.0})
    callback.on_epoch_end(2, {"val_loss": 2.0})
    assert callback.model.stop_training is True and callback.stopped_epoch == 2


@dataclass
class DataclassCallback(Callback):
    threshold: float = 0.9
    seen: list = field(default_factory=list)

    @staticmethod
    def scale() -> int:
        return SCALE

    @property
    def scaled(self) -> list[int]:
        return [_scaled(v) for v in self.seen]

    def on_epoch_end(self, epoch, logs=None):
        self.seen.append(epoch * self.scale())


def test_decorated_classes_static_methods_and_properties_travel():
    spec = callback_spec(DataclassCallback(threshold=0.5))
    assert "from dataclasses import dataclass as dataclass" in spec.source
    assert spec.params == {"threshold": 0.5, "seen": []}
    (callback,) = callbacks_from_specs([spec])
    callback.on_epoch_end(2)
    assert callback.seen == [6] and callback.scaled == [18]
    assert repr(callback) == "DataclassCallback(threshold=0.5, seen=[6])"  # dataclass rebuilt


def test_engine_attributes_are_not_carried():
    callback = ModuleCallback()
    callback.set_model(object())
    callback._ace3_run = object()  # type: ignore[attr-defined]
    assert callback_spec(callback).params == {"values": []}


# -- refusals -----------------------------------------------------------------------------------

LOCK = threading.Lock()


class UsesALock(Callback):
    def on_epoch_end(self, epoch, logs=None):
        with LOCK:
            pass


class HoldsAFile(Callback):
    def __init__(self) -> None:
        self.handle = io.StringIO()


def test_an_unsendable_global_is_refused_by_name():
    with pytest.raises(UnsupportedFeatureError, match=r"UsesALock uses the global name 'LOCK'"):
        callback_spec(UsesALock())


def test_an_unsendable_attribute_is_refused_by_name():
    with pytest.raises(UnsupportedFeatureError, match=r"HoldsAFile\.handle is a _io\.StringIO"):
        callback_spec(HoldsAFile())


def test_non_callbacks_and_lambdas_are_refused():
    with pytest.raises(UnsupportedFeatureError, match="not a function"):
        callback_spec(lambda epoch: None)
    with pytest.raises(UnsupportedFeatureError, match=r"ace3\.Callback subclass"):
        callback_spec(object())


def test_a_closure_over_a_function_local_is_refused():
    threshold = 0.9

    class Local(Callback):
        def on_epoch_end(self, epoch, logs=None):
            if logs["val_accuracy"] > threshold:
                self.model.stop_training = True

    with pytest.raises(UnsupportedFeatureError, match=r"'threshold'.*closure"):
        callback_spec(Local())


def test_a_class_defined_in_a_function_without_closures_travels():
    class Local(Callback):
        def on_epoch_end(self, epoch, logs=None):
            self.model.stop_training = logs["val_loss"] < SCALE

    (callback,) = callbacks_from_specs([callback_spec(Local())])
    _with_model(callback).on_epoch_end(1, {"val_loss": 1.0})
    assert callback.model.stop_training is True


def test_a_class_without_readable_source_is_refused():
    namespace: dict[str, object] = {"Callback": Callback}
    exec(
        "class Made(Callback):\n    def on_epoch_end(self, epoch, logs=None):\n        pass\n",
        namespace,
    )
    with pytest.raises(UnsupportedFeatureError, match=r"cannot read the source code of class Made"):
        callback_spec(namespace["Made"]())  # type: ignore[operator]


def test_a_global_lambda_in_a_file_is_refused(tmp_path):
    path = tmp_path / "uses_lambda.py"
    path.write_text(
        "import ace3\nfrom ace3.training.callbacks.transport import callback_spec\n"
        "score = lambda logs: logs['val_loss']\n\n"
        "class UsesLambda(ace3.Callback):\n"
        "    def on_epoch_end(self, epoch, logs=None):\n"
        "        score(logs)\n\n"
        "callback_spec(UsesLambda())\n"
    )
    result = subprocess.run([sys.executable, str(path)], capture_output=True, text=True)
    assert result.returncode != 0
    assert "UsesLambda uses 'score', a lambda" in result.stderr
    assert "def score(...)" in result.stderr


def test_engine_side_errors_are_clear():
    with pytest.raises(CallbackError, match="unknown built-in callback 'Nope'"):
        callbacks_from_specs([{"kind": "builtin", "name": "Nope"}])
    with pytest.raises(
        CallbackError, match=r"does not define an ace3\.Callback subclass named 'X'"
    ):
        callbacks_from_specs([{"kind": "source", "name": "X", "source": "class X:\n    pass\n"}])
    with pytest.raises(ValueError, match="needs the class's source"):
        CallbackSpec(kind="source", name="X")
    with pytest.raises(ValueError, match="takes no 'source'"):
        CallbackSpec(kind="builtin", name="EarlyStopping", source="x = 1")


def test_the_sdk_stays_importable_without_torch_for_transport():
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from tests.unit.sdk.test_callback_transport import ModuleCallback\n"
        "from ace3.training.callbacks.transport import callback_spec\n"
        "callback_spec(ModuleCallback())\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
