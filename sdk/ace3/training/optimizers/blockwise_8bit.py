"""Blockwise 8-bit quantization with a dynamic (tree) code, for 8-bit optimizer state.

The idea of Dettmers et al., "8-bit Optimizers via Block-wise Quantization" (ICLR 2022): a
tensor is cut into blocks of ``block_size`` elements; each block is divided by its absolute
maximum (kept in float32) and every normalised value in [-1, 1] is stored as the uint8 index
of the nearest entry of a 256-entry code.

The code is *dynamic*: like a float with a variable split between exponent and fraction, it
spends its entries over seven decades (1e-6 .. 1) with the most entries in the top decade, so
small values keep their order of magnitude instead of collapsing to zero as with a linear code.
Decade ``d`` (0 = the smallest, values 1e-6 * (0.1, 1]) holds ``2**d`` evenly spaced values
per sign in the signed code, ``2**(d+1)`` in the unsigned one (no sign bit to pay for); plus 0
and 1. Signed codes hold Adam's first moment, unsigned codes its second.

Round-trip error is at most half the widest gap of the code times the block's absmax: about
0.0071 * absmax (signed) and 0.0036 * absmax (unsigned).

Built from plain torch operations, so it runs on any device; nothing here imports
bitsandbytes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

DECADES = 7
CODE_SIZE = 256
_codes: dict[tuple[bool, str], tuple[torch.Tensor, torch.Tensor]] = {}


def dynamic_code(signed: bool) -> torch.Tensor:
    """The 256 values of the dynamic code, sorted ascending (float32, on the CPU)."""
    values = [0.0, 1.0]
    for decade in range(DECADES):
        count = 2**decade if signed else 2 ** (decade + 1)
        edges = torch.linspace(0.1, 1.0, count + 1, dtype=torch.float64)
        centres = ((edges[:-1] + edges[1:]) / 2 * 10.0 ** (decade - DECADES + 1)).tolist()
        values += centres
        if signed:
            values += [-value for value in centres]
    if len(values) != CODE_SIZE:  # the construction above guarantees 256 entries
        raise AssertionError(f"dynamic code has {len(values)} entries, expected {CODE_SIZE}")
    return torch.tensor(sorted(values), dtype=torch.float32)


def _code_on(signed: bool, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(code, midpoints between neighbouring entries) on ``device``, built once per device."""
    key = (signed, str(device))
    if key not in _codes:
        code = dynamic_code(signed).to(device)
        _codes[key] = (code, (code[1:] + code[:-1]) / 2)
    return _codes[key]


def num_blocks(numel: int, block_size: int) -> int:
    return -(-numel // block_size)


def quantize_blockwise(
    values: torch.Tensor,
    block_size: int,
    *,
    signed: bool,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``values`` (any shape, read as float32) to ``(codes, absmax)``.

    ``codes`` is uint8 with ``values.numel()`` entries, ``absmax`` float32 with one entry per
    block. With ``out`` the results are written into those two tensors (the optimizer's state)
    instead of new ones. Unsigned codes never round a positive value down to zero: it becomes
    the smallest positive entry instead, so that a second moment never vanishes and Adam's
    step ``m / (sqrt(v) + eps)`` cannot blow up on quantization alone.
    """
    flat = values.detach().reshape(-1).float()
    numel = flat.numel()
    blocks = F.pad(flat, (0, num_blocks(numel, block_size) * block_size - numel))
    blocks = blocks.view(-1, block_size)
    absmax = blocks.abs().amax(dim=1)
    _, midpoints = _code_on(signed, flat.device)
    scaled = blocks / absmax.clamp_min(torch.finfo(torch.float32).tiny).unsqueeze(1)
    indices = torch.bucketize(scaled, midpoints, out_int32=True)
    if not signed:
        indices = torch.where(scaled > 0, indices.clamp_min(1), indices)
    codes = indices.reshape(-1)[:numel].to(torch.uint8)
    if out is None:
        return codes, absmax
    out[0].copy_(codes)
    out[1].copy_(absmax)
    return out


def dequantize_blockwise(
    codes: torch.Tensor, absmax: torch.Tensor, block_size: int, *, signed: bool
) -> torch.Tensor:
    """The float32 values (flat, ``codes.numel()`` entries) that ``codes`` and ``absmax`` hold."""
    code, _ = _code_on(signed, codes.device)
    numel = codes.numel()
    normalised = code[codes.reshape(-1).long()]
    blocks = F.pad(normalised, (0, absmax.numel() * block_size - numel)).view(-1, block_size)
    return (blocks * absmax.unsqueeze(1)).reshape(-1)[:numel]
