"""Tracing a callable on example inputs to a functional ATen graph, without Dynamo (the backward
graphs' helper and tests' way to get an ATen graph). `entry.aot.to_ir` goes through torch.export."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def trace_aten(fn: Any, example_inputs: Sequence[Any]) -> torch.fx.GraphModule:
    """Trace a callable on concrete inputs to a functional ATen graph with our decompositions
    (no Dynamo). Functionalized, because decompositions may emit in-place ops the IR has not.
    Dead nodes are dropped: make_fx keeps a getitem of every result of a multi-output op, also
    of the Nones that e.g. convolution_backward returns for gradients it was not asked for."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from vfuse.frontend.decompositions import decomposition_table

    functional = torch.func.functionalize(fn, remove="mutations_and_views")
    table = decomposition_table(include_cia=False)  # make_fx decomposes CIA ops itself
    gm = make_fx(functional, decomposition_table=table, tracing_mode="fake")(*example_inputs)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm
