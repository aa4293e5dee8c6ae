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

A pool shared by the executors of a symbolic program's sizes (runtime/symbolic.py) is asked for
one output at several shapes: a buffer large enough serves a smaller shape through a view made
once per shape (no fresh, page-faulting buffer for a new size; memory bounded by the largest
size, not by the sizes seen), and a larger shape replaces the buffer.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Sequence
from typing import Any

import torch

_storage_users = torch._C._storage_Use_Count
_getrefcount = sys.getrefcount

# A slot: (template, its Python storage object, the StorageImpl address, the data pointer, the
# template of each shape it serves (its own, views on the same storage), the storage use count
# when idle, the dtype). Torch keeps
# one Python object per storage alive as long as the storage lives, so a caller who keeps only
# `out.untyped_storage()` holds the pool's own object: its Python refcount, not the storage's
# use count, is what shows that. Each view template adds one to the use count.
_Slot = tuple[torch.Tensor, torch.UntypedStorage, int, int, dict[tuple[int, ...], torch.Tensor], int, torch.dtype]
MAX_VIEWS = 64  # shapes served from one buffer before its views are dropped and made again


def _normal_tensors() -> Any:
    # Templates are normal tensors even under inference mode: they outlive the mode, and an
    # inference tensor handed out later could not be used by autograd.
    return torch.inference_mode(False) if torch.is_inference_mode_enabled() else contextlib.nullcontext()


def _new_slot(shape: tuple[int, ...], dtype: torch.dtype) -> _Slot:
    with _normal_tensors():
        template = torch.empty(shape, dtype=dtype)
    storage = template.untyped_storage()
    return template, storage, storage._cdata, template.data_ptr(), {tuple(shape): template}, _IDLE_USERS, dtype


def _idle_counts() -> tuple[int, int]:
    """(Python refcount of the storage object, storage use count) of a slot nobody else holds,
    measured with the same expressions `take` evaluates (they depend on torch's internals)."""
    template = torch.empty((1,), dtype=torch.float32)
    slot = (template, template.untyped_storage(), template.untyped_storage()._cdata)  # as `_new_slot`'s
    return _getrefcount(slot[1]), _storage_users(slot[2])


_IDLE_REFS, _IDLE_USERS = _idle_counts()


def is_idle(slot: _Slot) -> bool:
    """Whether no tensor, view or storage object but the pool's own reaches the slot's storage
    (what `take` checks before reusing it): its bytes are the pool's alone."""
    return _getrefcount(slot[1]) == _IDLE_REFS and _storage_users(slot[2]) == slot[5]


def _view_slot(slot: _Slot, shape: tuple[int, ...], dtype: torch.dtype) -> _Slot | None:
    """`slot` also serving `shape` (a view template on its storage), or None where it holds
    fewer elements."""
    template = slot[0]
    numel = math.prod(shape)
    if numel > template.numel():
        return None
    views = slot[4] if len(slot[4]) < MAX_VIEWS else {tuple(template.shape): template}
    with _normal_tensors():
        views[shape] = template.view(-1)[:numel].view(shape)
    return (*slot[:4], views, _IDLE_USERS + len(views) - 1, slot[6])


class OutputPool:
    def __init__(self) -> None:
        # Two slots per output: in `y = f(x)` in a loop the previous output is still held while
        # the next call runs, and freed right after, so the two alternate.
        self._slots: dict[str, list[_Slot]] = {}

    def get(self, key: str, shape: tuple[int, ...], dtype: torch.dtype, static: bool = False) -> torch.Tensor:
        return self.take([(key, shape, dtype)], static)[0]

    def take(
        self,
        wanted: Sequence[tuple[str, tuple[int, ...], torch.dtype]],
        static: bool,
        ptrs: Any = None,
        bind: Sequence[int] = (),
    ) -> list[torch.Tensor]:
        """A fresh tensor for each (key, shape, dtype). The checks are written inline, not as
        helper calls: on the lean call path each extra frame per output is a measurable cost.
        With `ptrs` (a ctypes pointer table), output n's data pointer is stored at `bind[n]`
        too (the slot knows it: no `data_ptr()` call and no second loop per call)."""
        slots, out = self._slots, []
        for n, (key, shape, dtype) in enumerate(wanted):
            ring = slots.get(key)
            if ring is None:
                ring = slots[key] = []
            small = False  # an idle slot too small for this shape was passed over
            for slot in ring:
                idle = static or (_getrefcount(slot[1]) == _IDLE_REFS and _storage_users(slot[2]) == slot[5])
                if idle and slot[6] is dtype and slot[0].data_ptr() == slot[3]:
                    template = slot[4].get(shape)
                    if template is not None:
                        if small:  # first next time: a symbolic program's steady size skips the small one
                            ring.reverse()
                        break
                    viewed = _view_slot(slot, shape, dtype)
                    if viewed is not None:
                        # By identity: `list.index` would compare the tensors in the tuples.
                        ring[[s is slot for s in ring].index(True)], template = viewed, viewed[4][shape]
                        break
                    small = True
            else:
                slot = _new_slot(shape, dtype)
                if len(ring) == 2:
                    del ring[0]
                ring.append(slot)
                template = slot[0]
            # `.data`: a new tensor on the template's storage with its sizes, strides, own
            # version counter and no autograd history (cheaper than `detach()`).
            out.append(template.data)
            if ptrs is not None:
                ptrs[bind[n]] = slot[3]  # a view template starts where its slot's storage does
        return out


def donated_views(
    donated: Sequence[tuple[str, str, int]],
    outputs: Sequence[tuple[str, tuple[int, ...], torch.dtype]],
    env: dict[str, Any],
    inputs: Sequence[Any],
) -> dict[str, torch.Tensor]:
    """Output value -> a tensor on its donor's storage at the planned byte offset
    (`schedule/donate.py`), for each donation the donor admits now: a contiguous tensor (`env`
    holds each input as the kernels read it) holding the bytes, whose storage no other input of
    the call shares (a forward that returned one tensor at two positions: its bytes are still
    read elsewhere). The others take pool buffers as usual."""
    seen: dict[int, int] = {}
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.numel():
            p = x.untyped_storage().data_ptr()
            seen[p] = seen.get(p, 0) + 1
    meta = {v: (shape, dtype) for v, shape, dtype in outputs}
    out: dict[str, torch.Tensor] = {}
    for v, x, offset in donated:
        donor, (shape, dtype) = env.get(x), meta[v]
        if not isinstance(donor, torch.Tensor) or not donor.is_contiguous():
            continue
        storage = donor.untyped_storage()
        if seen.get(storage.data_ptr(), 0) > 1:
            continue
        start = donor.storage_offset() * donor.element_size() + offset
        if start % dtype.itemsize or offset + math.prod(shape) * dtype.itemsize > donor.numel() * donor.element_size():
            continue
        out[v] = storage_view(storage, start, shape, dtype)
    return out


def storage_view(storage: torch.UntypedStorage, start: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A contiguous tensor of `shape` on `storage` from byte `start` (a multiple of the item size)."""
    with _normal_tensors():
        return torch.empty(0, dtype=dtype).set_(storage, start // dtype.itemsize, shape)
