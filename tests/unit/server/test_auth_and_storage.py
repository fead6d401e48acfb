"""API keys are random, hashed at rest and found by prefix; the artifact store writes atomically."""

from __future__ import annotations

from pathlib import Path

import pytest

from ace3.files import sha256_file
from ace3_control.storage import LocalArtifactStore
from ace3_server.auth import generate_key, hash_key, key_matches, parse_lookup_prefix


def test_a_new_key_is_stored_only_as_its_hash() -> None:
    key = generate_key()
    assert key.plaintext not in key.key_hash
    assert key.key_hash == hash_key(key.plaintext)
    assert parse_lookup_prefix(key.plaintext) == key.lookup_prefix
    assert key_matches(key.plaintext, key.key_hash)
    assert not key_matches(key.plaintext + "x", key.key_hash)
    assert generate_key().plaintext != key.plaintext


@pytest.mark.parametrize(
    "bad", ["", "Bearer", "ace3_short_x", "sk_0123456789ab_secret", "ace3_0123456789ab"]
)
def test_malformed_keys_have_no_lookup_prefix(bad: str) -> None:
    assert parse_lookup_prefix(bad) is None


def test_store_puts_files_atomically_and_refuses_escaping_keys(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    source = tmp_path / "src.bin"
    source.write_bytes(b"abc" * 1000)
    store.put_file("checkpoints/job/step-1.pt", source)
    stored = store.root / "checkpoints/job/step-1.pt"
    assert stored.read_bytes() == source.read_bytes()
    assert b"".join(store.iter_bytes("checkpoints/job/step-1.pt")) == source.read_bytes()
    assert sha256_file(stored) == sha256_file(source)
    assert not list(stored.parent.glob(".*")), "no temporary file is left behind"
    for key in ("../x", "/abs", "a//b", "a/./b", "", ".staging/x"):
        with pytest.raises(ValueError, match="invalid storage key"):
            store.exists(key)
    store.delete("checkpoints/job/step-1.pt")
    assert not store.exists("checkpoints/job/step-1.pt")
