"""User model code: import as ace3_user_model, archives, factory resolution, hooks, errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from torch import nn

from ace3.runtime.job_spec import ModelSpec
from ace3.runtime.user_code import USER_MODULE_NAME, build_model, load_user_code

MODEL = """
from torch import nn

def build_model(width=4):
    return nn.Linear(3, width)

class Net(nn.Module):
    def __init__(self, width=2):
        super().__init__()
        self.fc = nn.Linear(3, width)

    def forward(self, x):
        return self.fc(x)

def compute_loss(model, batch):
    return model(batch[0]).sum()

def not_a_model():
    return 42
"""


@pytest.fixture(autouse=True)
def _clean_modules():
    before = set(sys.modules)
    path_before = list(sys.path)
    yield
    for name in set(sys.modules) - before:
        del sys.modules[name]
    sys.path[:] = path_before


def test_file_function_factory(tmp_path: Path) -> None:
    path = tmp_path / "model.py"
    path.write_text(MODEL)
    user = load_user_code(ModelSpec(path=str(path)))
    assert user.module.__name__ == USER_MODULE_NAME
    assert sys.modules[USER_MODULE_NAME] is user.module
    model = build_model(user, {"width": 5})
    assert isinstance(model, nn.Linear) and model.out_features == 5
    assert user.compute_loss is not None and user.compute_metrics is None


def test_file_class_factory(tmp_path: Path) -> None:
    path = tmp_path / "model.py"
    path.write_text(MODEL)
    user = load_user_code(ModelSpec(path=str(path), factory="Net"))
    model = build_model(user, {"width": 7})
    assert model.fc.out_features == 7


def test_file_can_import_siblings(tmp_path: Path) -> None:
    (tmp_path / "helpers_for_ace3_test.py").write_text("WIDTH = 9\n")
    path = tmp_path / "model.py"
    path.write_text(
        "from torch import nn\nfrom helpers_for_ace3_test import WIDTH\n"
        "def build_model():\n    return nn.Linear(1, WIDTH)\n"
    )
    model = build_model(load_user_code(ModelSpec(path=str(path))), {})
    assert model.out_features == 9


def test_archive_entry_module(tmp_path: Path) -> None:
    pkg = tmp_path / "ace3_test_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "models.py").write_text(MODEL)
    spec = ModelSpec(path=str(tmp_path), kind="archive", entry_module="ace3_test_pkg.models")
    user = load_user_code(spec)
    assert user.module.__name__ == "ace3_test_pkg.models"
    assert isinstance(build_model(user, {}), nn.Linear)


def test_archive_needs_entry_module() -> None:
    with pytest.raises(ValueError, match="entry_module"):
        ModelSpec(path="/x", kind="archive")


def test_missing_factory_lists_callables(tmp_path: Path) -> None:
    path = tmp_path / "model.py"
    path.write_text(MODEL)
    with pytest.raises(AttributeError, match=r"no factory 'make'.*build_model"):
        load_user_code(ModelSpec(path=str(path), factory="make"))


def test_factory_must_return_module(tmp_path: Path) -> None:
    path = tmp_path / "model.py"
    path.write_text(MODEL)
    user = load_user_code(ModelSpec(path=str(path), factory="not_a_model"))
    with pytest.raises(TypeError, match=r"returned int, expected a torch\.nn\.Module"):
        build_model(user, {})


def test_user_errors_propagate(tmp_path: Path) -> None:
    path = tmp_path / "model.py"
    path.write_text("import definitely_not_a_module_ace3\n")
    with pytest.raises(ModuleNotFoundError):
        load_user_code(ModelSpec(path=str(path)))
    assert USER_MODULE_NAME not in sys.modules
    path.write_text("def build_model():\n    raise RuntimeError('factory exploded')\n")
    user = load_user_code(ModelSpec(path=str(path)))
    with pytest.raises(RuntimeError, match="factory exploded"):
        build_model(user, {})


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="model file not found"):
        load_user_code(ModelSpec(path=str(tmp_path / "nope.py")))


def test_a_teacher_package_named_like_the_students_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two packages with the same top-level module would give the teacher the student's code."""
    from ace3.runtime.techniques.teacher import TEACHER_MODULE_NAME

    monkeypatch.setattr(sys, "path", list(sys.path))
    for role, width in (("student", 2), ("teacher", 64)):
        package = tmp_path / role / "shared_model_pkg"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(
            f"import torch\n\ndef build_model():\n    return torch.nn.Linear(4, {width})\n"
        )
    spec = {"kind": "archive", "entry_module": "shared_model_pkg"}
    student = load_user_code(ModelSpec(path=str(tmp_path / "student"), **spec))
    try:
        assert student.factory().out_features == 2
        with pytest.raises(ValueError, match="another top-level name"):
            load_user_code(ModelSpec(path=str(tmp_path / "teacher"), **spec), TEACHER_MODULE_NAME)
    finally:
        sys.modules.pop("shared_model_pkg", None)
