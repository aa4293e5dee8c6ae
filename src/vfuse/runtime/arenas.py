"""ArenaLender: one arena lent in turn to graphs that never run at the same time.

A training step runs its forward, backward and optimizer graphs one after the other, and a model
split by graph breaks runs its graphs in sequence too: each keeping its own arena holds the sum of
their intermediates between steps where the largest would do. Executors given a lender
(`NativeExecutor.share_arenas`) take an arena for each call and give it back when the call
returns; calls that do overlap (threads, a graph called from inside another's torch step) find
no free arena and get one of their own, so the lender holds as many arenas as calls ever overlap,
each grown to the largest need seen. A graph keeps its own arena when its prepacked operands
live in it (they persist between calls) or when it is small (not worth a lend per call).
"""

from __future__ import annotations

import threading

import torch

# Arenas below this stay the executor's own: a lend costs ~1 us per call and saves little.
LEND_MIN_BYTES = 64 * 1024


class ArenaLender:
    """Arenas free to lend, largest last; `take(nbytes)` before a call, `give(arena)` after it."""

    def __init__(self) -> None:
        self._free: list[torch.Tensor] = []
        self._lock = threading.Lock()
        self.allocated = 0  # arenas allocated so far (grown or for overlapping calls)

    def take(self, nbytes: int) -> torch.Tensor:
        """A free arena of at least `nbytes` bytes (uint8), allocated when none is: a free one
        too small is dropped (executors bound to it release it on their next call)."""
        with self._lock:
            if self._free:
                arena = self._free.pop()
                if arena.numel() >= nbytes:
                    return arena
            self.allocated += 1
        return torch.empty(nbytes, dtype=torch.uint8)

    def give(self, arena: torch.Tensor) -> None:
        with self._lock:
            self._free.append(arena)
            if len(self._free) > 1:  # the largest is lent first
                self._free.sort(key=torch.Tensor.numel)

    def nbytes(self) -> int:
        """Bytes of the arenas free now (those lent out are counted by their borrowers)."""
        with self._lock:
            return sum(a.numel() for a in self._free)
