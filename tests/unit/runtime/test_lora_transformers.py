"""LoRA on ``transformers`` models built from a config (nothing downloaded): GPT-2's ``Conv1D``
layers (``c_attn``, ``c_proj``, ``c_fc``) are adapted, trained and merged back exactly;
``target_modules="all-linear"`` takes every Linear and Conv1D but the output layer; every run
reports its trainable and total parameters; a model that returns no loss is told what it was
given and what is missing."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pydantic
import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

import ace3
from ace3.runtime.in_process import train_in_process
from ace3.runtime.loop.losses import forward_loss
from ace3.runtime.loop.precision import resolve_precision
from ace3.runtime.techniques.lora import apply_lora, select_targets
from ace3.runtime.techniques.lora_merge import merged_state_dict

pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

VOCAB, LENGTH = 64, 12


def _gpt2(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=32, n_embd=16, n_layer=2, n_head=2, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


def _llama() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


class Tokens(Dataset[dict[str, torch.Tensor]]):
    """Windows of a repeating token pattern, as the ``tokens`` format gives them."""

    def __init__(self, count: int = 32) -> None:
        stream = torch.arange(count * LENGTH + 1) % 7
        self.windows = [stream[i * LENGTH : i * LENGTH + LENGTH + 1] for i in range(count)]

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        window = self.windows[index]
        return {"input_ids": window[:-1], "labels": window[:-1].clone()}


PROBE = torch.arange(LENGTH).unsqueeze(0) % 7


def _names(model: nn.Module, kind: str) -> set[str]:
    return {name for name, module in model.named_modules() if type(module).__name__ == kind}


def test_gpt2_conv1d_layers_are_adapted_by_name() -> None:
    model = _gpt2()
    assert select_targets(model, ["c_attn"]) == ["transformer.h.0.attn.c_attn", "transformer.h.1.attn.c_attn"]  # fmt: skip
    assert set(select_targets(model, ["c_attn", "c_proj", "c_fc"])) == _names(model, "Conv1D")


def test_all_linear_takes_every_linear_and_conv1d_but_the_output_layer() -> None:
    gpt2 = _gpt2()
    assert set(select_targets(gpt2, "all-linear")) == _names(gpt2, "Conv1D")  # lm_head left out
    llama = _llama()
    assert set(select_targets(llama, "all-linear")) == _names(llama, "Linear") - {"lm_head"}
    mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    assert select_targets(mlp, "all-linear") == ["0", "2"]  # the last Linear is the output

    class Encoder(nn.Sequential):  # a model whose get_output_embeddings() says it has none
        def get_output_embeddings(self) -> None:
            return None

    assert select_targets(Encoder(nn.Linear(4, 8), nn.Linear(8, 2)), "all-linear") == ["0", "1"]
    with pytest.raises(ValueError, match=r"'all-linear' finds no nn.Linear or Conv1D .* besides"):
        select_targets(nn.Sequential(nn.Linear(4, 2)), "all-linear")


@pytest.mark.parametrize(
    ("targets", "tied", "to"),
    [(["lm_head"], "lm_head", "transformer.wte"), (["wte", "c_fc"], "transformer.wte", "lm_head")],
)
def test_a_tied_weight_is_refused_as_a_target(targets: list[str], tied: str, to: str) -> None:
    # GPT-2 ties lm_head to wte: a merged update would land in both, and loading the exported
    # model (tie_word_embeddings) would tie them again and lose it.
    config = ace3.TrainingConfig(lora=ace3.LoRAConfig(r=2, lora_alpha=4, target_modules=targets))
    reason = f"lora.target_modules: '{tied}' shares its weight with '{to}' (tied weights"
    with pytest.raises(ValueError, match=re.escape(reason)):
        apply_lora(_gpt2(), config)


def test_all_linear_leaves_a_tied_layer_out_even_when_it_is_not_the_output() -> None:
    gpt2 = _gpt2()
    gpt2.get_output_embeddings = lambda: None  # as peft's wrapper says: no output layer known
    assert set(select_targets(gpt2, "all-linear")) == _names(gpt2, "Conv1D")  # lm_head left out
    mlp = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    mlp[2].weight = mlp[0].weight  # tied hidden layers, neither the output
    with pytest.raises(ValueError, match=r"'all-linear' finds no nn.Linear or Conv1D"):
        select_targets(mlp, "all-linear")
    mlp[2].weight = nn.Parameter(torch.zeros(4, 4))
    assert select_targets(mlp, "all-linear") == ["0", "2"]


def test_a_target_that_matches_nothing_names_a_few_layers_not_every_module() -> None:
    with pytest.raises(ValueError) as refused:
        select_targets(_llama(), ["q_proj", "attn"])
    message = str(refused.value)
    assert "'attn' matches no module of the model" in message
    assert "layers it could adapt: model.embed_tokens, model.layers.0.self_attn.q_proj" in message
    assert "... (" in message and "(or 'all-linear')" in message and len(message) < 500


def test_lora_on_gpt2_trains_the_adapters_and_merges_back_exactly(tmp_path: Path) -> None:
    model = _gpt2()
    base = {name: value.clone() for name, value in model.state_dict().items()}
    config = ace3.TrainingConfig(
        batch_size=8, max_steps=6, validation_split=0.0, learning_rate=0.05, seed=0,
        lora=ace3.LoRAConfig(r=4, lora_alpha=8, target_modules=["c_attn", "c_fc"]),
    )  # fmt: skip
    run = train_in_process(config, model, Tokens(), checkpoint_dir=tmp_path / "ckpt")
    conv1d = [m for m in _gpt2().modules() if type(m).__name__ == "Conv1D"]
    adapted = [m for m in conv1d if m.weight.shape[1] in (48, 64)]  # c_attn 16->48, c_fc 16->64
    expected = sum(4 * (m.weight.shape[0] + m.weight.shape[1]) for m in adapted)
    assert run.final_metrics["trainable_parameters"] == expected
    assert (
        run.final_metrics["total_parameters"]
        == sum(p.numel() for p in model.parameters()) + expected
    )
    # the caller's module has its own layers back, the adapters merged into c_attn and c_fc only
    changed = {
        name for name, value in model.state_dict().items() if not torch.equal(value, base[name])
    }
    assert changed == {f"transformer.h.{i}.{layer}.weight" for i in (0, 1) for layer in ("attn.c_attn", "mlp.c_fc")}  # fmt: skip


def test_the_merged_gpt2_state_computes_what_base_and_adapters_compute() -> None:
    config = ace3.TrainingConfig(
        lora=ace3.LoRAConfig(r=2, lora_alpha=4, target_modules="all-linear")
    )
    model = _gpt2().eval()
    adapters = apply_lora(model, config)
    assert adapters is not None
    with torch.no_grad():  # adapters as if trained (B starts at zero)
        for name, param in model.named_parameters():
            if ".lora_" in name:
                param.add_(torch.randn_like(param) * 0.2)
        expected = model(PROBE).logits
    precision = resolve_precision(config, torch.device("cpu"))
    precision.prepare_model(model)
    plain = _gpt2(seed=1).eval()  # other weights, then the merged ones
    plain.load_state_dict(merged_state_dict(adapters, precision))
    with torch.no_grad():
        torch.testing.assert_close(plain(PROBE).logits, expected, rtol=1e-4, atol=1e-5)


def test_full_fine_tuning_reports_its_parameter_counts(tmp_path: Path) -> None:
    model = _gpt2()
    config = ace3.TrainingConfig(
        batch_size=8, max_steps=1, validation_split=0.0, freeze=["transformer.wte"]
    )
    run = train_in_process(config, model, Tokens(8), checkpoint_dir=tmp_path / "ckpt")
    total = sum(p.numel() for p in model.parameters())  # lm_head is tied to wte: counted once
    assert run.final_metrics["total_parameters"] == total
    assert run.final_metrics["trainable_parameters"] == total - VOCAB * 16


def test_a_model_that_returns_no_loss_is_told_what_it_got_and_what_is_missing() -> None:
    model = _gpt2()
    ids = PROBE.repeat(2, 1)
    with pytest.raises(ValueError) as no_labels:
        forward_loss(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, None)
    assert str(no_labels.value) == (
        "a dict batch is passed as model(**batch), with the fields 'input_ids', "
        "'attention_mask', and the model returned CausalLMOutputWithCrossAttentions with loss "
        "None; the batch has no 'labels', which a Hugging Face model needs to compute its loss "
        "(name the targets 'labels'); otherwise define compute_loss(model, batch) in the model "
        "file"
    )
    with pytest.raises(ValueError, match=r"passed as model\(inputs\), and the model returned "
                       r"CausalLMOutputWithCrossAttentions with no loss: .* only when given labels"):  # fmt: skip
        forward_loss(model, (ids, ids), None)
    loss = forward_loss(model, {"input_ids": ids, "labels": ids}, None).loss
    assert loss.ndim == 0 and torch.isfinite(loss)


@pytest.mark.parametrize("value", ["c_attn", "all_linear", ""])
def test_one_name_as_a_string_is_refused_with_the_list_spelling(value: str) -> None:
    with pytest.raises(pydantic.ValidationError, match="a list of module names or patterns, or 'all-linear'"):  # fmt: skip
        ace3.LoRAConfig(target_modules=value)


def test_all_linear_round_trips_through_the_config_json() -> None:
    config = ace3.TrainingConfig(lora=ace3.LoRAConfig(target_modules="all-linear"))
    again: Any = ace3.TrainingConfig.model_validate_json(config.model_dump_json())
    assert again.lora.target_modules == "all-linear"


def test_lora_with_gradient_checkpointing_trains_the_adapters(tmp_path: Path) -> None:
    """Non-reentrant checkpointing: the reentrant kind gives adapters behind frozen layers no
    gradients."""
    model = _gpt2()
    config = ace3.TrainingConfig(
        batch_size=8, max_steps=2, validation_split=0.0, learning_rate=0.05,
        gradient_checkpointing=True, lora=ace3.LoRAConfig(r=4, target_modules=["c_attn"]),
    )  # fmt: skip
    base = {name: value.clone() for name, value in model.state_dict().items()}
    train_in_process(config, model, Tokens(16), checkpoint_dir=tmp_path / "ckpt")
    assert model.is_activation_checkpointing
    changed = {
        name for name, value in model.state_dict().items() if not torch.equal(value, base[name])
    }
    assert changed == {f"transformer.h.{i}.attn.c_attn.weight" for i in (0, 1)}


def test_llama_lora_with_bf16_autocast_and_gradient_checkpointing(tmp_path: Path) -> None:
    """Seed 004's recipe on a Llama: every linear layer adapted, bf16 autocast, checkpointed
    activations; the adapters train, the merged layers are the adapted ones, the loss is
    finite."""
    model = _llama()
    config = ace3.TrainingConfig(
        batch_size=8, max_steps=3, validation_split=0.0, learning_rate=0.05, seed=0,
        mixed_precision=True, amp_dtype="bfloat16", gradient_checkpointing=True,
        lora=ace3.LoRAConfig(r=4, lora_alpha=8, target_modules="all-linear"),
    )  # fmt: skip
    base = {name: value.clone() for name, value in model.state_dict().items()}
    run = train_in_process(config, model, Tokens(24), checkpoint_dir=tmp_path / "ckpt")
    assert torch.isfinite(torch.tensor(run.final_metrics["train_loss"]))
    changed = {
        name.rsplit(".", 2)[-2]
        for name, value in model.state_dict().items()
        if not torch.equal(value, base[name])
    }
    assert changed == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert all(value.dtype == torch.float32 for value in model.state_dict().values())
