"""A model's forward read from its source (upload_checks.model_forward) and checked against a
dataset's batch layout (services.batch_fit): recorded only where certain, and the verdict agrees
with what the engine's own call (ace3.runtime.loop.losses.forward_loss) does."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from ace3.runtime.loop.losses import forward_loss
from ace3_server.services.batch_fit import (
    PAIR,
    batch_fit_problem,
    dict_layout,
    huggingface_batch_problem,
)
from ace3_server.upload_checks.model_forward import forward_signature

EXAMPLE_MODEL = Path(__file__).parents[3] / "examples" / "digits" / "model.py"
TOKENS = dict_layout(["input_ids", "labels"])
HEADER = "import torch\nfrom torch import nn\n\n"
LOSS = "return {'loss': torch.zeros((), requires_grad=True)}"


def _signature(source: str, factory: str = "build_model") -> dict[str, Any] | None:
    return forward_signature(ast.parse(HEADER + textwrap.dedent(source)), factory)


def _model_with_forward(parameters: str) -> str:
    return f"""
class Net(nn.Module):
    def forward(self, {parameters}):
        {LOSS}

def build_model():
    return Net()
"""


def test_the_digits_example_without_its_compute_loss_is_recorded_and_takes_pairs() -> None:
    tree = ast.parse(EXAMPLE_MODEL.read_text())
    assert forward_signature(tree, "build_model") is None  # its compute_loss feeds the model
    tree.body = [s for s in tree.body if getattr(s, "name", None) != "compute_loss"]
    signature = forward_signature(tree, "build_model")
    assert signature is not None and signature["method"] == "nn.Sequential.forward"
    assert batch_fit_problem(signature, PAIR, "model.py") is None
    assert batch_fit_problem(signature, TOKENS, "model.py") is not None


def test_a_signature_records_each_parameter_kind() -> None:
    assert _signature(_model_with_forward("a, /, b, c=1, *args, d, e=2, **kwargs")) == {
        "method": "Net.forward",
        "params": [
            {"name": "a", "kind": "positional_only", "required": True},
            {"name": "b", "kind": "positional", "required": True},
            {"name": "c", "kind": "positional", "required": False},
            {"name": "d", "kind": "keyword_only", "required": True},
            {"name": "e", "kind": "keyword_only", "required": False},
        ],
        "var_positional": True,
        "var_keyword": True,
    }


@pytest.mark.parametrize(
    ("source", "method"),
    [
        # return model, where model = Net(...) is the only binding of that name
        (
            f"class Net(nn.Module):\n    def forward(self, x):\n        {LOSS}\n"
            "def build_model(width=4):\n    model = Net()\n    model.width = width\n"
            "    return model\n",
            "Net.forward",
        ),
        # forward inherited through a module-level base
        (
            f"class Base(nn.Module):\n    def forward(self, x):\n        {LOSS}\n"
            "class Net(Base):\n    pass\ndef build_model():\n    return Net()\n",
            "Base.forward",
        ),
        # the factory is the class itself, and torch.nn.Module spelled in full
        (
            f"class build_model(torch.nn.Module):\n    def forward(self, x):\n        {LOSS}\n",
            "build_model.forward",
        ),
        # nn.Sequential, returned or subclassed, spelled as imported
        (
            "def build_model():\n    return nn.Sequential(nn.Linear(4, 2))\n",
            "nn.Sequential.forward",
        ),
        (
            "import torch.nn as tnn\nclass Net(tnn.Sequential):\n    pass\n"
            "def build_model():\n    return Net(tnn.Linear(4, 2))\n",
            "nn.Sequential.forward",
        ),
        (
            "from torch.nn import Sequential, Linear\n"
            "def build_model():\n    return Sequential(Linear(4, 2))\n",
            "nn.Sequential.forward",
        ),
        # every return builds the same class
        (
            f"class Net(nn.Module):\n    def forward(self, x):\n        {LOSS}\n"
            "def build_model(big=False):\n    if big:\n        return Net()\n    return Net()\n",
            "Net.forward",
        ),
    ],
)
def test_certain_factories_are_recorded(source: str, method: str) -> None:
    signature = _signature(source)
    assert signature is not None and signature["method"] == method


@pytest.mark.parametrize(
    "source",
    [
        # compute_loss feeds the model itself
        _model_with_forward("input_ids") + "def compute_loss(model, batch):\n    return 0\n",
        # what the factory returns is not a bare instance
        _model_with_forward("x").replace("return Net()", "return Net().to('cpu')"),
        # two classes
        f"class A(nn.Module):\n    def forward(self, x):\n        {LOSS}\n"
        f"class B(nn.Module):\n    def forward(self, x, y):\n        {LOSS}\n"
        "def build_model(a=True):\n    if a:\n        return A()\n    return B()\n",
        # another library class has its own forward; nn.Module's raises
        "class Net(nn.Linear):\n    pass\ndef build_model():\n    return Net(4, 2)\n",
        "class Net(nn.Module):\n    pass\ndef build_model():\n    return Net()\n",
        "def build_model():\n    return nn.Linear(4, 2)\n",
        # nn is not torch's
        "import mylib as nn\ndef build_model():\n    return nn.Sequential()\n",
        # forward replaced on the instance
        _model_with_forward("x").replace(
            "    def forward",
            "    def __init__(self):\n        super().__init__()\n"
            "        self.forward = self.other\n    def forward",
        ),
        # two bases
        f"class A(nn.Module):\n    def forward(self, x):\n        {LOSS}\n"
        "class Net(A, nn.Module):\n    pass\ndef build_model():\n    return Net()\n",
        # a decorated forward, a __call__, a forward assigned, a decorated class
        _model_with_forward("x").replace(
            "    def forward", "    @torch.no_grad()\n    def forward"
        ),
        _model_with_forward("x").replace(
            "    def forward",
            "    def __call__(self, *a):\n        return self.forward()\n    def forward",
        ),
        _model_with_forward("x") + "Net.forward = lambda self, *a, **k: None\n"
        "class Other(nn.Module):\n    forward = Net.forward\n",
        "import dataclasses\n"
        + _model_with_forward("x").replace("class Net", "@dataclasses.dataclass\nclass Net"),
        # the class name is shadowed in the factory, or rebound at module level
        _model_with_forward("x").replace("def build_model():", "def build_model(Net=nn.Linear):"),
        _model_with_forward("x") + "Net = nn.Linear\n",
        # a name the parser cannot see may be bound (star import), or the model's factory is
        # imported from elsewhere
        "from torch.nn import *\n" + _model_with_forward("x"),
        "from mypkg.model import build_model\n",
        # the model is returned through another variable bound twice
        f"class Net(nn.Module):\n    def forward(self, x):\n        {LOSS}\n"
        "def build_model():\n    m = Net()\n    m = m.half()\n    return m\n",
        # what model(...) runs may change unseen (a review found each of these refused falsely)
        _model_with_forward("x, y").replace(
            "    return Net()", "    m = Net()\n    m.register_forward_pre_hook(f)\n    return m"
        ),
        "class Base(nn.Module):\n    def __call__(self, *a, **k):\n        return 0\n"
        + _model_with_forward("x, y").replace("class Net(nn.Module)", "class Net(Base)"),
        "class Base(nn.Module):\n    def __init_subclass__(cls):\n        pass\n"
        + _model_with_forward("x, y").replace("class Net(nn.Module)", "class Net(Base)"),
        "class Meta(type):\n    pass\nclass Base(nn.Module, metaclass=Meta):\n    pass\n"
        + _model_with_forward("x, y").replace("class Net(nn.Module)", "class Net(Base)"),
        _model_with_forward("x, y") + "def accept(cls):\n    pass\naccept(Net)\n",
        _model_with_forward("x, y") + "def f():\n    type.__setattr__(Net, 'forward', None)\n",
        _model_with_forward("x, y").replace(
            "    def forward",
            "    def __init__(self):\n        super().__init__()\n"
            "        object.__setattr__(self, 'forward', self.other)\n    def forward",
        ),
        _model_with_forward("x, y").replace(
            "    return Net()", "    m = Net()\n    m.__class__ = Net\n    return m"
        ),
        _model_with_forward("x, y") + "def _s():\n    global Net\n    Net = nn.Linear\n",
        _model_with_forward("x, y") + "if (Net := nn.Linear):\n    pass\n",
        _model_with_forward("x, y").replace(
            "    def forward",
            "    if True:\n        def other(self):\n            pass\n    def forward",
        ),
        "import sys\n"
        + _model_with_forward("x, y")
        + "sys.modules[__name__].compute_loss = None\n",
        "def build_model():\n    return torch"
        + ".nn" * 1200
        + ".Sequential()\n",  # deeper than recursion
        # a generator
        _model_with_forward("x").replace("return Net()", "yield Net()"),
    ],
)
def test_uncertain_factories_record_nothing(source: str) -> None:
    assert _signature(source) is None


PARAMETER_LISTS = [
    "x",
    "inputs, targets=None",
    "input_ids, labels=None",
    "input_ids, labels",
    "input_ids, attention_mask",
    "",
    "*args",
    "*, x",
    "x, *, scale",
    "x, *, scale=1.0",
    "**kwargs",
    "input_ids, **kwargs",
    "input_ids, /, labels",
    "input_ids, labels, /",
    "x, /",
    "*args, **kwargs",
]


def _engine_accepts(parameters: str, batch: Any) -> bool:
    namespace: dict[str, Any] = {}
    exec(HEADER + _model_with_forward(parameters), namespace)  # the test's own source
    model = namespace["build_model"]()
    try:
        forward_loss(model, batch, None)
    except TypeError:
        return False
    return True


@pytest.mark.parametrize("parameters", PARAMETER_LISTS)
def test_the_verdict_agrees_with_the_engine_for_pair_and_dict_batches(parameters: str) -> None:
    signature = _signature(_model_with_forward(parameters))
    assert signature is not None
    pair_batch = (torch.zeros(2, 3), torch.zeros(2, dtype=torch.long))
    dict_batch = {"input_ids": torch.zeros(2, 4, dtype=torch.long), "labels": torch.zeros(2, 4)}
    for layout, batch in ((PAIR, pair_batch), (TOKENS, dict_batch)):
        problem = batch_fit_problem(signature, layout, "model.py")
        assert (problem is None) == _engine_accepts(parameters, batch), (parameters, problem)


def test_the_messages_say_what_is_passed_what_is_missing_and_what_to_do() -> None:
    two = _signature(_model_with_forward("input_ids, attention_mask, *, scale=2"))
    assert batch_fit_problem(two, PAIR, "net.py") == (
        "the dataset gives (inputs, targets) batches, which the engine passes as model(inputs), "
        "but Net.forward(self, input_ids, attention_mask, *, scale=...) also requires "
        "'attention_mask'; define compute_loss(model, batch) in net.py to feed the model "
        "yourself, or choose a dataset whose batches its forward takes"
    )
    one = _signature(_model_with_forward("x"))
    assert batch_fit_problem(one, TOKENS, "net.py") == (
        "the dataset gives dict batches of 'input_ids', 'labels', which the engine passes as "
        "model(**batch), but Net.forward(self, x) has no parameters 'input_ids', 'labels' and "
        "requires 'x', which the batches lack; define compute_loss(model, batch) in net.py to "
        "feed the model yourself, or choose a dataset whose batches its forward takes"
    )
    none = _signature(_model_with_forward("*, x"))
    assert "Net.forward(self, *, x) takes no positional argument" in str(
        batch_fit_problem(none, PAIR, "net.py")
    )


def test_nothing_is_checked_where_either_side_is_unknown() -> None:
    signature = _signature(_model_with_forward("input_ids"))
    assert batch_fit_problem(None, PAIR, "model.py") is None
    assert batch_fit_problem(signature, None, "model.py") is None


def test_a_hugging_face_model_is_refused_pairs_only() -> None:
    problem = huggingface_batch_problem(PAIR)
    assert problem is not None and "computes its loss only when given labels" in problem
    assert huggingface_batch_problem(TOKENS) is None
    assert huggingface_batch_problem(None) is None


def test_a_search_whose_space_may_make_trials_a_pipeline_is_not_checked() -> None:
    from types import SimpleNamespace

    from ace3.config import TrainingConfig
    from ace3.hp import HPConfig
    from ace3_server.services.batch_fit import batch_problems, searched

    model = SimpleNamespace(kind="file", forward_signature=_signature(_model_with_forward("x, mask")),
                            filename="model.py", name="m")  # fmt: skip
    pairs = {"dataset_id": SimpleNamespace(batch_layout=PAIR, name="d")}
    plain = TrainingConfig()
    assert batch_problems(model, pairs, plain, set())  # refused as a job
    search = HPConfig.model_validate(
        {"search_space": {"pipeline_parallel_size": {"type": "choice", "options": [2]}},
         "base_config": {"num_gpus": 2}}
    )  # fmt: skip
    assert searched(search) == {"pipeline_parallel_size"}
    assert batch_problems(model, pairs, search.base_config, searched(search)) == []
    package = SimpleNamespace(**{**vars(model), "kind": "archive"})
    assert batch_problems(package, pairs, plain, set()) == []


def test_packing_on_unread_jsonl_shards_is_refused_unless_the_model_is_hugging_face() -> None:
    from types import SimpleNamespace

    from ace3.config import TrainingConfig
    from ace3_server.services.batch_fit import packing_problems

    shards = {"dataset_id": SimpleNamespace(batch_layout=PAIR, kind="remote", format="jsonl")}
    packing = TrainingConfig(packing=True)
    hf = SimpleNamespace(kind="huggingface")
    assert packing_problems(shards, packing, hf) == []  # the job reads their kind
    refused = packing_problems(shards, packing, SimpleNamespace(kind="file"))
    assert [p["loc"] for p in refused] == [["body", "config", "packing"]]
