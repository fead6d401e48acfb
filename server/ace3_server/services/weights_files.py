"""Uploaded model weights (``init_from``): a safetensors file, checked to hold tensors and
nothing else before it is stored (``ace3_control.safetensors_headers`` reads the format itself: the
server has no torch), so a file that passes holds no code and no object to unpickle."""

from __future__ import annotations

from pathlib import Path

from ace3_control.safetensors_headers import read_safetensors_shapes
from ace3_server.errors import field_error
from ace3_server.services.artifacts import PreparedArtifact, safe_display_name
from ace3_server.services.uploads import StagedUpload
from ace3_server.upload_checks import UploadCheckError

LOC: list[str | int] = ["body", "file"]


def prepare_weights(
    staged: StagedUpload, *, owner_id: str, filename: str | None
) -> PreparedArtifact:
    """The uploaded file as a stored-weights record; a 422 on ``file`` unless it is a
    well-formed ``.safetensors`` file."""
    display = safe_display_name(filename, "weights.safetensors")
    if Path(display).suffix.lower() != ".safetensors":
        raise field_error(
            LOC,
            f"{display}: upload model weights as a .safetensors file (the SDK converts a "
            "checkpoint .pt file for you: client.checkpoints.upload(path))",
        )
    try:
        tensors = len(read_safetensors_shapes(staged.path))
    except UploadCheckError as exc:
        raise field_error(LOC, f"{display}: {exc}") from None
    return PreparedArtifact(
        staged.path,
        f"weights/{owner_id}/{staged.sha256}/weights.safetensors",
        {
            "filename": display,
            "sha256": staged.sha256,
            "size_bytes": staged.size_bytes,
            "tensors": tensors,
        },
    )
