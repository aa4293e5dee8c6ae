"""IR graphs several codegen tests build on: row kernels as the frontend emits them."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from tests.codegen.native_helpers import inputs, scalar

from vfuse.ir import DType, Graph, GraphBuilder, Op

F32 = DType.F32


def norm_graph(kind: str, n: int = 96, d: int = 200) -> tuple:
    """LayerNorm, RMSNorm and softmax decomposed the way the frontend emits them."""
    b = GraphBuilder()
    x, w, bias = inputs(b, ((n, d), F32), ((d,), F32), ((d,), F32))
    inv_d = scalar(b, 1.0 / d)
    if kind == "softmax":
        mx = b.add(Op.AMAX, [x], axes=(1,), keepdim=True)
        e = b.add(Op.EXP, [b.add(Op.SUB, [x, mx])])
        out = b.add(Op.DIV, [e, b.add(Op.SUM, [e], axes=(1,), keepdim=True)])
        return b.build([out]), lambda x, w, bias: torch.softmax(x, -1)
    if kind == "rms":
        ms = b.add(Op.MUL, [b.add(Op.SUM, [b.add(Op.MUL, [x, x])], axes=(1,), keepdim=True), inv_d])
        r = b.add(Op.RSQRT, [b.add(Op.ADD, [ms, scalar(b, 1e-6)])])
        out = b.add(Op.MUL, [b.add(Op.MUL, [x, r]), w])
        return b.build([out]), lambda x, w, bias: F.rms_norm(x, (d,), w, eps=1e-6)
    mean = b.add(Op.MUL, [b.add(Op.SUM, [x], axes=(1,), keepdim=True), inv_d])
    xc = b.add(Op.SUB, [x, mean])
    var = b.add(Op.MUL, [b.add(Op.SUM, [b.add(Op.MUL, [xc, xc])], axes=(1,), keepdim=True), inv_d])
    y = b.add(Op.MUL, [xc, b.add(Op.RSQRT, [b.add(Op.ADD, [var, scalar(b, 1e-5)])])])
    out = b.add(Op.GELU, [b.add(Op.ADD, [b.add(Op.MUL, [y, w]), bias])], approximate="none")
    return b.build([out, mean]), lambda x, w, bias: F.gelu(F.layer_norm(x, (d,), w, bias))


def layer_norm_graph(n: int, d: int, corrected: bool = False) -> Graph:
    """F.layer_norm(x, (d,), w, b) decomposed into a mean, then the centred variance; `corrected`:
    as the frontend does, the mean corrected by the deviations' sum (frontend/lower_reduce.py)."""
    b = GraphBuilder()
    x, w, bias = inputs(b, ((n, d), F32), ((d,), F32), ((d,), F32))
    inv_d = scalar(b, 1.0 / d)
    mean = b.add(Op.MUL, [b.add(Op.SUM, [x], axes=(1,), keepdim=True), inv_d])
    xc = b.add(Op.SUB, [x, mean])
    squares = b.add(Op.SUM, [b.add(Op.MUL, [xc, xc])], axes=(1,), keepdim=True)
    if corrected:
        s1 = b.add(Op.SUM, [xc], axes=(1,), keepdim=True)
        per = b.add(Op.MUL, [s1, inv_d])
        xc = b.add(Op.SUB, [x, b.add(Op.ADD, [mean, per])])
        squares = b.add(Op.MAXIMUM, [b.add(Op.SUB, [squares, b.add(Op.MUL, [s1, per])]), scalar(b, 0.0)])
    var = b.add(Op.MUL, [squares, inv_d])
    y = b.add(Op.MUL, [xc, b.add(Op.RSQRT, [b.add(Op.ADD, [var, scalar(b, 1e-5)])])])
    return b.build([b.add(Op.ADD, [b.add(Op.MUL, [y, w]), bias])])
