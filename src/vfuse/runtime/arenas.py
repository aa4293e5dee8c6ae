"""ArenaLender: one arena lent in turn to graphs that never run at the same time.

A training step runs its forward, backward and optimizer graphs one after the other, and a model
split by graph breaks runs its graphs in sequence too: each keeping its own arena holds the sum of
their intermediates between steps where the largest would do. Executors given a lender
(`NativeExecutor.share_arenas`) take an arena for each call and give it back when the call
returns; calls that do overlap (threads, a graph called from inside another's torch step) find
no free arena and get one of their own. A graph keeps its own arena when its prepacked operands
live in it (they persist between calls) or when it is small (not worth a lend per call).

Between calls an arena holds nothing, so one of at most `release_max` bytes is freed when it is
given back and allocated again by the next `take`, as Inductor allocates its buffers per call:
the loss, the optimizer and the user's code between calls can use that memory (a training
step's peak drops by the arena, docs/training.md). Below glibc's mmap ceiling (32 MiB on 64-bit
Linux) a freed block stays in the heap and the next allocation of that size reuses its pages
(~1-10 us, no page faults); a larger one is unmapped on free and faults in again on every call
(40 MiB: ~30 ms measured), so larger arenas are held and lent again, each grown to the largest
need seen.
"""

from __future__ import annotations

import threading

import torch

# Arenas below this stay the executor's own: a lend costs ~1 us per call and saves little.
LEND_MIN_BYTES = 64 * 1024
# Arenas up to this size are freed between calls (see above); larger ones are held.
RELEASE_MAX_BYTES = 32 << 20


def _bytes(arena: torch.Tensor) -> int:
    """Bytes really there: a released arena keeps its shape but has no storage."""
    return arena.untyped_storage().nbytes()


class ArenaLender:
    """`take(nbytes)` before a call, `give(arena)` after it. Held arenas (over `release_max`
    bytes) wait in a free list, largest last; smaller ones are freed on `give`: the borrower's
    reference then has no storage, and the next `take` returns a new tensor, which every
    borrower binds before its call (`NativeExecutor.bind_arena` rebinds on a new object)."""

    def __init__(self, release_max: int = RELEASE_MAX_BYTES) -> None:
        self.release_max = release_max
        self._free: list[torch.Tensor] = []
        self._lock = threading.Lock()
        self.allocated = 0  # arenas allocated to be held (grown or for overlapping calls)
        self.released = 0  # arenas freed on return (allocated again by the next take)

    def take(self, nbytes: int) -> torch.Tensor:
        """A free held arena of at least `nbytes` bytes (uint8), else a new one: a free one too
        small is dropped (executors bound to it release it on their next call)."""
        with self._lock:
            if self._free:
                arena = self._free.pop()
                if _bytes(arena) >= nbytes:
                    return arena
            if nbytes > self.release_max:
                self.allocated += 1
        return torch.empty(nbytes, dtype=torch.uint8)

    def give(self, arena: torch.Tensor) -> None:
        size = _bytes(arena)
        if size <= self.release_max:
            if size:
                arena.untyped_storage().resize_(0)  # freed now, not when the borrower lets go
                with self._lock:
                    self.released += 1
            return
        with self._lock:
            self._free.append(arena)
            if len(self._free) > 1:  # the largest is lent first
                self._free.sort(key=_bytes)

    def nbytes(self) -> int:
        """Bytes of the arenas free now (those lent out are counted by their borrowers)."""
        with self._lock:
            return sum(_bytes(a) for a in self._free)
