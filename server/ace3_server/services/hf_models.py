"""Hugging Face model directories uploaded as models (``POST /v1/models`` with
``kind=huggingface``): the archive is extracted, checked (``ace3_control.hf_model_dir``) and stored
as a tree exactly like a package (kind ``"huggingface"``, no entry module, factory
``"from_pretrained"``), so a job fetches it as it fetches a package and builds it in its sandbox
with ``from_pretrained``."""

from __future__ import annotations

import shutil
from pathlib import Path

from ace3_control.hf_model_dir import (
    CONFIG,
    FROM_PRETRAINED,
    HUGGINGFACE,
    VARIANT,
    check_hf_model,
    is_hf_model_dir,
    stored_tree_key,
)
from ace3_control.storage import tree_digest
from ace3_server.archives import DEFAULT_MAX_MEMBERS, is_archive_name
from ace3_server.errors import field_error
from ace3_server.services.artifacts import (
    PreparedArtifact,
    extract_staged,
    refuse,
    safe_display_name,
    stored_fields,
)
from ace3_server.services.uploads import StagedUpload
from ace3_server.upload_checks import UploadCheckError

# The form's default factory, or the one this kind records: anything else is a mistake.
ACCEPTED_FACTORIES = ("build_model", FROM_PRETRAINED)


def prepare_hf_model(
    staged: StagedUpload,
    *,
    owner_id: str,
    filename: str | None,
    factory: str,
    entry_module: str | None,
    staging_dir: Path,
    max_extracted_bytes: int,
    max_archive_members: int = DEFAULT_MAX_MEMBERS,
) -> PreparedArtifact:
    """The uploaded archive of a model directory as a model record; a 422 naming the file and
    what is wrong (nothing is stored) unless it is one ``from_pretrained`` loads safely."""
    display = safe_display_name(filename, "model.tar.gz")
    if entry_module:
        raise field_error(
            ["body", "entry_module"],
            "a Hugging Face model directory has no entry module: leave entry_module out",
        )
    if factory not in ACCEPTED_FACTORIES:
        raise field_error(
            ["body", "factory"],
            f"a Hugging Face model is built with {FROM_PRETRAINED}: leave factory out",
        )
    if not is_archive_name(display):
        raise field_error(
            ["body", "file"], f"{display}: upload the model directory as a .tar.gz, .tar or .zip"
        )
    tree = extract_staged(staged, display, staging_dir, max_extracted_bytes, max_archive_members)
    try:
        if not is_hf_model_dir(tree):
            raise UploadCheckError(
                f"no {CONFIG} at the top of the archive (pack the model directory's contents, "
                "not the directory itself)"
            )
        model = check_hf_model(tree)
    except UploadCheckError as exc:
        shutil.rmtree(tree, ignore_errors=True)
        raise refuse(exc, f"{display}: ") from None
    fields = {
        "kind": HUGGINGFACE,
        "entry_module": None,
        "variant": VARIANT,
        "requirements": None,
        "tree_sha256": tree_digest(tree),
        "forward_signature": None,
        "architectures": model.architectures,
        "parameter_count": model.parameter_count,
        "module_names": model.module_names,
        "hf_config": model.summary(),
    }
    key = stored_tree_key(owner_id, staged.sha256)
    return PreparedArtifact(tree, key, fields | stored_fields(display, FROM_PRETRAINED, staged))
