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

from vfuse.ir.sym import is_sym

# Output planes up to this many pixels under a kernel plane at least as large: weight gradients
# (3x3..7x7 outputs, grad_output's plane as the kernel: 4x4 and up), never a forward conv of a
# feature map larger than its kernel (those belong to conv.py / conv_direct.py).
FOLD_MAX_PLANE = 64


def folded_conv(attrs: Mapping[str, Any], x_shape: tuple[Any, ...], w_shape: tuple[Any, ...],
                out_shape: tuple[Any, ...]) -> bool:  # fmt: skip
    """Whether the conv of these operand and output shapes takes the folded template (fixed sizes,
    one group, a small output plane under a kernel plane at least as large)."""
    if attrs["groups"] != 1 or any(is_sym(d) for d in (*x_shape, *w_shape, *out_shape)):
        return False
    plane, taps = out_shape[2] * out_shape[3], w_shape[2] * w_shape[3]
    return plane <= FOLD_MAX_PLANE and taps >= plane


def folded_mnk(x_shape: tuple[int, ...], w_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """The folded GEMM: M = output channels, N = images x output plane, K = in channels x taps."""
    return w_shape[0], x_shape[0] * out_shape[2] * out_shape[3], w_shape[1] * w_shape[2] * w_shape[3]
