"""ace3.training.optimizers: state size, convergence, exact resume, 8-bit quantization, carrying settings;
ace3.runtime.loop.optim.build_optimizer for every optimizer name."""

from __future__ import annotations

import copy
import importlib.util
import io

import pytest
import torch
from torch import nn

from ace3.config import TrainingConfig
from ace3.errors import UnsupportedFeatureError
from ace3.runtime.loop.optim import build_optimizer, current_learning_rate
from ace3.training.optimizers import (
    Adam8bit,
    MemoryEfficientAdam,
    optimizer_settings,
    optimizer_state_bytes,
)
from ace3.training.optimizers.blockwise_8bit import (
    dequantize_blockwise,
    dynamic_code,
    quantize_blockwise,
)
from ace3.training.schedulers import WarmupCosineScheduler

ACE3_OPTIMIZERS = [MemoryEfficientAdam, Adam8bit]


def _mlp(seed: int = 0, width: int = 256) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(32, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 1)
    )


def _regression(seed: int = 1, n: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """Targets from a random teacher network: learnable, but not in a handful of steps."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(n, 32, generator=generator)
    w1 = torch.randn(32, 16, generator=generator) / 32**0.5
    w2 = torch.randn(16, 1, generator=generator)
    return inputs, torch.tanh(inputs @ w1) @ w2


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int, data) -> float:
    inputs, targets = data
    for _ in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        return nn.functional.mse_loss(model(inputs), targets).item()


def _one_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    inputs, targets = _regression(n=16)
    optimizer.zero_grad()
    nn.functional.mse_loss(model(inputs), targets).backward()
    optimizer.step()


# -- memory ---------------------------------------------------------------------------------


def test_state_is_a_fraction_of_adams() -> None:
    sizes = {}
    for cls in (torch.optim.Adam, MemoryEfficientAdam, Adam8bit):
        model = nn.Sequential(*(nn.Linear(256, 256) for _ in range(3)))
        optimizer = cls(model.parameters(), lr=1e-3)
        assert isinstance(optimizer, torch.optim.Optimizer)
        assert not isinstance(optimizer, torch.optim.Adam) or cls is torch.optim.Adam
        inputs = torch.randn(4, 256)
        model(inputs).square().mean().backward()
        optimizer.step()
        sizes[cls] = optimizer_state_bytes(optimizer)
    adam = sizes[torch.optim.Adam]
    assert adam >= 3 * 2 * 256 * 256 * 4  # two float32 moments per weight
    assert sizes[Adam8bit] <= adam / 3
    assert sizes[MemoryEfficientAdam] <= adam / 2


def test_state_layout_and_dtypes() -> None:
    model = nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 3))
    mea, eight = MemoryEfficientAdam(model.parameters()), Adam8bit(model.parameters())
    for optimizer in (mea, eight):
        optimizer.zero_grad()
        model(torch.randn(4, 256)).square().mean().backward()
        optimizer.step()
    weight, bias = model[0].weight, model[0].bias
    assert mea.state[weight]["exp_avg"].dtype == torch.bfloat16
    assert mea.state[weight]["exp_avg_sq_row"].shape == (256,)
    assert mea.state[weight]["exp_avg_sq_col"].shape == (256,)
    assert mea.state[bias]["exp_avg_sq"].dtype == torch.float32
    assert eight.state[weight]["exp_avg_code"].dtype == torch.uint8
    assert eight.state[weight]["exp_avg_sq_code"].numel() == 256 * 256
    assert eight.state[weight]["exp_avg_absmax"].shape == (256 * 256 // 256,)
    assert eight.state[bias]["exp_avg"].dtype == torch.float32  # small: float32 like bnb
    assert "exp_avg" in eight.state[model[1].weight]  # 768 elements < 4096
    assert eight.backend == "ace3"


def test_optimizer_state_bytes_counts_every_tensor_once() -> None:
    shared = torch.zeros(10)
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    optimizer.state["a"] = {"x": shared, "y": shared, "z": [torch.zeros(3, dtype=torch.uint8)]}
    assert optimizer_state_bytes(optimizer) == 40 + 3


# -- correctness ----------------------------------------------------------------------------


@pytest.mark.parametrize("cls", ACE3_OPTIMIZERS)
def test_reaches_adams_loss_on_regression(cls) -> None:
    data = _regression()
    baseline = _train(_mlp(), torch.optim.Adam(_mlp().parameters(), lr=1e-3), 0, data)
    adam_model = _mlp()
    adam = _train(adam_model, torch.optim.Adam(adam_model.parameters(), lr=1e-3), 150, data)
    model = _mlp()
    ours = _train(model, cls(model.parameters(), lr=1e-3), 150, data)
    assert adam < baseline / 20  # the problem is learned, not trivially flat
    assert ours <= adam * 1.2 + 1e-4, (ours, adam)


@pytest.mark.parametrize("cls", ACE3_OPTIMIZERS)
def test_reaches_adams_accuracy_on_classification(cls) -> None:
    generator = torch.Generator().manual_seed(3)
    centres = torch.randn(4, 32, generator=generator) * 1.5
    labels = torch.arange(256) % 4
    inputs = centres[labels] + torch.randn(256, 32, generator=generator)

    def run(make) -> float:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 4))
        optimizer = make(model.parameters())
        for _ in range(60):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(inputs), labels).backward()
            optimizer.step()
        with torch.no_grad():
            return nn.functional.cross_entropy(model(inputs), labels).item()

    adam = run(lambda params: torch.optim.Adam(params, lr=3e-3))
    ours = run(
        lambda params: (
            cls(params, lr=3e-3, min_8bit_size=0) if cls is Adam8bit else cls(params, lr=3e-3)
        )
    )
    assert adam < 0.2
    assert ours <= adam * 1.2 + 0.02, (ours, adam)


def test_full_precision_paths_match_torch_adamw() -> None:
    """Vectors in MemoryEfficientAdam, and small tensors in Adam8bit, keep float32 moments:
    the update must then be AdamW's."""
    torch.manual_seed(0)
    start = [torch.randn(100), torch.randn(30, 40)]
    grads = [[torch.randn_like(t) for t in start] for _ in range(5)]

    def run(make) -> list[torch.Tensor]:
        params = [nn.Parameter(t.clone()) for t in start]
        optimizer = make(params)
        for step_grads in grads:
            for param, grad in zip(params, step_grads, strict=True):
                param.grad = grad.clone()
            optimizer.step()
        return [p.detach() for p in params]

    settings = {"lr": 1e-2, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1}
    expected = run(lambda params: torch.optim.AdamW(params, **settings))
    small = run(lambda params: Adam8bit(params, **settings))
    for got, want in zip(small, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-7)
    vector = run(lambda params: MemoryEfficientAdam(params, **settings))[0]
    torch.testing.assert_close(vector, expected[0], rtol=0, atol=1e-7)


@pytest.mark.parametrize("cls", ACE3_OPTIMIZERS)
def test_weight_decay_is_decoupled(cls) -> None:
    weight = nn.Parameter(torch.full((80, 80), 2.0))  # 6400 elements: 8-bit path for Adam8bit
    optimizer = cls([weight], lr=0.1, weight_decay=0.5)
    weight.grad = torch.zeros_like(weight)  # Adam's step is then 0: only the decay acts
    optimizer.step()
    torch.testing.assert_close(weight.detach(), torch.full((80, 80), 2.0 * (1 - 0.1 * 0.5)))


@pytest.mark.parametrize("cls", ACE3_OPTIMIZERS)
def test_closure_is_evaluated_with_gradients(cls) -> None:
    model = _mlp(width=64)
    optimizer = cls(model.parameters(), lr=1e-3)
    inputs, targets = _regression(n=16)
    calls = []

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        calls.append(loss.item())
        return loss

    before = copy.deepcopy(model.state_dict())
    loss = optimizer.step(closure)
    assert calls and loss.item() == calls[0]
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("cls", ACE3_OPTIMIZERS)
def test_bfloat16_parameters_train(cls) -> None:
    weight = nn.Parameter(torch.randn(80, 80, dtype=torch.bfloat16))
    optimizer = cls([weight], lr=1e-2)
    for _ in range(3):
        weight.grad = weight.detach().clone()  # gradient of |w|^2 / 2: shrinks the weight
        optimizer.step()
    assert weight.dtype == torch.bfloat16
    assert weight.detach().float().abs().mean() < 0.99 * 0.8  # E|N(0,1)| ~ 0.8


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"lr": -1.0}, "lr"),
        ({"betas": (0.9, 1.0)}, "betas"),
        ({"betas": (0.9,)}, "betas"),
        ({"eps": -1e-8}, "eps"),
        ({"weight_decay": -0.1}, "weight_decay"),
    ],
)
@pytest.mark.parametrize("cls", ACE3_OPTIMIZERS)
def test_bad_hyperparameters_are_refused_by_name(cls, kwargs, named) -> None:
    with pytest.raises(ValueError, match=named):
        cls([nn.Parameter(torch.zeros(2))], **kwargs)


def test_adam8bit_options_are_checked() -> None:
    params = [nn.Parameter(torch.zeros(2))]
    with pytest.raises(ValueError, match="block_size"):
        Adam8bit(params, block_size=1)
    with pytest.raises(ValueError, match="min_8bit_size"):
        Adam8bit(params, min_8bit_size=-1)
    with pytest.raises(ValueError, match="use_bitsandbytes=True needs every parameter on a CUDA"):
        Adam8bit(params, use_bitsandbytes=True)
    assert Adam8bit(params, use_bitsandbytes=False).backend == "ace3"


@pytest.mark.skipif(
    importlib.util.find_spec("bitsandbytes") is None or not torch.cuda.is_available(),
    reason="needs bitsandbytes and a CUDA device",
)
def test_adam8bit_delegates_to_bitsandbytes_on_cuda() -> None:  # pragma: no cover - GPU only
    import bitsandbytes

    model = _mlp(width=128).cuda()
    optimizer = Adam8bit(model.parameters(), lr=1e-3)
    assert optimizer.backend == "bitsandbytes"
    assert isinstance(optimizer._bnb, bitsandbytes.optim.Adam8bit)
    inputs, targets = (t.cuda() for t in _regression())
    first = nn.functional.mse_loss(model(inputs), targets).item()
    for _ in range(50):
        optimizer.zero_grad()
        nn.functional.mse_loss(model(inputs), targets).backward()
        optimizer.step()
    assert nn.functional.mse_loss(model(inputs), targets).item() < first / 2
    assert optimizer_state_bytes(optimizer) > 0


class _StandInBnbAdam8bit(torch.optim.Optimizer):
    """Stands in for bitsandbytes.optim.Adam8bit (same constructor arguments, state stored
    under bitsandbytes' key names) so that Adam8bit's delegation plumbing runs on a CPU-only
    machine: shared groups and state, schedulers, checkpoints. bitsandbytes' own numerics
    are covered by the GPU-only test above."""

    def __init__(self, params, lr, betas, eps, weight_decay, min_8bit_size):
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)
        self.min_8bit_size = min_8bit_size

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        for group in self.param_groups:
            for param in group["params"]:
                state = self.state[param]
                if not state:
                    state["state1"] = torch.zeros_like(param)
                state["state1"].mul_(group["betas"][0]).add_(param.grad)
                param.add_(state["state1"], alpha=-group["lr"])
        return loss


def test_adam8bit_delegation_shares_groups_state_and_checkpoints(monkeypatch) -> None:
    import ace3.training.optimizers.adam8bit as optimizers_module

    monkeypatch.setattr(
        optimizers_module,
        "_bitsandbytes_optim",
        lambda params, wanted: type("bnb_optim", (), {"Adam8bit": _StandInBnbAdam8bit}),
    )
    model = nn.Linear(4, 3)
    groups = [{"params": iter([model.weight])}, {"params": iter([model.bias]), "lr": 0.5}]
    optimizer = Adam8bit(groups, lr=0.1, min_8bit_size=7)
    assert optimizer.backend == "bitsandbytes" and optimizer._bnb.min_8bit_size == 7
    assert optimizer.param_groups is optimizer._bnb.param_groups
    assert [len(g["params"]) for g in optimizer.param_groups] == [1, 1]  # iterators survived
    WarmupCosineScheduler(optimizer, warmup_steps=2, total_steps=4)  # writes the shared lrs
    assert optimizer._bnb.param_groups[0]["lr"] == pytest.approx(0.05)
    grads = _grad_sequence(model, 6, seed=2)
    _apply(model, optimizer, grads[:3])
    assert optimizer_state_bytes(optimizer) == (12 + 3) * 4

    resumed_model = copy.deepcopy(model)
    resumed = Adam8bit([{"params": [resumed_model.weight]}, {"params": [resumed_model.bias]}])
    resumed.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    assert resumed.state is resumed._bnb.state and resumed.param_groups is resumed._bnb.param_groups
    _apply(model, optimizer, grads[3:])
    _apply(resumed_model, resumed, grads[3:])
    for original, restored in zip(model.parameters(), resumed_model.parameters(), strict=True):
        assert torch.equal(original, restored)
    monkeypatch.undo()
    with pytest.raises(ValueError, match="written by the bitsandbytes backend"):
        Adam8bit(nn.Linear(4, 3).parameters()).load_state_dict(optimizer.state_dict())


# -- resume ---------------------------------------------------------------------------------


def _grad_sequence(model: nn.Module, steps: int, seed: int) -> list[list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [
        [torch.randn(p.shape, generator=generator).to(p.dtype) for p in model.parameters()]
        for _ in range(steps)
    ]


def _apply(model: nn.Module, optimizer: torch.optim.Optimizer, grads) -> None:
    for step_grads in grads:
        for param, grad in zip(model.parameters(), step_grads, strict=True):
            param.grad = grad.clone()
        optimizer.step()


@pytest.mark.parametrize("cls", ACE3_OPTIMIZERS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_dict_resume_is_bit_identical(cls, dtype) -> None:
    model = nn.Sequential(nn.Linear(96, 64), nn.Linear(64, 8)).to(dtype)  # 6144 elements: 8-bit
    optimizer = cls(model.parameters(), lr=1e-2, weight_decay=0.01)
    grads = _grad_sequence(model, 8, seed=5)
    _apply(model, optimizer, grads[:4])

    buffer = io.BytesIO()  # what a checkpoint does
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    resumed_model = nn.Sequential(nn.Linear(96, 64), nn.Linear(64, 8)).to(dtype)
    resumed_model.load_state_dict(saved["model"])
    resumed = cls(resumed_model.parameters(), lr=1e-2, weight_decay=0.01)
    resumed.load_state_dict(saved["optimizer"])

    for key, value in optimizer.state[model[0].weight].items():  # dtypes survive the load
        loaded = resumed.state[resumed_model[0].weight][key]
        assert type(loaded) is type(value)
        if isinstance(value, torch.Tensor):
            assert loaded.dtype == value.dtype and torch.equal(loaded, value)

    _apply(model, optimizer, grads[4:])
    _apply(resumed_model, resumed, grads[4:])
    for original, restored in zip(model.parameters(), resumed_model.parameters(), strict=True):
        assert torch.equal(original, restored)


def test_adam8bit_refuses_state_of_the_other_backend() -> None:
    optimizer = Adam8bit([nn.Parameter(torch.zeros(3))])
    foreign = {"state": {0: {"state1": torch.zeros(3), "step": 1}}, "param_groups": []}
    with pytest.raises(ValueError, match="use_bitsandbytes=True"):
        optimizer.load_state_dict(foreign)


# -- 8-bit quantization ---------------------------------------------------------------------


def test_dynamic_codes() -> None:
    signed, unsigned = dynamic_code(True), dynamic_code(False)
    for code in (signed, unsigned):
        assert code.numel() == 256 and len(set(code.tolist())) == 256
        assert torch.all(code[1:] > code[:-1]) and code.max() == 1.0 and 0.0 in code.tolist()
        assert code[code > 0].min() < 1e-6  # seven decades of range
    assert signed.min() < -0.99 and unsigned.min() == 0.0


def test_blockwise_round_trip_error_bound() -> None:
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(10_000, generator=generator) * torch.logspace(-3, 1, 10_000)
    for signed, bound, data in ((True, 0.0071, values), (False, 0.0036, values.square())):
        codes, absmax = quantize_blockwise(data, 256, signed=signed)
        assert codes.dtype == torch.uint8 and codes.numel() == data.numel()
        assert absmax.dtype == torch.float32 and absmax.numel() == -(-data.numel() // 256)
        restored = dequantize_blockwise(codes, absmax, 256, signed=signed)
        per_element_absmax = absmax.repeat_interleave(256)[: data.numel()]
        assert torch.all((restored - data).abs() <= bound * per_element_absmax + 1e-12)
    # The dynamic code keeps small values: within 1e-3 of the block max, relative error < 60%,
    # where a linear 8-bit code (step 1/127) would round them all to zero.
    small = torch.tensor([1.0] + [2e-3, -3e-3, 5e-3, -7e-3] * 64)[:256]
    codes, absmax = quantize_blockwise(small, 256, signed=True)
    restored = dequantize_blockwise(codes, absmax, 256, signed=True)
    assert torch.all(((restored - small) / small).abs()[1:] < 0.6)


def test_unsigned_quantization_never_rounds_a_positive_value_to_zero() -> None:
    values = torch.tensor([1.0, 1e-9, 1e-12, 0.0] * 64)
    codes, absmax = quantize_blockwise(values, 256, signed=False)
    restored = dequantize_blockwise(codes, absmax, 256, signed=False)
    assert torch.all(restored[values > 0] > 0) and torch.all(restored[values == 0] == 0)


def test_quantize_writes_into_given_tensors() -> None:
    values = torch.randn(1000)
    out = (torch.empty(1000, dtype=torch.uint8), torch.empty(4))
    result = quantize_blockwise(values, 256, signed=True, out=out)
    assert result[0] is out[0] and result[1] is out[1]
    assert torch.equal(out[0], quantize_blockwise(values, 256, signed=True)[0])


# -- carrying to a job ----------------------------------------------------------------------


def _params() -> list[nn.Parameter]:
    return list(nn.Linear(3, 2).parameters())


def test_settings_of_supported_optimizers() -> None:
    adamw = torch.optim.AdamW(_params(), lr=3e-4, betas=(0.8, 0.99), eps=1e-7, weight_decay=0.05)
    assert optimizer_settings(adamw) == {
        "optimizer": "adamw",
        "learning_rate": 3e-4,
        "weight_decay": 0.05,
        "betas": (0.8, 0.99),
        "eps": 1e-7,
    }
    adam = optimizer_settings(torch.optim.Adam(_params(), lr=0.01, weight_decay=0.1))
    assert adam["optimizer"] == "adam" and adam["weight_decay"] == 0.1
    decoupled = torch.optim.Adam(_params(), weight_decay=0.1, decoupled_weight_decay=True)
    assert optimizer_settings(decoupled)["optimizer"] == "adamw"
    sgd = optimizer_settings(torch.optim.SGD(_params(), lr=0.1, momentum=0.5))
    assert sgd == {"optimizer": "sgd", "learning_rate": 0.1, "weight_decay": 0.0, "momentum": 0.5}
    assert optimizer_settings(MemoryEfficientAdam(_params(), lr=1e-4, weight_decay=0.01)) == {
        "optimizer": "memory_efficient_adam",
        "learning_rate": 1e-4,
        "weight_decay": 0.01,
        "betas": (0.9, 0.999),
        "eps": 1e-8,
    }
    assert optimizer_settings(Adam8bit(_params(), lr=1e-4))["optimizer"] == "adam8bit"
    for settings in (adam, sgd, optimizer_settings(adamw)):
        TrainingConfig(**settings)  # the fields are valid config fields


def test_settings_use_the_schedules_base_rate() -> None:
    optimizer = torch.optim.AdamW(_params(), lr=1e-3)
    WarmupCosineScheduler(optimizer, warmup_steps=10, total_steps=100)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-4)  # warming up
    assert optimizer_settings(optimizer)["learning_rate"] == 1e-3


def test_settings_round_trip_through_build_optimizer() -> None:
    for optimizer in (
        torch.optim.AdamW(_params(), lr=2e-3, betas=(0.85, 0.95), weight_decay=0.02),
        torch.optim.SGD(_params(), lr=0.05, momentum=0.7, weight_decay=1e-4),
        MemoryEfficientAdam(_params(), lr=5e-4, eps=1e-6),
        Adam8bit(_params(), lr=5e-4, betas=(0.5, 0.9)),
    ):
        settings = optimizer_settings(optimizer)
        rebuilt = build_optimizer(_params(), TrainingConfig(**settings))
        assert type(rebuilt) is type(optimizer)
        assert optimizer_settings(rebuilt) == settings


def test_other_torch_optim_classes_are_carried_by_class_name() -> None:
    rmsprop = torch.optim.RMSprop(_params(), lr=0.01, alpha=0.9, centered=True, weight_decay=0.1)
    settings = optimizer_settings(rmsprop)
    assert settings == {
        "optimizer": "RMSprop",
        "learning_rate": 0.01,
        "weight_decay": 0.1,
        "optimizer_kwargs": {"alpha": 0.9, "centered": True},
    }
    rebuilt = build_optimizer(_params(), TrainingConfig(**settings))
    assert type(rebuilt) is torch.optim.RMSprop and rebuilt.defaults == rmsprop.defaults
    rprop = optimizer_settings(torch.optim.Rprop(_params(), etas=(0.4, 1.3)))
    assert rprop == {"optimizer": "Rprop", "learning_rate": 0.01,
                     "optimizer_kwargs": {"etas": [0.4, 1.3]}}  # fmt: skip


def test_a_weight_decay_turned_off_against_the_class_default_travels_as_zero() -> None:
    """Muon's own default decay is 0.1: a client-built Muon(weight_decay=0) must not train with
    it in the job (weight_decay=0 in the config means "torch's default" for a class name)."""
    matrices = [nn.Parameter(torch.randn(4, 3))]
    muon = torch.optim.Muon(matrices, lr=0.02, weight_decay=0.0)
    settings = optimizer_settings(muon)
    assert settings == {"optimizer": "Muon", "learning_rate": 0.02,
                        "optimizer_kwargs": {"weight_decay": 0.0}}  # fmt: skip
    rebuilt = build_optimizer([nn.Parameter(torch.randn(4, 3))], TrainingConfig(**settings))
    assert rebuilt.defaults == muon.defaults
    default = optimizer_settings(torch.optim.Muon(matrices, lr=0.02))  # its own 0.1
    assert default["weight_decay"] == pytest.approx(0.1)
    assert "optimizer_kwargs" not in default


def test_a_class_that_cannot_take_the_model_says_so_without_blaming_empty_kwargs() -> None:
    with pytest.raises(ValueError, match=r"optimizer='Muon': torch\.optim\.Muon cannot optimize"):
        build_optimizer(_params(), TrainingConfig(optimizer="Muon"))  # a bias is 1-D


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda p: torch.optim.AdamW(p, amsgrad=True), "amsgrad"),
        (lambda p: torch.optim.Adam(p, maximize=True), "maximize"),
        (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True), "nesterov"),
        (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, dampening=0.1), "dampening"),
        (lambda p: type("MyRMSprop", (torch.optim.RMSprop,), {})(p), "MyRMSprop"),
        (lambda p: Adam8bit(p, block_size=64), "block_size"),
        (lambda p: torch.optim.AdamW([{"params": p[:1]}, {"params": p[1:], "lr": 0.1}]), "'lr'"),
        (lambda p: torch.optim.SGD(p, lr=float("inf")), "learning_rate"),
    ],
)
def test_settings_refuse_what_a_job_cannot_rebuild(make, named) -> None:
    with pytest.raises(UnsupportedFeatureError, match=named) as caught:
        optimizer_settings(make(_params()))
    assert caught.value.problems


def test_settings_accept_equal_groups_and_check_the_model() -> None:
    model = nn.Linear(3, 2)
    weight, bias = model.weight, model.bias
    groups = torch.optim.AdamW([{"params": [weight]}, {"params": [bias]}], lr=1e-3)
    assert optimizer_settings(groups, model=model)["learning_rate"] == 1e-3
    partial = torch.optim.AdamW([weight], lr=1e-3)
    with pytest.raises(UnsupportedFeatureError, match="requires_grad"):
        optimizer_settings(partial, model=model)
    bias.requires_grad_(False)
    assert optimizer_settings(partial, model=model)["optimizer"] == "adamw"


def test_subclasses_are_not_carried() -> None:
    class Tweaked(torch.optim.AdamW):
        pass

    with pytest.raises(UnsupportedFeatureError, match="Tweaked"):
        optimizer_settings(Tweaked(_params()))


# -- engine ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("adamw", torch.optim.AdamW),
        ("adam", torch.optim.Adam),
        ("sgd", torch.optim.SGD),
        ("memory_efficient_adam", MemoryEfficientAdam),
        ("adam8bit", Adam8bit),
    ],
)
def test_build_optimizer_for_every_name(name, cls) -> None:
    config = TrainingConfig(
        optimizer=name, learning_rate=0.02, weight_decay=0.03, betas=(0.7, 0.9), eps=1e-6
    )
    frozen = nn.Parameter(torch.zeros(2), requires_grad=False)
    optimizer = build_optimizer([*_params(), frozen], config)
    assert type(optimizer) is cls
    group = optimizer.param_groups[0]
    assert all(p is not frozen for p in group["params"]) and len(group["params"]) == 2
    assert group["lr"] == 0.02 and group["weight_decay"] == 0.03
    if name == "sgd":
        assert group["momentum"] == config.momentum
    else:
        assert tuple(group["betas"]) == (0.7, 0.9) and group["eps"] == 1e-6
    assert current_learning_rate(optimizer) == 0.02


def test_build_optimizer_needs_trainable_parameters() -> None:
    with pytest.raises(ValueError, match="no trainable parameters"):
        build_optimizer([nn.Parameter(torch.zeros(1), requires_grad=False)], TrainingConfig())
