"""NativeExecutor: segments around torch steps, arena reuse, fresh outputs, pool, strides, stats."""

from __future__ import annotations

import torch
from tests.codegen.native_helpers import check, executor, hand_plan, inputs, scalar

from vfuse.ir import ConstValue, DType, GraphBuilder, Op, TensorType
from vfuse.ir.opaque import ArgSlot, OpaqueCall
from vfuse.schedule import Segment, TorchStep

F32 = DType.F32


def _opaque_graph() -> tuple:
    b = GraphBuilder()
    (x,) = inputs(b, ((16, 24), F32))
    e = b.add(Op.EXP, [b.add(Op.MUL, [x, scalar(b, 0.1)])])
    call = OpaqueCall(torch.cumsum, (ArgSlot(0), 1))
    c = b.add(Op.OPAQUE, [e], call=call, out_type=TensorType((16, 24), F32))
    out = b.add(Op.RELU, [b.add(Op.SUB, [c, e])])
    return b.build([out, e]), e


def test_torch_step_between_two_native_segments() -> None:
    graph, _ = _opaque_graph()
    ex = check(graph, [torch.randn(16, 24)], all_native=False)
    kinds = [type(s) for s in ex.program.steps]
    assert kinds == [Segment, TorchStep, Segment]
    assert ex.stats.native_calls == 2 and ex.stats.torch_calls == 1
    assert ex.stats.fallbacks == {"cumsum": 1}


def test_torch_contraction_then_generated_epilogue() -> None:
    # f64: the contraction templates are fp32, so this matmul takes the torch path.
    b = GraphBuilder()
    f64 = DType.F64
    x, w, bias = inputs(b, ((32, 48), f64), ((48, 40), f64), ((40,), f64))
    mm = b.add(Op.MATMUL, [x, w])
    out = b.add(Op.GELU, [b.add(Op.ADD, [mm, bias])], approximate="tanh")
    graph = b.build([out])
    xs = [torch.randn(32, 48, dtype=torch.float64), torch.randn(48, 40, dtype=torch.float64)]
    xs.append(torch.randn(40, dtype=torch.float64))
    ex = check(graph, xs, plan=hand_plan(graph, [[mm, graph["add"].name, out]]), all_native=False)
    assert ex.stats.torch_calls == 1 and ex.stats.kernels == 1 and not ex.stats.fallbacks
    eager = torch.nn.functional.gelu(xs[0] @ xs[1] + xs[2], approximate="tanh")
    torch.testing.assert_close(ex(xs)[0], eager, rtol=1e-5, atol=1e-5)


def test_generated_contraction_with_fused_epilogue() -> None:
    b = GraphBuilder()
    x, w, bias = inputs(b, ((32, 48), F32), ((48, 40), F32), ((40,), F32))
    mm = b.add(Op.MATMUL, [x, w])
    out = b.add(Op.GELU, [b.add(Op.ADD, [mm, bias])], approximate="tanh")
    graph = b.build([out])
    xs = [torch.randn(32, 48), torch.randn(48, 40), torch.randn(40)]
    ex = check(graph, xs, plan=hand_plan(graph, [[mm, graph["add"].name, out]]))
    assert ex.stats.torch_calls == 0 and ex.stats.kernels == 1 and ex.stats.native_calls == 1
    eager = torch.nn.functional.gelu(xs[0] @ xs[1] + xs[2], approximate="tanh")
    torch.testing.assert_close(ex(xs)[0], eager, rtol=1e-5, atol=1e-5)


def test_intermediates_share_the_arena() -> None:
    b = GraphBuilder()
    (x,) = inputs(b, ((64, 64), F32))
    v = x
    chain = []
    for _ in range(5):  # five kernels, each intermediate read by the next one only
        v = b.add(Op.SIGMOID, [b.add(Op.MUL, [b.add(Op.PERMUTE, [v], perm=(1, 0)), scalar(b, 3.0)])])
        chain.append(v)
    graph = b.build([v])
    plan = hand_plan(graph, _chain_groups(graph, chain))
    ex = check(graph, [torch.randn(64, 64)], plan=plan)
    mem = ex.program.memory
    assert ex.stats.kernels == 5 and mem.size == 2 * 64 * 64 * 4 < mem.naive_bytes
    assert all(off % 64 == 0 for off in mem.offsets.values())


def _chain_groups(graph, ends: list[str]) -> list[list[str]]:  # type: ignore[no-untyped-def]
    groups, taken = [], set()
    for end in ends:
        g, stack = [], [end]
        while stack:
            n = stack.pop()
            if n in taken or graph[n].op is Op.INPUT or (n in ends and n != end):
                continue
            taken.add(n)
            g.append(n)
            stack += list(graph[n].inputs)
        groups.append(g)
    return groups


def _big_graph() -> tuple:
    b = GraphBuilder()
    (x,) = inputs(b, ((512, 1024), F32))
    return b.build([b.add(Op.ADD, [x, scalar(b, 1.0)])])


def test_outputs_are_fresh_unless_nobody_holds_them() -> None:
    ex = executor(_big_graph())
    x = torch.randn(512, 1024)
    first = ex([x])[0]
    kept = first.clone()
    second = ex([x * 2])[0]
    assert torch.equal(first, kept) and first.data_ptr() != second.data_ptr()
    view = second[:3]
    third = ex([x])[0]
    assert third.data_ptr() != second.data_ptr() and torch.equal(view, (x * 2 + 1)[:3])
    ptr = third.data_ptr()
    del third
    assert ex([x])[0].data_ptr() == ptr  # no reference left: the buffer is recycled


def test_static_outputs_reuse_one_buffer() -> None:
    ex = executor(_big_graph(), static_outputs=True)
    x = torch.randn(512, 1024)
    a = ex([x])[0]
    b = ex([x])[0]
    assert a.data_ptr() == b.data_ptr()


def test_strided_inputs_and_one_thread() -> None:
    b = GraphBuilder()
    x, y = inputs(b, ((40, 30), F32), ((30,), F32))
    graph = b.build([b.add(Op.SIGMOID, [b.add(Op.ADD, [x, y])])])
    xs = [torch.randn(30, 40).T, torch.randn(60)[::2]]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        check(graph, xs, rtol=1e-6, atol=1e-7)
    finally:
        torch.set_num_threads(threads)


def test_unsupported_group_falls_back_to_torch() -> None:
    b = GraphBuilder()
    (x,) = inputs(b, ((8, 12), F32))
    s0 = b.add(Op.SUM, [x], axes=(0,), keepdim=True)
    s1 = b.add(Op.SUM, [x], axes=(1,), keepdim=True)
    out = b.add(Op.ADD, [s0, s1])  # (8, 12): rows and columns in one group is no row kernel
    graph = b.build([out])
    ex = check(graph, [torch.randn(8, 12)], plan=hand_plan(graph, [[s0, s1, out]]), all_native=False)
    assert ex.stats.kernels == 0 and ex.stats.fallbacks == {"sum": 2, "add": 1}


def test_outputs_that_are_inputs_or_constants() -> None:
    b = GraphBuilder()
    (x,) = inputs(b, ((4,), F32))
    c = b.add(Op.CONSTANT, value=ConstValue(torch.arange(4.0)))
    graph = b.build([x, c, b.add(Op.MUL, [x, c])])
    ex = check(graph, [torch.randn(4)])
    out = ex([torch.ones(4)])
    out[1].add_(1)
    assert torch.equal(ex([torch.ones(4)])[1], torch.arange(4.0))


def test_stats_and_source() -> None:
    graph, _ = _opaque_graph()
    ex = executor(graph)
    assert ex.stats.backend == "cpp" and ex.stats.kernels == 2
    assert 'extern "C" int vf_seg0' in ex.source and "#pragma omp" in ex.source


def test_node_recomputed_in_two_groups() -> None:
    # The planner may put a cheap node in several groups; only each group's outputs are written.
    b = GraphBuilder()
    (x,) = inputs(b, ((16, 40), F32))
    mean = b.add(Op.MUL, [b.add(Op.SUM, [x], axes=(1,), keepdim=True), scalar(b, 1 / 40)])
    xc = b.add(Op.SUB, [x, mean])
    var = b.add(Op.SUM, [b.add(Op.MUL, [xc, xc])], axes=(1,), keepdim=True)
    out = b.add(Op.MUL, [xc, var])
    graph = b.build([out])
    row = [n.name for n in graph.compute_nodes if n.name != out]
    plan = hand_plan(graph, [row, [xc, out]], outputs=[[mean, var], [out]])
    ex = check(graph, [torch.randn(16, 40)], plan=plan)
    assert ex.stats.kernels == 2


def test_scalars_and_empty_tensors() -> None:
    b = GraphBuilder()
    x, e = inputs(b, ((), F32), ((0, 5), F32))
    s = b.add(Op.EXP, [x])
    graph = b.build([s, b.add(Op.ADD, [e, s]), b.add(Op.SUM, [e], axes=(0,), keepdim=False)])
    # The group whose outputs are all empty runs as a (free) torch step: nothing to compute.
    ex = check(
        graph,
        [torch.tensor(0.5), torch.empty(0, 5)],
        plan=hand_plan(graph, [[s], [graph.outputs[1]]]),
        all_native=False,
    )
    assert ex.stats.torch_calls == 1 and ex.stats.kernels == 2


def test_epilogue_reading_other_rows_is_split_off() -> None:
    # cat of column slices reads the column sums at clamped (other) columns: the row kernel
    # stores the sums and a pointwise kernel runs the epilogue.
    b = GraphBuilder()
    (x,) = inputs(b, ((4, 6), F32))
    y = b.add(Op.ADD, [b.add(Op.SUM, [x], axes=(0,), keepdim=True), x])
    parts = [b.add(Op.SLICE, [y], dim=1, start=s, end=s + 3, step=1) for s in (3, 0)]
    out = b.add(Op.MUL, [b.add(Op.CAT, parts, dim=1), scalar(b, 2.0)])
    graph = b.build([out])
    ex = check(graph, [torch.randn(4, 6)], plan=hand_plan(graph, [[n.name for n in graph.compute_nodes]]))
    assert ex.stats.kernels == 2


def _lean_graph() -> tuple:
    """Two outputs of one kernel reading an input, a constant, and an input no kernel reads."""
    b = GraphBuilder()
    x, _unused = inputs(b, ((6, 8), F32), ((3,), F32))
    c = b.add(Op.CONSTANT, value=ConstValue(torch.linspace(-1.0, 1.0, 8)))
    graph = b.build([b.add(Op.MUL, [x, c]), b.add(Op.ABS, [x])])
    return graph, torch.linspace(-1.0, 1.0, 8)


def test_native_only_program_takes_the_lean_path() -> None:
    graph, c = _lean_graph()
    ex = check(graph, [torch.randn(6, 8), torch.randn(3)])
    assert ex.call_plan is not None and [i for _, i in ex.call_plan.inputs] == [0]
    for x in (torch.randn(8, 6).T, torch.randn(6, 16)[:, ::2], torch.randn(6, 8)):  # rebound every call
        mul, abs_ = ex([x, torch.randn(3)])
        assert torch.equal(mul, x * c) and torch.equal(abs_, x.abs())
    general, _ = _opaque_graph()
    assert executor(general).call_plan is None  # a torch step between segments


def test_a_returned_input_keeps_the_lean_path() -> None:
    """AOTAutograd's forward returns the inputs its backward saves: handed back as the general
    path hands them back (the tensor itself; a contiguous copy of a strided one)."""
    b = GraphBuilder()
    x, w = inputs(b, ((6, 8), F32), ((8,), F32))
    graph = b.build([b.add(Op.MUL, [x, w]), x, w, x])
    ex = check(graph, [torch.randn(6, 8), torch.randn(8)])
    assert ex.call_plan is not None and ex.call_plan.results == (0, -1, -2, -1)
    for x in (torch.randn(6, 8), torch.randn(8, 6).T):
        wv = torch.randn(8)
        out, x_back, w_back, x_again = ex([x, wv])
        assert torch.equal(out, x * wv) and w_back is wv and torch.equal(x_back, x) and torch.equal(x_again, x)
        assert (x_back is x) == x.is_contiguous() and x_back.is_contiguous()


def test_small_outputs_are_recycled_only_when_unreferenced() -> None:
    graph, c = _lean_graph()
    ex = executor(graph)
    x = torch.randn(6, 8)
    mul, _ = ex([x, torch.randn(3)])
    ptr = mul.data_ptr()
    del mul
    again, abs_ = ex([x, torch.randn(3)])
    assert again.data_ptr() == ptr
    held, view = again, abs_[1:]
    other, _ = ex([x * 2, torch.randn(3)])
    assert other.data_ptr() != held.data_ptr() and torch.equal(held, x * c) and torch.equal(view, x[1:].abs())


def test_lean_path_draws_fresh_seeds_every_call() -> None:
    b = GraphBuilder()
    (x,) = inputs(b, ((32, 16), F32))
    rand = b.add(Op.RAND, [b.add(Op.RNG_SEED)], shape=(32, 16), stream=0)
    keep = b.add(Op.GE, [rand, scalar(b, 0.5)])
    graph = b.build([b.add(Op.WHERE, [keep, x, scalar(b, 0.0)])])
    ex = check(graph, [torch.randn(32, 16)], seed=3)
    assert ex.call_plan is not None and ex.call_plan.draws_seeds
    x = torch.randn(32, 16)
    torch.manual_seed(7)
    first, second = ex([x])[0].clone(), ex([x])[0]
    torch.manual_seed(7)
    assert torch.equal(ex([x])[0], first) and not torch.equal(first, second)
