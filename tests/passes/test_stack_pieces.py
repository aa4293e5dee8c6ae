"""passes/stack_pieces.py: the sum of select_backward-style CATs becomes one CAT, and a CAT of
consecutive row slices of one tensor becomes that tensor (or a view of it); numerics unchanged,
cases that do not fit left alone. End to end: a fused-qkv attention's backward stores its
stacked gradient once (no copy of the attention backward's output), gradients as eager's."""

from __future__ import annotations

import torch
from tests.models.train_zoo import QkvAttention

import vfuse
from vfuse.interp import run
from vfuse.ir import DType, Graph, GraphBuilder, Op, TensorType, verify
from vfuse.passes import dce, stack_pieces
from vfuse.schedule import BufKind

F32 = DType.F32


def _stack(rows: int, piece: tuple[int, ...], order: tuple[int, ...], dim_ok: bool = True) -> Graph:
    """T [rows, *piece]; piece i = reshape(slice(T, i)), placed at slot order[i] of a stack of
    `rows` built as a sum of CAT(zeros, piece, zeros) (AOTAutograd's select_backward sum)."""
    b = GraphBuilder()
    t = b.add(Op.INPUT, name="t", index=0, type=TensorType((rows, *piece), F32))
    total = None
    for i, slot in enumerate(order):
        p = b.add(Op.RESHAPE, [b.add(Op.SLICE, [t], dim=0, start=i, end=i + 1, step=1)], shape=(1, *piece))
        parts = []
        if slot:
            parts.append(b.add(Op.FULL, value=0.0, shape=(slot, *piece), dtype=F32))
        parts.append(p)
        if rows - slot - 1:
            parts.append(b.add(Op.FULL, value=0.0, shape=(rows - slot - 1, *piece), dtype=F32))
        cat = b.add(Op.CAT, parts, dim=0) if len(parts) > 1 else p
        total = cat if total is None else b.add(Op.ADD, [total, cat])
    out = b.add(Op.PERMUTE, [total], perm=(1, 0, 2)) if dim_ok else total
    return verify(b.build([out]))


def _check(g: Graph) -> Graph:
    new = verify(dce(stack_pieces(g)))
    t = torch.randn(g.inputs[0].tensor_type.shape)
    t.view(-1)[0] = -0.0  # the CAT keeps -0.0 where 0 + x gives +0.0: equal
    assert torch.equal(run(new, [t])[0], run(g, [t])[0])
    return new


def test_stack_of_a_tensors_rows_is_the_tensor() -> None:
    new = _check(_stack(3, (5, 7), (0, 1, 2)))
    assert [n.op for n in new.compute_nodes] == [Op.PERMUTE]
    assert new[new.outputs[0]].inputs == ("t",)


def test_stack_summed_in_any_order() -> None:
    new = _check(_stack(3, (2, 11), (2, 0, 1)))  # AOTAutograd adds slot 2 first
    assert Op.ADD not in [n.op for n in new.compute_nodes]  # one CAT, out of T's order: kept
    assert [n.op for n in new.compute_nodes].count(Op.CAT) == 1


def test_partial_stack_keeps_its_zeros() -> None:
    """Rows 0 and 1 of T into a stack of 3 (row 2 zeros): no ADD, one CAT of a view and zeros."""
    b = GraphBuilder()
    t = b.add(Op.INPUT, name="t", index=0, type=TensorType((2, 13), F32))
    a = b.add(Op.SLICE, [t], dim=0, start=0, end=1, step=1)
    c = b.add(Op.SLICE, [t], dim=0, start=1, end=2, step=1)
    z1, z2 = (b.add(Op.FULL, value=0.0, shape=(n, 13), dtype=F32) for n in (1, 2))
    s = b.add(Op.ADD, [b.add(Op.CAT, [a, z2], dim=0), b.add(Op.CAT, [z1, c, z1], dim=0)])
    new = _check(verify(b.build([s])))
    ops = [n.op for n in new.compute_nodes]
    assert Op.ADD not in ops and ops.count(Op.CAT) == 1


def test_overlapping_or_non_stack_cases_are_left_alone() -> None:
    b = GraphBuilder()
    t = b.add(Op.INPUT, name="t", index=0, type=TensorType((2, 3, 5), F32))
    a = b.add(Op.SLICE, [t], dim=0, start=0, end=1, step=1)
    c = b.add(Op.SLICE, [t], dim=0, start=1, end=2, step=1)
    z = b.add(Op.FULL, value=0.0, shape=(1, 3, 5), dtype=F32)
    both = b.add(Op.ADD, [b.add(Op.CAT, [a, z], dim=0), b.add(Op.CAT, [c, a], dim=0)])  # slot 1 twice
    swapped = b.add(Op.CAT, [c, a], dim=0)  # rows out of order: not T
    wide = b.add(Op.CAT, [t, t], dim=1)  # after an axis of 2: not consecutive rows
    nonzero = b.add(Op.FULL, value=1.0, shape=(1, 3, 5), dtype=F32)
    ones = b.add(Op.ADD, [b.add(Op.CAT, [a, nonzero], dim=0), b.add(Op.CAT, [nonzero, c], dim=0)])
    g = verify(b.build([both, swapped, wide, ones]))
    new = _check(g)
    assert [n.op for n in new.compute_nodes].count(Op.ADD) == 2
    assert [n.op for n in new.compute_nodes].count(Op.CAT) == 6


def test_fused_qkv_attention_backward_stores_its_gradient_once() -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = QkvAttention(3 * 7, 3)  # head size 7, T = 37: primes
    x = torch.randn(2, 37, 21)
    backend = vfuse.backend(strict=True)
    got = torch.compile(model, backend=backend)(x)
    grad = torch.randn_like(got)
    got_grads = torch.autograd.grad(got, list(model.parameters()), grad)
    want_grads = torch.autograd.grad(model(x), list(model.parameters()), grad)
    for a, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, w, rtol=1e-4, atol=1e-4 * w.abs().max().item())
    program = backend.compiled[-1].executor.program
    sdpa = [n for n in backend.compiled[-1].executor.graph.nodes if n.op is Op.SDPA_BACKWARD]
    assert len(sdpa) == 1 and sdpa[0].attrs["stacked"]
    # Stored in the qkv projection's [B, T, 3, H, D] order, typed as its [B*T, 3*d] view (passes/grad_layout.py).
    assert sdpa[0].attrs["perm"] == (1, 3, 0, 2, 4) and sdpa[0].tensor_type.shape == (2 * 37, 3 * 21)
    size = sdpa[0].tensor_type.nbytes
    # Its consumers (weight-gradient GEMM, bias sum) read it in place: no arena copy of its size.
    copies = [v for v, b in program.buffers.items() if b.kind is BufKind.ARENA and b.type.nbytes >= size]
    assert copies == [sdpa[0].name], copies
