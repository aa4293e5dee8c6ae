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
