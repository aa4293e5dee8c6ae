"""Shared helpers of the C++ backend tests: build small IR graphs, plan them, run them natively.

Plans come from the real planner (`plan_fusion`) or, to pin down one kernel shape, from
`hand_plan` (groups listed by hand). Results are compared with the reference executor.
Kernels are cached in the default cache directory (or $VFUSE_CACHE_DIR), so reruns are fast.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from vfuse import interp
from vfuse.compiler import native_executor
from vfuse.context import Context, Options
from vfuse.fusion import FusionPlan, Group, plan_fusion
from vfuse.fusion.plan import Cost
from vfuse.ir import DType, Graph, GraphBuilder, Kind, Op, TensorType, verify
from vfuse.runtime.native import NativeExecutor
from vfuse.targets import get_target

ZERO_COST = Cost(0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0)


def target() -> Any:
    return get_target("cpu")


def inputs(b: GraphBuilder, *types: tuple[tuple[int, ...], DType]) -> list[str]:
    return [b.add(Op.INPUT, name=f"x{i}", index=i, type=TensorType(s, d)) for i, (s, d) in enumerate(types)]


def scalar(b: GraphBuilder, value: float | int | bool, dtype: DType = DType.F32) -> str:
    return b.add(Op.FULL, value=value, shape=(), dtype=dtype)


def _label(graph: Graph, nodes: Sequence[str]) -> tuple[Kind, str]:
    kinds = {graph[n].kind for n in nodes}
    kind = max(kinds)
    label = {Kind.OPAQUE: "opaque", Kind.CONTRACTION: "gemm", Kind.REDUCE: "row"}.get(kind, "pointwise")
    return kind, label


def materialized(graph: Graph, nodes: set[str]) -> list[str]:
    """Values of `nodes` something outside them reads (or the graph returns), in graph order."""
    return [
        n.name
        for n in graph.nodes
        if n.name in nodes and (graph.is_output(n.name) or any(u not in nodes for u in graph.users(n.name)))
    ]


def hand_plan(
    graph: Graph, groups: Sequence[Sequence[str]], outputs: Sequence[Sequence[str]] | None = None
) -> FusionPlan:
    """A FusionPlan with exactly these groups (in order); every other compute node alone.

    outputs: each group's outputs when groups overlap (a node recomputed in several groups);
    by default whatever something outside the group reads.
    """
    listed = {n for g in groups for n in g}
    all_groups = [list(g) for g in groups]
    all_outs = [list(o) for o in outputs] if outputs else [materialized(graph, set(g)) for g in groups]
    for n in graph.compute_nodes:
        if n.name not in listed:
            all_groups.append([n.name])
            all_outs.append([n.name])
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    pairs = sorted(zip(all_groups, all_outs, strict=True), key=lambda p: max(order[n] for n in p[0]))
    out = []
    for i, (g, outs) in enumerate(pairs):
        members = set(g)
        ins = tuple(dict.fromkeys(x for n in g for x in graph[n].inputs if x not in members))
        kind, label = _label(graph, g)
        out.append(Group(i, tuple(sorted(g, key=order.__getitem__)), kind, label, ins, tuple(outs), ZERO_COST))
    return FusionPlan(graph, "cpu", tuple(out), ())


def executor(graph: Graph, plan: FusionPlan | None = None, **options: Any) -> NativeExecutor:
    verify(graph)
    plan = plan or plan_fusion(graph, target())
    return native_executor(plan, target(), Context(Options.from_env(**options)))


def check(
    graph: Graph,
    xs: list[torch.Tensor],
    plan: FusionPlan | None = None,
    rtol: float = 1e-5,
    atol: float = 1e-5,
    seed: int | None = None,
    all_native: bool = True,
    **options: Any,
) -> NativeExecutor:
    """Run natively and with the reference executor; assert every output matches.

    all_native: also assert that nothing ran through torch (no fallback hid a codegen gap).
    """
    ex = executor(graph, plan, **options)
    if all_native:
        assert ex.stats.torch_calls == 0 and ex.stats.kernels > 0, ex.stats
    if seed is not None:
        torch.manual_seed(seed)
    got = ex(list(xs))
    if seed is not None:
        torch.manual_seed(seed)
    want = interp.run(graph, xs)
    assert len(got) == len(want)
    for name, g, w in zip(graph.outputs, got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, (
            f"%{name}: {g.dtype}{list(g.shape)} vs {w.dtype}{list(w.shape)}"
        )
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m, n=name: f"%{n}: {m}")
    return ex


def capture_renders(monkeypatch: Any, target: Any) -> list[tuple[Any, str]]:
    """Compile for `target` and keep every (Program, C++ source) the compiler renders. Tests using
    it need their own cache dir (a kept program skips rendering)."""
    import vfuse.compiler as compiler

    monkeypatch.setattr(compiler, "target_of", lambda ctx: target)
    built: list[tuple[Any, str]] = []
    real = compiler.render

    def render(program: Any, ctx: Any) -> str:
        built.append((program, real(program, ctx)))
        return built[-1][1]

    monkeypatch.setattr(compiler, "render", render)
    return built


def rendered_layernorm(monkeypatch: Any, cache_dir: Any, target: Any, rows: Sequence[int]) -> tuple[Any, str]:
    """LayerNorm(256) under dynamic=True for `target`, called at each row count and checked against
    eager: the one (Program, C++ source) rendered."""
    import vfuse

    built = capture_renders(monkeypatch, target)
    torch._dynamo.reset()
    norm = torch.nn.LayerNorm(256)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-1, 1)
        c = torch.compile(norm, backend=vfuse.backend(cache_dir=cache_dir), dynamic=True)  # renders: no kept program
        for i, n in enumerate(rows):
            x = torch.randn(n, 256, generator=torch.Generator().manual_seed(i)) * 2 + 5
            torch.testing.assert_close(c(x), norm(x), rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()
    ((program, source),) = built
    return program, source
