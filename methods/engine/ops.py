"""Small operations shared by the engine and the drafters: device sync, fp32 rotary frequencies, oneDNN linears."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (timing on a GPU); nothing to wait for on a CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fp32_rotary(module: torch.nn.Module) -> torch.nn.Module:
    """Give every rotary embedding in ``module`` fp32 frequencies again, recomputed from its config.

    ``module.half()`` (or ``.to(float16)``) casts the ``inv_freq`` buffers too; the rotary angle
    ``position * inv_freq`` is then off by about 0.24 rad at position 1000 with head_dim 128. transformers
    computes them in fp32 when it loads a model in any dtype; this restores that after a cast.
    """
    for m in module.modules():
        inv = getattr(m, "inv_freq", None)
        if isinstance(inv, torch.Tensor) and inv.dtype != torch.float32 and hasattr(m, "config"):
            fresh = type(m)(m.config)  # computed on the CPU in fp32
            for name, buffer in fresh.named_buffers(recurse=False):
                setattr(m, name, buffer.to(inv.device))
    return module


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Linear:
    """``x @ W.T + b``; on the CPU (fp32, bf16) with W pre-packed once for oneDNN (``can_pack``) when ``pack``
    (``use_packed`` switches between the two while ``choose_pack`` times them), for inputs of at least ``pack_from``
    rows (tokens): the packed kernel can lose on one token and win on many."""

    def __init__(self, layer: torch.nn.Linear, pack: bool):
        self.weight, self.bias = layer.weight, layer.bias
        self.packed = torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach()) if pack else None
        self.use_packed = pack
        self.pack_from = 1

    def unpack(self) -> None:
        """Plain weights from now on (the packed copy dropped)."""
        self.use_packed, self.packed = False, None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.use_packed or x.numel() < self.pack_from * x.shape[-1]:
            return F.linear(x, self.weight, self.bias)
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), self.packed, self.bias, "none", [], "")
        return y.view(*x.shape[:-1], y.shape[-1])


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """oneDNN can pack weights on this CPU: float32 anywhere, bfloat16 only where the CPU has the instructions
    (AVX-512 BW/VL/DQ or AVX-NE-CONVERT; an AVX2-only CPU has neither, and oneDNN refuses)."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    return dtype == torch.float32 or (dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported())
