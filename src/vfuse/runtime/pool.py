"""Output buffers reused across calls once nobody else holds them.

A fresh tensor above a few MiB comes from glibc mmap and page-faults on first touch every
call. The pool keeps the tensor it returned last time for each output and hands it out again
only when no other Python reference and no view of its storage remain, so what the user holds
is never overwritten; otherwise it allocates a new one. `static=True` always reuses.
"""

from __future__ import annotations

import sys

import torch

POOL_MIN_BYTES = 1 << 20  # below this malloc is cheap and recycling is not worth the checks


def _no_views(t: torch.Tensor) -> bool:
    # Storage users: this tensor and the temporary storage object made to ask.
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata) <= 2


class OutputPool:
    def __init__(self) -> None:
        self._last: dict[str, torch.Tensor] = {}

    def get(self, key: str, shape: tuple[int, ...], dtype: torch.dtype, static: bool = False) -> torch.Tensor:
        prev = self._last.get(key)
        # References to prev: the pool's dict, the local name and getrefcount's argument.
        if prev is not None and (static or (sys.getrefcount(prev) <= 3 and _no_views(prev))):
            return prev
        out = torch.empty(shape, dtype=dtype)
        if static or out.numel() * out.element_size() >= POOL_MIN_BYTES:
            self._last[key] = out
        return out
