"""Compile a flash-attention kernel (cached by source hash) and call it on torch tensors.

`FlashAttentionKernel(spec)` builds once; calling it passes the tensors' data pointers to
the C function through ctypes, so nothing is copied except to make q/k/v contiguous fp32.
"""

from __future__ import annotations

import ctypes
import math
import os
import tempfile
from pathlib import Path

import torch

from vfuse.codegen.cpp.attention.render import render_flash_attention
from vfuse.codegen.cpp.attention.spec import AttentionSpec, MaskKind
from vfuse.codegen.cpp.toolchain import Toolchain, find_toolchain, load_library

_I64, _F32, _PTR = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
# codegen.cpp.render's CONTRACT_FMA / CONTRACT_END (that module imports this package, so not from there).
_FMA_ON = '#pragma GCC push_options\n#pragma GCC optimize("fp-contract=fast")'
_FMA_END = "#pragma GCC pop_options"
_ARGTYPES = [_PTR] * 5 + [_I64] * 5 + [_F32] + [_I64] * 5


def default_cache_dir() -> Path:
    # One per user: the kernel cache refuses a directory another user owns (vfuse.cachedir).
    return Path(tempfile.gettempdir()) / f"vfuse-attention-{os.getuid()}"


class FlashAttentionKernel:
    """One compiled kernel: `kernel(q, k, v, mask=None, scale=None, threads=0) -> out`."""

    def __init__(self, spec: AttentionSpec, cache_dir: Path | None = None, toolchain: Toolchain | None = None):
        self.spec = spec
        # Built as a compiled graph builds it: FMA contraction on for the template (the toolchain's
        # -ffp-contract=off made its tiles mul + add, one accumulator spilled: 1.35x slower, 2026-12-02).
        self.source = f"{_FMA_ON}\n{render_flash_attention(spec)}\n{_FMA_END}\n"
        lib = load_library(self.source, cache_dir or default_cache_dir(), toolchain or find_toolchain())
        self._fn = getattr(lib, spec.name)
        self._fn.argtypes = _ARGTYPES
        self._fn.restype = None
        self._lib = lib  # keeps the library loaded while the kernel lives

    def workspace_bytes(self) -> int:
        """sizeof the compiled kernel's per-thread buffer (should equal spec.workspace_bytes())."""
        fn = getattr(self._lib, f"{self.spec.name}_workspace_bytes")
        fn.restype = ctypes.c_int64
        return int(fn())

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None = None,
        scale: float | None = None,
        threads: int = 0,
    ) -> torch.Tensor:
        """q [..., H, Lq, D], k/v [..., Hkv, Lk, D|Dv] (Hkv divides H; rank 2 is one head); mask broadcasts to
        [..., H, Lq, Lk]; scale None means 1/sqrt(D), like torch."""
        q4, k4, v4 = (_as_4d(t) for t in (q, k, v))
        b, h, lq, d = q4.shape
        hkv, lk = k4.shape[1], k4.shape[2]
        self._check(q4, k4, v4, mask)
        out = torch.empty(b, h, lq, self.spec.dv, dtype=torch.float32)
        m = _mask_view(mask, q.shape, lk)
        m_ptr, strides = (None, (0, 0, 0, 0)) if m is None else (m.data_ptr(), m.stride())
        scale = 1.0 / math.sqrt(d) if scale is None else scale
        self._fn(q4.data_ptr(), k4.data_ptr(), v4.data_ptr(), m_ptr, out.data_ptr(), b, h, hkv, lq, lk, scale,
                 *strides, threads)  # fmt: skip
        return out.reshape(*q.shape[:-1], self.spec.dv)

    def _check(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> None:
        s = self.spec
        if q.shape[-1] != s.head_dim or k.shape[-1] != s.head_dim or v.shape[-1] != s.dv:
            raise ValueError(f"kernel is for head sizes {s.head_dim}/{s.dv}, got {q.shape}, {k.shape}, {v.shape}")
        if k.shape[:3] != v.shape[:3] or q.shape[0] != k.shape[0] or q.shape[1] % k.shape[1]:
            raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not fit")
        want = {MaskKind.NONE: None, MaskKind.ADDITIVE: torch.float32, MaskKind.BOOL: torch.bool}[s.mask]
        if (mask is None) != (want is None) or (mask is not None and mask.dtype != want):
            raise ValueError(f"kernel expects mask {s.mask.name}, got {None if mask is None else mask.dtype}")


def _as_4d(t: torch.Tensor) -> torch.Tensor:
    """[..., H, L, D] as a contiguous fp32 [B, H, L, D] (leading dims flattened into B)."""
    if t.dtype != torch.float32 or t.dim() < 2:
        raise ValueError(f"expects fp32 tensors of rank >= 2, got {t.dtype} rank {t.dim()}")
    return _view_4d(t.contiguous())


def _view_4d(t: torch.Tensor) -> torch.Tensor:
    # Adding leading 1s is always a view; flattening several batch dims may copy.
    return t.reshape(1, 1, *t.shape) if t.dim() == 2 else t.reshape(-1, *t.shape[-3:])


def _mask_view(mask: torch.Tensor | None, q_shape: torch.Size, lk: int) -> torch.Tensor | None:
    """`mask` broadcast to [B, H, Lq, Lk]: a view with stride 0 on broadcast dims (a copy only
    when several leading batch dims must be flattened)."""
    if mask is None:
        return None
    return _view_4d(mask.expand(*q_shape[:-1], lk))
