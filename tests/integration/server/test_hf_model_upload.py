"""A Hugging Face model directory uploaded through the SDK (issue 29, point 1), on the real API
with a database of its own (no worker): ``client.load_model(dir)`` stores it as kind
"huggingface" with what its config.json and safetensors headers say, and a directory with
pickled weights only is refused with the conversion hint, nothing stored."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ace3
from ace3.client._packing import pack_hf_model
from ace3.errors import APIStatusError
from tests.integration.server.in_process_api import serve_one_owner

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def client(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ace3.Client]:
    data_dir = Path(tmp_path_factory.mktemp("hf-models"))
    with (
        serve_one_owner(redis_url, data_dir, "hf-models") as (base, key),
        ace3.Client(api_key=key, base_url=base) as sdk,
    ):
        yield sdk


@pytest.fixture(scope="module")
def gpt2() -> Any:
    config = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=2, n_head=2)
    return transformers.GPT2LMHeadModel(config)


def test_a_saved_gpt2_directory_is_a_huggingface_model(
    client: ace3.Client, gpt2: Any, tmp_path: Path
) -> None:
    gpt2.save_pretrained(tmp_path, safe_serialization=True)
    (tmp_path / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    ref = client.load_model(tmp_path)
    assert ref.uploaded
    model = client.models.retrieve(ref.id)
    assert (model.kind, model.entry_module, model.factory) == (
        "huggingface",
        None,
        "from_pretrained",
    )
    assert model.architectures == ["GPT2LMHeadModel"]
    # GPT-2 ties lm_head to wte: saved once, counted once by parameters()
    assert model.parameter_count == sum(p.numel() for p in gpt2.parameters())
    assert model.module_names is not None and "transformer.h.0.attn.c_attn" in model.module_names
    assert model.hf_config == {
        "model_type": "gpt2",
        "max_position_embeddings": None,
        "has_tokenizer": False,
        "has_chat_template": True,
    }
    # the same directory again is the same model, not a second upload
    again = client.load_model(tmp_path)
    assert (again.id, again.uploaded) == (ref.id, False)
    # and an archive of the directory works too
    archive = tmp_path.parent / f"{tmp_path.name}-model.tar.gz"
    pack_hf_model(tmp_path, archive)
    assert client.load_model(archive).id == ref.id
    # and so does the hub cache's layout (every file a link into ../../blobs/), the same bytes
    cache = tmp_path.parent / f"{tmp_path.name}-cache"
    snapshot = cache / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (cache / "blobs").mkdir()
    for path in sorted(tmp_path.iterdir()):
        path.rename(cache / "blobs" / path.name)
        (snapshot / path.name).symlink_to(f"../../blobs/{path.name}")
    assert (snapshot / "config.json").is_symlink()
    assert (client.load_model(snapshot).id, client.load_model(snapshot).uploaded) == (ref.id, False)


def test_pickled_weights_alone_are_refused_and_nothing_is_stored(
    client: ace3.Client, gpt2: Any, tmp_path: Path
) -> None:
    gpt2.config.save_pretrained(tmp_path)  # (transformers 5 writes safetensors only)
    torch.save(gpt2.state_dict(), tmp_path / "pytorch_model.bin")
    before = {model.id for model in client.models.list(limit=200)}
    with pytest.raises(APIStatusError) as caught:
        client.load_model(tmp_path)
    message = str(caught.value)
    assert "pytorch_model.bin: pickled weights are refused" in message
    assert (
        "AutoModelForCausalLM.from_pretrained(dir).save_pretrained(dir, safe_serialization=True)"
        in message
    )
    assert caught.value.status_code == 422
    assert {model.id for model in client.models.list(limit=200)} == before
