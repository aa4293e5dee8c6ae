"""`torch._scaled_mm` (fp8 GEMM with per-tensor scales) as IR: the fp8 operands widened to fp32
(exact), a MATMUL, the product of the scales applied to it, the bias, the cast to `out_dtype`.

This is the CPU kernel's own computation (`_scaled_mm_out_cpu_emulated`: an fp32 mm of the
widened operands, scaled, biased, cast). On GPU targets the Triton GEMM template then reads the
fp8 operands straight into `tl.dot` (`schedule/fp8dot.py`). Row-wise or block-wise scales and
`scale_result` run through torch.
"""

from __future__ import annotations

import torch
import torch.fx

from vfuse.frontend.emitter import Emitter, bind
from vfuse.frontend.errors import Fallback
from vfuse.frontend.lower_layout import reshape
from vfuse.frontend.lower_linalg import matmul
from vfuse.frontend.registry import lowers
from vfuse.ir import DType, Op
from vfuse.ir.shapes import numel

aten = torch.ops.aten


@lowers(aten._scaled_mm.default)
def lower_scaled_mm(em: Emitter, node: torch.fx.Node) -> str:
    a = bind(node)
    x, w = em.value(a["self"]), em.value(a["mat2"])
    if not (em.ttype(x).dtype.is_fp8 and em.ttype(w).dtype.is_fp8):
        raise Fallback(f"_scaled_mm of {em.ttype(x).dtype.value} x {em.ttype(w).dtype.value}")
    if a["scale_result"] is not None:
        raise Fallback("_scaled_mm with scale_result")
    scales = [em.value(a[k]) for k in ("scale_a", "scale_b")]
    if any(numel(em.ttype(s).shape) != 1 or em.ttype(s).dtype is not DType.F32 for s in scales):
        raise Fallback("_scaled_mm scales other than one fp32 value per tensor")
    prod = matmul(em, em.cast(x, DType.F32), em.cast(w, DType.F32))
    scale = em.emit(Op.MUL, tuple(reshape(em, s, ()) for s in scales))
    out = em.emit(Op.MUL, (prod, scale))
    if a["bias"] is not None:
        out = em.emit(Op.ADD, (out, em.cast(em.value(a["bias"]), DType.F32)))
    return em.cast(out, em.out_dtype())
