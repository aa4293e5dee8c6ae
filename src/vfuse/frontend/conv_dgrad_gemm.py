"""convolution_backward's data gradient as one GEMM and a col2im sum (groups 1).

col = W^T (Cin*kh*kw, Cout) @ grad_output (Cout, N*Ho*Wo): every flop useful, whatever the stride
(the conv form is one stride-1 conv per stride phase, s*s small convs and a CAT). Tap (i, j)'s
rows of col are the gradient of inputs (oh*s - p + i*d, ow*s - p + j*d): of one stride phase
(rh, rw) = ((i*d - p) mod s, ...), at a fixed offset on that phase's grid. Per phase, its taps'
planes are shifted there (cropped or zero-padded at the edges) and added; the phases are
interleaved once, as the conv form's are: a pointwise kernel the planner fuses with what reads
the gradient (spreading each tap to the whole grid with zeros between the strided positions
instead cost 0.57 ms of a 1.7 ms data gradient). The MATMUL is priced against torch's library
like any GEMM (`fusion/library.py`).
"""

from __future__ import annotations

from vfuse.frontend.emitter import Emitter, python_scalar
from vfuse.frontend.lower_layout import permute, reshape, slice_
from vfuse.ir import Op

Pair = tuple[int, int]


def _zeros_like_axis(em: Emitter, v: str, dim: int, width: int) -> str:
    t = em.ttype(v)
    shape = (*t.shape[:dim], width, *t.shape[dim + 1 :])
    return em.emit(Op.FULL, value=python_scalar(0, t.dtype), shape=shape, dtype=t.dtype)


def _spread(em: Emitter, v: str, dim: int, first: int, size: int) -> str:
    """v's positions q along `dim` placed at first + q of an axis `size` long, zeros elsewhere."""
    length = em.ttype(v).shape[dim]
    lo, hi = -first, size - first  # v's positions [lo, hi) are the axis's [0, size)
    parts = []
    if lo < 0:
        parts.append(_zeros_like_axis(em, v, dim, min(-lo, size)))
    if max(lo, 0) < min(hi, length):
        parts.append(slice_(em, v, dim, max(lo, 0), min(hi, length)))
    if hi > max(lo, length):
        parts.append(_zeros_like_axis(em, v, dim, hi - max(lo, length)))
    return parts[0] if len(parts) == 1 else em.emit(Op.CAT, parts, dim=dim)


def reaches(out_len: int, in_len: int, tap: int, s: int, p: int, d: int) -> bool:
    """Whether any output's tap `tap` reads inside the input (else the tap adds nothing)."""
    first = tap * d - p
    return first + (out_len - 1) * s >= 0 and first < in_len


def _phase_sum(em: Emitter, col: str, taps: list[tuple[int, int, int]], shape: tuple[int, ...]) -> str:
    """One stride phase's gradient (N, Cin, qh, qw): its taps' planes (N, Cin, Ho, Wo), each
    shifted by its offset on the phase grid (cropped or zero-padded there), added."""
    n, cin, qh, qw = shape
    ho, wo = em.ttype(col).shape[3:]
    total = None
    for tap, off_h, off_w in taps:
        t = reshape(em, slice_(em, col, 1, tap, tap + 1), (cin, n, ho, wo))
        t = _spread(em, _spread(em, permute(em, t, (1, 0, 2, 3)), 2, off_h, qh), 3, off_w, qw)
        total = t if total is None else em.emit(Op.ADD, (total, t))
    if total is None:
        dtype = em.ttype(col).dtype
        return em.emit(Op.FULL, value=python_scalar(0, dtype), shape=shape, dtype=dtype)
    return total


def grad_input_gemm(
    em: Emitter, go: str, w: str, in_hw: Pair, stride: Pair, padding: Pair, dilation: Pair, form: object = None
) -> str:
    """dL/dx (N, Cin, H, W) of a groups-1 conv: one MATMUL, then per stride phase (rh, rw) the
    taps landing on it summed on the phase grid (input rows rh, rh + s, ...), the phases
    interleaved once (a CAT per axis) and cut to the input's size. `form` (the cost model's
    FormChoice, `conv_dgrad_cost.py`) is recorded on the MATMUL for the report."""
    out_ch, cin, kh, kw = em.ttype(w).shape
    n, _, ho, wo = em.ttype(go).shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    a = permute(em, reshape(em, w, (out_ch, cin * kh * kw)), (1, 0))
    b = reshape(em, permute(em, go, (1, 0, 2, 3)), (out_ch, n * ho * wo))
    recorded = {} if form is None else {"form": form}
    col = reshape(em, em.emit(Op.MATMUL, (a, b), **recorded), (cin, kh * kw, n, ho, wo))
    q = (-(-in_hw[0] // sh), -(-in_hw[1] // sw))  # phase lengths, the last phases' padded
    phases: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    for i in range(kh):
        for j in range(kw):
            if reaches(ho, in_hw[0], i, sh, ph, dh) and reaches(wo, in_hw[1], j, sw, pw, dw):
                fh, fw = i * dh - ph, j * dw - pw  # input position of output (0, 0)'s tap
                phases.setdefault((fh % sh, fw % sw), []).append((i * kw + j, fh // sh, fw // sw))
    rows = []
    for rh in range(sh):
        row = [_phase_sum(em, col, phases.get((rh, rw), []), (n, cin, *q)) for rw in range(sw)]
        row = [reshape(em, v, (n, cin, q[0], 1, q[1], 1)) for v in row]
        rows.append(row[0] if sw == 1 else em.emit(Op.CAT, row, dim=5))
    v = rows[0] if sh == 1 else em.emit(Op.CAT, rows, dim=3)
    v = reshape(em, v, (n, cin, q[0] * sh, q[1] * sw))
    return slice_(em, slice_(em, v, 2, 0, in_hw[0]), 3, 0, in_hw[1])
