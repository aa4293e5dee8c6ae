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

from vfuse.schedule.donate import block_layout

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


BLOCK_KEY = "\0block"  # the ring of blocks of grouped outputs (`OutputPool.group`) among the slots


class OutputPool:
    def __init__(self) -> None:
        # Two slots per output: in `y = f(x)` in a loop the previous output is still held while
        # the next call runs, and freed right after, so the two alternate.
        self._slots: dict[str, list[_Slot]] = {}
        self._members: dict[str, tuple[int, tuple[int, ...], torch.dtype]] = {}  # grouped key -> offset, shape, dtype
        self._block_bytes = 0
        self._current: dict[str, torch.Tensor] | None = None  # the block members are handed out from
        self._handed: set[str] = set()  # members of `_current` handed out

    def group(self, members: Sequence[tuple[str, tuple[int, ...], torch.dtype]]) -> None:
        """Allocate these outputs (fixed shapes) in one block each call, at `block_layout`'s offsets:
        a training forward's donated saved activations, so that a gradient the backward stores
        after their last reads may span several adjacent ones (schedule/donate.py). The block is
        reused, as a slot is, only when nothing reaches any of its members."""
        offsets, size = block_layout([math.prod(s) * d.itemsize for _, s, d in members])
        self._members = {k: (o, tuple(s), d) for (k, s, d), o in zip(members, offsets, strict=True)}
        self._block_bytes = size
        self._slots.pop(BLOCK_KEY, None)
        self._current, self._handed = None, set()
        if len(self._members) > 1:
            self.take = self._take_grouped  # type: ignore[method-assign]

    def _block(self) -> dict[str, torch.Tensor]:
        """The member templates of an idle block (a new one where both held are in use)."""
        ring = self._slots.setdefault(BLOCK_KEY, [])
        for slot in ring:
            if is_idle(slot):
                return slot[4]  # type: ignore[return-value]
        with _normal_tensors():
            raw = torch.empty(self._block_bytes, dtype=torch.uint8)
            storage = raw.untyped_storage()
            views = {k: storage_view(storage, o, s, d) for k, (o, s, d) in self._members.items()}
        slot = (raw, storage, storage._cdata, raw.data_ptr(), views, _IDLE_USERS + len(views), torch.uint8)
        if len(ring) == 2:
            del ring[0]
        ring.append(slot)  # type: ignore[arg-type]
        return views

    def _take_grouped(
        self,
        wanted: Sequence[tuple[str, tuple[int, ...], torch.dtype]],
        static: bool,
        ptrs: Any = None,
        bind: Sequence[int] = (),
    ) -> list[torch.Tensor]:
        """`take` where some outputs are a block's members (`group`). A call may ask for them one
        by one (the general path): each member is handed out once per block, and asking for one
        again starts the next call's block."""
        members, out = self._members, []
        for n, (key, shape, dtype) in enumerate(wanted):
            m = members.get(key)
            if m is not None and m[1] == tuple(shape) and m[2] is dtype:
                if self._current is None or key in self._handed:
                    self._current, self._handed = self._block(), set()
                self._handed.add(key)
                t = self._current[key].data
            else:
                (t,) = OutputPool.take(self, [(key, shape, dtype)], static)
            out.append(t)
            if ptrs is not None:
                ptrs[bind[n]] = t.data_ptr()
        return out

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
    block: Sequence[tuple[str, int]] = (),
    block_bytes: int = 0,
) -> dict[str, torch.Tensor]:
    """Output value -> a tensor on its donor's storage at the planned byte offset
    (`schedule/donate.py`), for each donation the donor admits now: a contiguous tensor (`env`
    holds each input as the kernels read it) holding the bytes, whose storage no other input of the
    call shares (a forward that returned one tensor at two positions: its bytes are still read
    elsewhere). An offset past the donor's end (into the next donors of the forward's block) only
    where the whole block is as planned (`_block_storage`). The others take pool buffers."""
    on: dict[int, list[torch.Tensor]] = {}  # storage -> the inputs on it
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.numel():
            on.setdefault(x.untyped_storage().data_ptr(), []).append(x)
    whole = _block_storage(block, block_bytes, env, on) if block else None
    meta = {v: (shape, dtype) for v, shape, dtype in outputs}
    out: dict[str, torch.Tensor] = {}
    for v, x, offset in donated:
        donor, (shape, dtype) = env.get(x), meta[v]
        if not isinstance(donor, torch.Tensor) or not donor.is_contiguous():
            continue
        storage = donor.untyped_storage()
        start = donor.storage_offset() * donor.element_size() + offset
        if start % dtype.itemsize:
            continue
        if storage.data_ptr() != whole and (
            len(on.get(storage.data_ptr(), ())) > 1
            or offset + math.prod(shape) * dtype.itemsize > donor.numel() * donor.element_size()
        ):
            continue
        out[v] = storage_view(storage, start, shape, dtype)
    return out


def _block_storage(
    block: Sequence[tuple[str, int]], size: int, env: dict[str, Any], on: dict[int, list[torch.Tensor]]
) -> int | None:
    """The data pointer of the storage the donors share where it is the forward's block as planned
    (`OutputPool.group`): exactly `size` bytes, each donor contiguous at its offset, no other
    input of the call on it. Then every byte of it is a donor's or padding."""
    ptr = None
    for x, offset in block:
        t = env.get(x)
        if not isinstance(t, torch.Tensor) or not t.is_contiguous() or not t.numel():
            return None
        storage = t.untyped_storage()
        if t.storage_offset() * t.element_size() != offset or storage.nbytes() != size:
            return None
        if ptr is None:
            ptr = storage.data_ptr()
        elif storage.data_ptr() != ptr:
            return None
    return ptr if ptr is not None and len(on.get(ptr, ())) == len(block) else None


def storage_view(storage: torch.UntypedStorage, start: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A contiguous tensor of `shape` on `storage` from byte `start` (a multiple of the item size)."""
    with _normal_tensors():
        return torch.empty(0, dtype=dtype).set_(storage, start // dtype.itemsize, shape)
