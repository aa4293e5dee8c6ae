"""Which convs run as one GEMM with their images folded into the columns (the weight-gradient
template, `codegen/cpp/gemm/conv_wgrad.py`) instead of the per-image implicit GEMM.

A conv weight gradient is lowered to a conv over x with batch and channels swapped and
grad_output as the filters (`frontend/lower_conv_backward.py`): its output plane is the kernel
(3x3: 9 columns per image) and its kernel plane grad_output's (28x28). Per image, a 16..48-wide
register tile would compute mostly padding; folded, the GEMM has images x plane columns.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vfuse.ir import Graph, Op
from vfuse.ir.sym import hint, is_sym, same

# Output planes up to this many pixels under a kernel plane at least as large: weight gradients
# (3x3..7x7 outputs, grad_output's plane as the kernel: 4x4 and up), never a forward conv of a
# feature map larger than its kernel (those belong to conv.py / conv_direct.py).
FOLD_MAX_PLANE = 64


def folded_conv(attrs: Mapping[str, Any], x_shape: tuple[Any, ...], w_shape: tuple[Any, ...],
                out_shape: tuple[Any, ...]) -> bool:  # fmt: skip
    """Whether the conv of these operand and output shapes takes the folded template (a small output
    plane under a kernel plane at least as large; one group, or several over symbolic sizes). The
    template computes any conv and reads symbolic sizes at run time (a weight gradient's batch is
    its input channels, its planes the kernel's), so the plane test is a performance choice, taken
    at the hints: no guard. Grouped, one GEMM per group; at fixed sizes a grouped weight gradient
    keeps the implicit GEMM it had (not measured folded), which needs constant channels."""
    if attrs["groups"] != 1 and not any(is_sym(d) for d in (*x_shape, *w_shape, *out_shape)):
        return False
    plane, taps = hint(out_shape[2] * out_shape[3]), hint(w_shape[2] * w_shape[3])
    return plane <= FOLD_MAX_PLANE and taps >= plane


def folded_mnk(x_shape: tuple[int, ...], w_shape: tuple[int, ...], out_shape: tuple[int, ...],
               groups: int = 1) -> tuple[int, int, int]:  # fmt: skip
    """The folded GEMM (one per group): M = output channels of a group, N = images x output plane,
    K = a group's in channels x taps."""
    return w_shape[0] // groups, x_shape[0] * out_shape[2] * out_shape[3], w_shape[1] * w_shape[2] * w_shape[3]


def swapped_base(graph: Graph, inside: frozenset[str], v: str) -> str | None:
    """The buffer B (n, c, h, w) when the in-group value `v` is B with its first two dims
    exchanged through reshapes that only add or drop unit dims around one permute (the weight
    gradient's x and grad_output, `frontend/lower_conv_backward.grad_weight`, one group): the
    folded template then reads B in place instead of a copy. None for anything else."""
    while v in inside and graph[v].op is Op.RESHAPE:
        v = graph[v].inputs[0]
    if v not in inside or graph[v].op is not Op.PERMUTE:
        return None
    perm, src = tuple(graph[v].attrs["perm"]), graph[v].inputs[0]
    mid = graph[src].tensor_type.shape
    while src in inside and graph[src].op is Op.RESHAPE:
        src = graph[src].inputs[0]
    base = graph[src].tensor_type.shape
    if src in inside or len(base) != 4:
        return None
    labels: list[int | None] = []  # which dim of B each dim of `mid` is (None: an inserted 1)
    j = 0
    for d in mid:  # structurally (symbolic sizes: no guard; "no" reads a copy instead)
        if j < 4 and same(d, base[j]):
            labels.append(j)
            j += 1
        elif same(d, 1):
            labels.append(None)
        else:
            return None
    if j != 4:
        return None
    order = [labels[p] for p in perm if labels[p] is not None]
    return src if order == [1, 0, 2, 3] else None
