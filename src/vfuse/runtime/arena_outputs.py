"""The executor of a program whose outputs live in its arena (`schedule/donate.outputs_in_arena`).

A training backward would take a fresh buffer per gradient at its start, on top of its arena,
although most intermediates are dead by the time the last gradients are written. Its schedule
places those outputs in the arena's bytes free from each output's first write on, so the arena
becomes the gradients' storage: each call allocates it (below glibc's mmap ceiling the heap
hands the same pages back: runtime/arenas.py) instead of borrowing a lent arena, and returns views
of it. The executor keeps no reference to it between calls: it lives as long as the gradients, and
`zero_grad(set_to_none=True)` frees it, as Inductor's gradients are freed, where a pooled buffer
would be held through the next forward. Calls take the lean path (runtime/callplan.py) unless
outputs are donated: only the outputs' tensors differ, views of this call's arena.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from vfuse.runtime.arenas import ArenaLender
from vfuse.runtime.callplan import CallPlan, make_call_plan
from vfuse.runtime.native import NativeExecutor
from vfuse.runtime.pool import donated_views, storage_view


class ArenaOutputExecutor(NativeExecutor):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._placed = dict(self.program.arena_outputs)
        if not self.program.donated:  # donated outputs are views of inputs, bound by the general path
            self._plan = make_call_plan(self.program, self.graph)

    def _allocate(self) -> None:
        super()._allocate()
        self.lean = None  # a call needs its fresh arena: always through `__call__`

    def share_arenas(self, lender: ArenaLender) -> bool:
        return False  # its arena outlives the call: never lent to another graph

    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        with self._lock:
            if not self._ready:
                self._allocate()
            self.bind_arena(torch.empty(self.arena_bytes(), dtype=torch.uint8))
            try:
                return self._run(inputs)
            finally:
                self._arena = None  # the outputs hold it now (bound again by the next call)

    def _planned_outputs(self, plan: CallPlan) -> list[torch.Tensor]:
        assert self._arena is not None
        placed, ptrs, outs = self._placed, self._ptrs, []
        storage, base = self._arena.untyped_storage(), self._arena_off
        for (v, shape, dtype), slot in zip(plan.outputs, plan.output_slots, strict=True):
            if v in placed:
                t = storage_view(storage, base + placed[v], shape, dtype)
            else:
                t = self._pool.get(v, shape, dtype, static=self._static)
            ptrs[slot] = t.data_ptr()
            outs.append(t)
        return outs

    def _result(self, value: str, env: dict[str, Any]) -> Any:
        if value in self._placed:
            return env[value]  # the arena is these outputs' own: not copied out as other arena views are
        return super()._result(value, env)

    def _alloc_outputs(self, env: dict[str, Any], inputs: Sequence[Any] = ()) -> None:
        assert self._arena is not None
        program = self.program
        block = program.donor_block, program.donor_block_bytes
        donated = donated_views(program.donated, self._outputs, env, inputs, *block) if program.donated else {}
        placed = self._placed
        storage, base = self._arena.untyped_storage(), self._arena_off
        for v, shape, dtype in self._outputs:
            if v in donated:
                env[v] = donated[v]
            elif v in placed:
                env[v] = storage_view(storage, base + placed[v], shape, dtype)
            else:
                env[v] = self._pool.get(v, shape, dtype, static=self._static)
