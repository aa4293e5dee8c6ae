"""Output buffers reused across calls once nobody else can reach them.

A fresh tensor above a few MiB comes from glibc mmap and page-faults on first touch every
call, and even a small one costs a `torch.empty` (a few us, more than a whole small graph's
kernels). The pool keeps, per output, a private template tensor that is never handed out and
returns a *fresh* tensor object on its storage each call (`template.detach()`, several times
cheaper than `torch.empty`): what a caller did to an earlier output (`t_()`, `resize_()`,
`requires_grad_()`) cannot leak into the next one. The storage is reused only when no tensor,
view or Python storage object other than the pool's own can reach it, and only while it still
has the bytes it had (a caller may have resized it); otherwise a new template is allocated.
`static=True` reuses the storage regardless (documented: the next call overwrites).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import torch

_storage_users = torch._C._storage_Use_Count
_getrefcount = sys.getrefcount

# A slot: (template, its Python storage object, the StorageImpl address, the data pointer).
# Torch keeps one Python object per storage alive as long as the storage lives, so a caller
# who keeps only `out.untyped_storage()` holds the pool's own object: its Python refcount,
# not the storage's use count, is what shows that.
_Slot = tuple[torch.Tensor, torch.UntypedStorage, int, int]


def _new_slot(shape: tuple[int, ...], dtype: torch.dtype) -> _Slot:
    # The template is a normal tensor even under inference mode: it outlives the mode, and an
    # inference tensor handed out later could not be used by autograd.
    if torch.is_inference_mode_enabled():
        with torch.inference_mode(False):
            template = torch.empty(shape, dtype=dtype)
    else:
        template = torch.empty(shape, dtype=dtype)
    storage = template.untyped_storage()
    return template, storage, storage._cdata, template.data_ptr()


def _idle_counts() -> tuple[int, int]:
    """(Python refcount of the storage object, storage use count) of a slot nobody else holds,
    measured with the same expressions `take` evaluates (they depend on torch's internals)."""
    slot = _new_slot((1,), torch.float32)
    return _getrefcount(slot[1]), _storage_users(slot[2])


_IDLE_REFS, _IDLE_USERS = _idle_counts()


def is_idle(slot: _Slot) -> bool:
    """Whether no tensor, view or storage object but the pool's own reaches the slot's storage
    (what `take` checks before reusing it): its bytes are the pool's alone."""
    return _getrefcount(slot[1]) == _IDLE_REFS and _storage_users(slot[2]) == _IDLE_USERS


class OutputPool:
    def __init__(self) -> None:
        # Two slots per output: in `y = f(x)` in a loop the previous output is still held while
        # the next call runs, and freed right after, so the two alternate.
        self._slots: dict[str, list[_Slot]] = {}

    def get(self, key: str, shape: tuple[int, ...], dtype: torch.dtype, static: bool = False) -> torch.Tensor:
        return self.take([(key, shape, dtype)], static)[0]

    def take(self, wanted: Sequence[tuple[str, tuple[int, ...], torch.dtype]], static: bool) -> list[torch.Tensor]:
        """A fresh tensor for each (key, shape, dtype). The checks are written inline, not as
        helper calls: on the lean call path each extra frame per output is a measurable cost."""
        slots, out = self._slots, []
        for key, shape, dtype in wanted:
            ring = slots.get(key)
            if ring is None:
                ring = slots[key] = []
            for slot in ring:
                if (
                    static or (_getrefcount(slot[1]) == _IDLE_REFS and _storage_users(slot[2]) == _IDLE_USERS)
                ) and slot[0].data_ptr() == slot[3]:
                    break
            else:
                slot = _new_slot(shape, dtype)
                if len(ring) == 2:
                    del ring[0]
                ring.append(slot)
            # `.data`: a new tensor on the template's storage with its sizes, strides, own
            # version counter and no autograd history (cheaper than `detach()`).
            out.append(slot[0].data)
        return out
