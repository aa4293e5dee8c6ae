"""Program structure: kernels per group, passes, placement, the arena plan."""

from __future__ import annotations

from tests.codegen.native_helpers import hand_plan, inputs, scalar, target

from vfuse.ir import DType, GraphBuilder, Op
from vfuse.schedule import BufKind, TorchStep, build
from vfuse.schedule.kernel import Place
from vfuse.schedule.printer import format_program

F32 = DType.F32


def test_broadcast_keeps_two_loops_and_transposed_read_prevents_merge() -> None:
    b = GraphBuilder()
    x, y = inputs(b, ((64, 32), F32), ((32,), F32))
    add = b.add(Op.ADD, [x, y])
    t = b.add(Op.ADD, [x, b.add(Op.PERMUTE, [b.add(Op.RESHAPE, [x], shape=(32, 64))], perm=(1, 0))])
    graph = b.build([add, t])
    prog = build(hand_plan(graph, [[add], [n.name for n in graph.compute_nodes if n.name != add]]), target())
    k_add, k_t = prog.kernels
    assert [lp.size for lp in k_add.inner] == [64, 32]
    assert [lp.size for lp in k_t.inner] == [64, 32]
    assert k_add.inner[0].parallel and k_add.inner[1].vector


def test_softmax_row_kernel_passes_and_row_buffer() -> None:
    b = GraphBuilder()
    (x,) = inputs(b, ((16, 100), F32))
    mx = b.add(Op.AMAX, [x], axes=(1,), keepdim=True)
    e = b.add(Op.EXP, [b.add(Op.SUB, [x, mx])])
    out = b.add(Op.DIV, [e, b.add(Op.SUM, [e], axes=(1,), keepdim=True)])
    graph = b.build([out])
    prog = build(hand_plan(graph, [[n.name for n in graph.compute_nodes]]), target())
    (k,) = prog.kernels
    assert [len(p.reduces) for p in k.passes] == [1, 1, 0]
    (exp_var,) = k.passes[1].buffered
    assert k.placement[exp_var] is Place.ROW_BUFFER and k.passes[2].reloaded == (exp_var,)
    assert "row buffer" in format_program(prog)


def test_arena_reuses_dead_intermediates_and_contractions_go_to_torch() -> None:
    b = GraphBuilder()
    f64 = DType.F64  # the contraction templates are fp32: an f64 matmul still runs through torch
    x, w = inputs(b, ((32, 32), f64), ((32, 32), f64))
    a = b.add(Op.EXP, [x])
    c = b.add(Op.NEG, [a])
    d = b.add(Op.MATMUL, [c, w])
    e = b.add(Op.MUL, [d, scalar(b, 2.0, f64)])
    graph = b.build([e])
    prog = build(hand_plan(graph, [[a], [c], [d, e]]), target())
    kinds = {v: buf.kind for v, buf in prog.buffers.items()}
    assert kinds[a] is BufKind.ARENA and kinds[c] is BufKind.ARENA and kinds[d] is BufKind.INPUT
    assert kinds[e] is BufKind.OUTPUT
    # c = -a is written elementwise over a, read for the last time there (memory.reuse_in_place)
    assert prog.memory.offsets[a] == prog.memory.offsets[c] and prog.memory.size < prog.memory.naive_bytes
    assert any(isinstance(s, TorchStep) and s.nodes == (d,) for s in prog.steps)
