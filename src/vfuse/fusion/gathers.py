"""Gathered loads of an interleave: a RESHAPE that merges a CAT's last axis into a longer last axis.

`reshape(cat([a, b], dim=-1), (..., 2 * q))` (a stride-2 conv's data gradient interleaving its
phases, `frontend/conv_dgrad_gemm.py`) puts neighbouring output columns in different pieces: the
kernel's SIMD loop over that column indexes every load by `i / 2` and selects by `i % 2`, so each
load is a gather and every piece's loads run at every point (measured 3x3 s2 col2im, 2x16x64x64,
one thread: 0.46-0.76 ms against 0.125 ms priced as contiguous). Counted at graph level: the load
sites below the CAT through pointwise and layout nodes, as if those were fused with it. The
schedule splits such a loop by phase where it can (`split`), which leaves its loads contiguous.
"""

from __future__ import annotations

from vfuse.ir import Graph, Kind, Node, Op
from vfuse.ir.sym import is_sym

# The schedule splits an interleave of up to this many phases along the SIMD loop
# (`schedule/residue.py`: that many copies of the body); more stay gathered.
MAX_RESIDUE = 4

# Below a walk this long the count is a bound, not exact (keeps planning linear on deep graphs).
MAX_WALK = 256


def interleave_loads(node: Node, graph: Graph) -> int:
    """Loads per output point gathered by `node`: its `interleave_sites`, unless the schedule
    splits the kernel's loop by phase (`split`)."""
    if node.op is not Op.RESHAPE or split(graph[node.inputs[0]].tensor_type.shape[-1:]):
        return 0
    return interleave_sites(node, graph)


def interleave_sites(node: Node, graph: Graph) -> int:
    """Load sites per output point below the CAT that `node` interleaves: nonzero only for a
    RESHAPE whose input's last axis (1 < m < the output's last axis) is split by a CAT of the CAT
    tree producing it."""
    if node.op is not Op.RESHAPE:
        return 0
    src = graph[node.inputs[0]]
    ins, out = src.tensor_type.shape, node.tensor_type.shape
    if not ins or not out or any(is_sym(d) for d in (*ins, *out)) or not 1 < ins[-1] < out[-1]:
        return 0
    leaves: list[str] = []
    if not _splits_last(src, len(ins) - 1, graph, leaves):
        return 0
    memo: dict[str, int] = {}
    return sum(_load_sites(graph[v], graph, memo) for v in leaves)


def split(last: tuple[int, ...]) -> bool:
    """Whether the schedule splits the SIMD loop of an interleave of `last` (the phase axis, ()
    for a scalar) phases (`schedule/residue.py`: one copy of the body per phase, up to
    MAX_RESIDUE): each copy's loads are contiguous and its stores interleave with the others'
    (a vectorized store group), priced as a plain kernel. g.profile on Zen 3, one thread,
    predicted / measured: 3x3 s2 col2im 8x32x28x28 -> 64 0.19 / 0.14 ms (gathered: 0.77),
    2x16x64x64 0.125 / 0.07, 1x1 s2 0.069 / 0.035, 3x3 s3 8x32x27x27 0.10 / 0.09."""
    return bool(last) and not is_sym(last[0]) and last[0] <= MAX_RESIDUE


def _splits_last(node: Node, last: int, graph: Graph, leaves: list[str]) -> bool:
    """Whether a CAT of the CAT tree at `node` concatenates along `last`; its pieces into `leaves`."""
    if node.op is not Op.CAT:
        leaves.append(node.name)
        return False
    split = node.attrs["dim"] == last
    for v in node.inputs:
        split = _splits_last(graph[v], last, graph, leaves) or split
    return split


def _load_sites(node: Node, graph: Graph, memo: dict[str, int]) -> int:
    """Loads evaluating one point of `node` takes if its pointwise and layout producers are fused:
    one per path to a value computed elsewhere (a contraction, a reduction, an input), none to a
    constant fill."""
    if node.name in memo:
        return memo[node.name]
    if node.op in (Op.FULL, Op.IOTA):
        count = 0
    elif node.kind in (Kind.REDUCE, Kind.CONTRACTION, Kind.OPAQUE) or not node.inputs or len(memo) > MAX_WALK:
        count = 1
    else:
        count = sum(_load_sites(graph[v], graph, memo) for v in node.inputs)
    memo[node.name] = count
    return count
