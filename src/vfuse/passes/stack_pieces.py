"""Stacks of pieces back into the tensor they were cut from.

AOTAutograd's backward of `qkv.unbind(0)` (or `q, k, v = qkv[0], qkv[1], qkv[2]`) stacks the three
gradients as a sum of `select_backward`s: zeros with one slot filled each (`CAT(FULL 0, g, FULL 0)`)
added up. When the gradients are consecutive pieces of one flat tensor (the attention backward's
dq | dk | dv, frontend/lower_attention.py), the stack *is* that tensor: two rewrites say so.

* ADD of two CATs along one axis whose non-zero pieces do not overlap -> one CAT of those pieces
  (zeros kept as FULL where neither has one). Exact but for the sign of a zero: 0 + (-0.0) is
  +0.0 where the CAT keeps -0.0 (equal under ==; docs/semantics.md).
* CAT along an axis after only size-1 axes, of reshapes of consecutive SLICEs of one tensor's
  rows (axis 0, step 1) -> that tensor (its shape) or a RESHAPE of it or of the SLICE covering
  the pieces.

So the stacked gradient is a view of the attention backward's output, which its consumers (the
weight-gradient GEMM's packer, the bias-gradient sum) read in place, without a copy.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

from vfuse.ir import Graph, Node, Op, TensorType
from vfuse.ir.ops import Attrs
from vfuse.ir.sym import is_sym
from vfuse.passes.rebuild import rebuild

Segment = tuple[int, int, str | None]  # [start, end) along the CAT axis, the piece (None: zeros)


def _zero(node: Node) -> bool:
    value = node.attrs.get("value") if node.op is Op.FULL else None
    return value is not None and not is_sym(value) and value == 0


def _segments(get, node: Node) -> list[Segment] | None:
    if node.op is not Op.CAT:
        return None
    dim, at, out = node.attrs["dim"], 0, []
    for name in node.inputs:
        n = get(name).tensor_type.shape[dim]
        if is_sym(n):
            return None
        out.append((at, at + n, None if _zero(get(name)) else name))
        at += n
    return out


def _merged(a: list[Segment], b: list[Segment]) -> list[Segment] | None:
    """The pieces of a + b, or None where both have a non-zero piece or one would be cut."""
    cuts = sorted({s for s, _, _ in a + b} | {e for _, e, _ in a + b})
    out: list[Segment] = []
    for s, e in pairwise(cuts):
        found = [seg for seg in a + b if seg[2] is not None and seg[0] <= s and e <= seg[1]]
        if len(found) > 1 or (found and (found[0][0], found[0][1]) != (s, e)):
            return None
        name = found[0][2] if found else None
        if out and name is None and out[-1][2] is None:
            out[-1] = (out[-1][0], e, None)  # neighbouring zeros: one FULL
        else:
            out.append((s, e, name))
    return out


def _add_of_cats(get, node: Node, fresh) -> tuple[Node, ...] | None:
    if node.op is not Op.ADD or not all(get(i).type == node.type for i in node.inputs):
        return None
    a, b = (get(i) for i in node.inputs)
    sa, sb = _segments(get, a), _segments(get, b)
    if sa is None or sb is None or a.attrs["dim"] != b.attrs["dim"]:
        return None
    merged = _merged(sa, sb)
    if merged is None:
        return None
    dim, t = a.attrs["dim"], node.tensor_type
    made: list[Node] = []
    pieces = []
    for k, (s, e, name) in enumerate(merged):
        if name is None:
            shape = (*t.shape[:dim], e - s, *t.shape[dim + 1 :])
            attrs = Attrs.of(dtype=t.dtype, shape=shape, value=0.0 if t.dtype.is_float else 0)
            name = fresh(f"{node.name}_zeros{k}")
            made.append(Node(name, Op.FULL, (), attrs, TensorType(shape, t.dtype), node.origin))
        pieces.append(name)
    return (*made, replace(node, op=Op.CAT, inputs=tuple(pieces), attrs=Attrs.of(dim=dim)))


def _flat_range(get, name: str) -> tuple[str, int, int] | None:
    """(T, start, end) when `name` is reshapes of SLICE(T, 0, start, end, step 1): rows
    [start, end) of T, consecutive in T's row-major order."""
    node = get(name)
    while node.op is Op.RESHAPE:
        node = get(node.inputs[0])
    if node.op is not Op.SLICE or node.attrs["step"] != 1 or node.attrs["dim"] != 0:
        return None
    src = get(node.inputs[0])
    if any(is_sym(v) for v in (node.attrs["start"], node.attrs["end"], *src.tensor_type.shape)):
        return None
    return src.name, node.attrs["start"], node.attrs["end"]


def _cat_of_slices(get, node: Node, fresh) -> str | tuple[Node, ...] | None:
    if node.op is not Op.CAT or any(is_sym(d) or d != 1 for d in node.tensor_type.shape[: node.attrs["dim"]]):
        return None
    ranges = [_flat_range(get, i) for i in node.inputs]
    if any(r is None for r in ranges) or len({r[0] for r in ranges}) != 1:  # type: ignore[index]
        return None
    if any(r[2] != n[1] for r, n in pairwise(ranges)):  # type: ignore[index]
        return None
    src, start, end = ranges[0][0], ranges[0][1], ranges[-1][2]  # type: ignore[index]
    t, st = node.tensor_type, get(src).tensor_type
    if (start, end) == (0, st.shape[0]) and t.shape == st.shape:
        return src  # the stack of T's rows is T
    reshape = replace(node, op=Op.RESHAPE, attrs=Attrs.of(shape=t.shape))
    if (start, end) == (0, st.shape[0]):
        return (replace(reshape, inputs=(src,)),)
    attrs = Attrs.of(dim=0, end=end, start=start, step=1)
    rows = TensorType((end - start, *st.shape[1:]), t.dtype)
    sl = Node(fresh(f"{node.name}_range"), Op.SLICE, (src,), attrs, rows, node.origin)
    return sl, replace(reshape, inputs=(sl.name,))


def stack_pieces(graph: Graph) -> Graph:
    made: dict[str, Node] = {}

    def get(name: str) -> Node:
        return made.get(name) or graph[name]

    def fresh(name: str) -> str:
        while name in graph or name in made:
            name += "_"
        return name

    def decide(node: Node) -> str | tuple[Node, ...]:
        out: tuple[Node, ...] = (node,)
        merged = _add_of_cats(get, node, fresh)
        if merged is not None:
            out = merged
            made.update((n.name, n) for n in merged)
        whole = _cat_of_slices(get, out[-1], fresh)
        if isinstance(whole, str):
            if len(out) > 1:  # zeros made for a CAT that is T after all: not needed
                made.update((n.name, n) for n in out[:-1])
            return whole
        if whole is not None:
            out = (*out[:-1], *whole)
        made.update((n.name, n) for n in out)
        return out

    return rebuild(graph, decide)
