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

    @classmethod
    def fused(cls, layers: list[torch.nn.Linear], pack: bool) -> "Linear":
        """One linear for several that read the same input (q, k, v; gate, up), their outputs side by side: one
        weight read and one kernel call where there were several (as serving engines merge them). The layers'
        weights (and biases) become views of the fused one, so the model holds them once and its own forward is
        unchanged; a model fused before (another engine over it) is fused again in place, no copy."""
        fused = torch.nn.Linear(layers[0].in_features, sum(m.out_features for m in layers),
                                bias=layers[0].bias is not None, device="meta")
        for name in ("weight", "bias") if fused.bias is not None else ("weight",):
            parts = [getattr(m, name) for m in layers]
            whole = _joined(parts)
            if whole is None:
                with torch.no_grad():
                    whole = torch.cat([p.detach() for p in parts])
                start = 0
                for p in parts:
                    p.data = whole[start:start + p.shape[0]]
                    start += p.shape[0]
                parts[0].fused_into = whole  # for the next engine over this model
            setattr(fused, name, torch.nn.Parameter(whole, requires_grad=False))
        return cls(fused, pack)

    def unpack(self) -> None:
        """Plain weights from now on (the packed copy dropped)."""
        self.use_packed, self.packed = False, None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.use_packed or x.numel() < self.pack_from * x.shape[-1]:
            return F.linear(x, self.weight, self.bias)
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), self.packed, self.bias, "none", [], "")
        return y.view(*x.shape[:-1], y.shape[-1])


def _joined(parts: list[torch.Tensor]) -> torch.Tensor | None:
    """The tensor a fusion made before holds ``parts`` in (consecutive row blocks, still in place), or None."""
    whole = getattr(parts[0], "fused_into", None)
    if whole is None:
        return None
    start = 0
    for p in parts:
        if p.shape[1:] != whole.shape[1:] or p.data_ptr() != whole[start].data_ptr():
            return None
        start += p.shape[0]
    return whole if start == whole.shape[0] else None


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """oneDNN can pack weights on this CPU: float32 anywhere, bfloat16 only where the CPU has the instructions
    (AVX-512 BW/VL/DQ or AVX-NE-CONVERT; an AVX2-only CPU has neither, and oneDNN refuses)."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    return dtype == torch.float32 or (dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported())
