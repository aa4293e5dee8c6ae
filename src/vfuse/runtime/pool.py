"""Output buffers reused across calls once nobody else holds them.

A fresh tensor above a few MiB comes from glibc mmap and page-faults on first touch every
call, and even a small one costs a `torch.empty` (about 1 us, several times the reuse check,
which matters to graphs whose whole call takes a few us). The pool keeps the tensor it
returned last time for each output and hands it out again only when no other Python
reference and no view of its storage remain, so what the user holds is never overwritten;
otherwise it allocates a new one. `static=True` always reuses.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import torch

_storage_users = torch._C._storage_Use_Count


class OutputPool:
    def __init__(self) -> None:
        self._last: dict[str, torch.Tensor] = {}

    def get(self, key: str, shape: tuple[int, ...], dtype: torch.dtype, static: bool = False) -> torch.Tensor:
        return self.take([(key, shape, dtype)], static)[0]

    def take(self, wanted: Sequence[tuple[str, tuple[int, ...], torch.dtype]], static: bool) -> list[torch.Tensor]:
        """A tensor for each (key, shape, dtype). The checks are written inline, not as helper
        calls: on the lean call path each extra frame per output is a measurable cost."""
        last, out = self._last, []
        for key, shape, dtype in wanted:
            prev = last.get(key)
            # References to prev: the pool's dict, the local name and getrefcount's argument;
            # storage users: prev and the temporary storage object made to ask.
            if prev is None or not (
                static or (sys.getrefcount(prev) <= 3 and _storage_users(prev.untyped_storage()._cdata) <= 2)
            ):
                prev = last[key] = torch.empty(shape, dtype=dtype)
            out.append(prev)
        return out
