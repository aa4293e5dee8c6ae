"""Shared helpers of the frontend tests: trace a function to ATen, lower it, run it, compare.

Tracing goes through aot_autograd with vfuse's decomposition table, exactly the path
`torch.compile(backend="vfuse")` takes, so what is tested is what the frontend really sees.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch._functorch.aot_autograd import aot_function

from vfuse.context import Context, Options
from vfuse.frontend.decompositions import decomposition_table
from vfuse.frontend.lower import lower
from vfuse.interp import run
from vfuse.ir import Graph, Op, verify

_DECOMPOSITIONS = decomposition_table()  # built once: every test traces with the same table


def trace(fn: Callable, inputs: Sequence[Any]) -> torch.fx.GraphModule:
    """The functional ATen forward graph aot_autograd gives a backend for fn(*inputs)."""
    box: list[torch.fx.GraphModule] = []

    def keep(gm: torch.fx.GraphModule, example_inputs: Any) -> Callable:
        box.append(gm)
        return gm

    with torch.no_grad():
        aot_function(fn, fw_compiler=keep, decompositions=_DECOMPOSITIONS)(*inputs)
    return box[0]


def lower_fn(fn: Callable, inputs: Sequence[Any], **options: Any) -> Graph:
    """Trace and lower fn(*inputs); the result always passes verify()."""
    return verify(lower(trace(fn, inputs), Context(Options(**options))))


def fallbacks(graph: Graph) -> Counter[str]:
    """Opaque nodes of the graph, counted by torch op name."""
    return Counter(n.attrs["call"].name for n in graph.nodes if n.op is Op.OPAQUE)


def assert_matches(got: Sequence[Any], want: Any, rtol: float | None, atol: float | None) -> None:
    """Outputs equal eager's: same dtype and shape, floats within tolerance, the rest exactly."""
    want_flat = [w for w in pytree.tree_leaves(want) if isinstance(w, torch.Tensor)]
    assert len(got) == len(want_flat), f"{len(got)} outputs, eager has {len(want_flat)}"
    for i, (g, w) in enumerate(zip(got, want_flat, strict=True)):
        exact = not w.dtype.is_floating_point
        torch.testing.assert_close(
            g,
            w,
            rtol=0 if exact else rtol,
            atol=0 if exact else atol,
            equal_nan=True,
            msg=lambda m, i=i: f"output {i}: {m}",
        )


def check(
    fn: Callable,
    *inputs: Any,
    rtol: float | None = 1e-5,
    atol: float | None = 1e-6,
    allow: Sequence[str] = (),
    **options: Any,
) -> Graph:
    """Lower fn, assert no opaque fallback (except ops named in `allow`), compare with eager."""
    graph = lower_fn(fn, inputs, **options)
    unexpected = {k: v for k, v in fallbacks(graph).items() if not any(a in k for a in allow)}
    assert not unexpected, f"unexpected opaque fallbacks {unexpected} in\n{graph}"
    want = fn(*inputs)
    assert_matches(run(graph, inputs), want, rtol, atol)
    assert_matches(run_native(graph, inputs, **options), want, rtol, atol)
    return graph


def run_native(graph: Graph, inputs: Sequence[Any], **options: Any) -> list[Any]:
    """The rest of the pipeline on the lowered graph: optimize, plan, generated C++."""
    from vfuse.compiler import native_executor, optimize, plan, target_of

    ctx = Context(Options(**{**options, "backend": "cpp"}))
    optimized = optimize(graph, ctx)
    return native_executor(plan(optimized, ctx), target_of(ctx), ctx)(list(inputs))


def ops_of(graph: Graph) -> Counter[Op]:
    return Counter(n.op for n in graph.nodes)
