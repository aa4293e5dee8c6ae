"""Graph outputs that are not tensors: aot_autograd backward graphs return None for inputs
that need no gradient. The IR only has tensor outputs, so the capture stage lowers a copy of
the graph without those outputs and puts the Nones back around the compiled call.

    gm, present = without_none_outputs(gm)
    compiled = compile_fx(gm, ctx)
    run = lambda *args: with_none_outputs(compiled(*args), present)
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch.fx


def without_none_outputs(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, tuple[bool, ...]]:
    """A copy of `gm` whose output tuple lacks its None entries, and which entries remain."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    values = out.args[0]
    if not isinstance(values, list | tuple) or all(v is not None for v in values):
        return gm, tuple(True for _ in (values if isinstance(values, list | tuple) else [values]))
    present = tuple(v is not None for v in values)
    graph = copy.deepcopy(gm.graph)
    new_out = next(n for n in graph.nodes if n.op == "output")
    new_out.args = (type(values)(v for v in new_out.args[0] if v is not None),)
    return torch.fx.GraphModule(gm, graph), present


def with_none_outputs(outputs: Sequence[Any], present: tuple[bool, ...]) -> list[Any]:
    """The compiled outputs with None put back where `without_none_outputs` removed them."""
    it = iter(outputs)
    return [next(it) if keep else None for keep in present]
