"""Graph outputs that are not tensors: aot_autograd backward graphs return None for inputs
that need no gradient, and a training forward graph compiled for symbolic sizes returns the
sizes its backward needs, which become plain ints once `capture._Specializing` burns the
concrete sizes in. The IR only has tensor outputs, so the capture stage lowers a copy of the
graph without those constant outputs and puts them back around the compiled call.

    gm, slots = without_none_outputs(gm)
    compiled = compile_fx(gm, ctx)
    run = lambda *args: with_none_outputs(compiled(*args), slots)
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch.fx


class _Computed:
    """The slot of an output the compiled graph computes (every other slot holds its constant)."""

    def __repr__(self) -> str:
        return "COMPUTED"


COMPUTED = _Computed()


def without_none_outputs(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, tuple[Any, ...]]:
    """A copy of `gm` whose output tuple keeps only its computed entries, and the output slots:
    COMPUTED where a computed output goes, else the constant (None, an int size) itself."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    values = out.args[0]
    if not isinstance(values, list | tuple):
        return gm, (COMPUTED,)
    slots = tuple(COMPUTED if isinstance(v, torch.fx.Node) else v for v in values)
    if all_computed(slots):
        return gm, slots
    graph = copy.deepcopy(gm.graph)
    new_out = next(n for n in graph.nodes if n.op == "output")
    new_out.args = (type(values)(v for v in new_out.args[0] if isinstance(v, torch.fx.Node)),)
    return torch.fx.GraphModule(gm, graph), slots


def all_computed(slots: tuple[Any, ...]) -> bool:
    return all(s is COMPUTED for s in slots)


def with_none_outputs(outputs: Sequence[Any], slots: tuple[Any, ...]) -> list[Any]:
    """The compiled outputs with the constants put back where `without_none_outputs` removed them."""
    it = iter(outputs)
    return [next(it) if s is COMPUTED else s for s in slots]


# The attribute of AOTAutograd's metadata where the forward's compile leaves the donated saved
# tensors it checked (the backward donates only those: schedule/donate.py).
_CHECKED = "vfuse_bw_donated"


def _fw_metadata() -> Any:
    return getattr(torch._guards.TracingContext.try_get(), "fw_metadata", None)


def _own_buffer(compiled: Any, slots: tuple[Any, ...], position: int) -> bool:
    """Whether the forward returns output `position` (of the traced graph) in a pool buffer of
    its own: kernel-written, returned once (CSE may return one value at two outputs, where
    AOTAutograd's trace saw two tensors), not a static output the next call overwrites."""
    if position >= len(slots) or slots[position] is not COMPUTED:
        return False
    ir = sum(1 for s in slots[:position] if s is COMPUTED)
    program, outputs = getattr(compiled.executor, "program", None), compiled.graph.outputs
    if program is None or getattr(compiled.executor, "_static", True) or ir >= len(outputs):
        return False
    b = program.buffers.get(outputs[ir])
    return b is not None and b.kind.value == "out" and outputs.count(outputs[ir]) == 1


def check_donated(compiled: Any, slots: tuple[Any, ...], lifted: bool) -> None:
    """At a training forward's compile: keeps in AOTAutograd's donated list (`bw_donated_idxs`,
    edited in place: its `retain_graph=True` check reads the same list) only the saved tensors
    this forward returns in buffers of their own (`_own_buffer`), and marks them checked."""
    meta = _fw_metadata()
    idxs = getattr(meta, "bw_donated_idxs", None)
    if not idxs:
        return
    saved = meta.tensors_saved_for_backwards_slice
    base = saved.start - (meta.num_symints_saved_for_bw or 0)
    keep = [] if lifted or compiled.in_place else [i for i in idxs if _own_buffer(compiled, slots, base + i)]
    idxs[:] = keep
    setattr(meta, _CHECKED, tuple(keep))
    _group(compiled, slots, [base + i for i in sorted(keep)])


def _group(compiled: Any, slots: tuple[Any, ...], positions: list[int]) -> None:
    """The forward returns the donated saved tensors in one block, in the order of their positions
    (the backward's donors' order), so that a gradient can span adjacent dead ones (schedule/donate.py)."""
    pool, program = getattr(compiled.executor, "_pool", None), getattr(compiled.executor, "program", None)
    group = getattr(pool, "group", None)
    if group is None or program is None or len(positions) < 2:  # an interpreted graph has no program
        return
    outputs = compiled.graph.outputs
    names = [outputs[sum(1 for s in slots[:p] if s is COMPUTED)] for p in positions]
    group([(v, program.buffers[v].type.shape, program.buffers[v].type.dtype.torch) for v in names])


def donated_inputs() -> tuple[int, ...]:
    """At a backward's compile: the input positions it may reuse, those the forward checked and
    AOTAutograd still lists (it empties the list when the first backward keeps the graph)."""
    meta = _fw_metadata()
    checked, now = getattr(meta, _CHECKED, ()), getattr(meta, "bw_donated_idxs", None) or ()
    return tuple(sorted(i for i in checked if i in now))  # the order of the forward's block (`_group`)
