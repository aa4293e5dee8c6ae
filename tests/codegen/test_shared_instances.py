"""GEMM instances shared across layers whatever their extras' names (gemm.py `_in_use_order`):
the epilogue's arguments come sorted by their values' names, so one layer's residual and
attention output (`getitem_11`, `getitem_8`) sort the other way round from the last layer's
(`getitem`, `getitem_3`); ordered as the code first names them, both render one instance, and
each kernel still passes its own buffers to the parameter that reads them."""

from __future__ import annotations

import re

from vfuse.codegen.cpp.gemm import Epilogue, GemmSpec, render_gemm
from vfuse.codegen.cpp.gemm.epilogue import EpilogueArg
from vfuse.codegen.cpp.gemm.prologue import Prologue
from vfuse.schedule.microtile import VectorUnit

AVX2 = VectorUnit(8, 16)


def _layer(name: str, bias: str, residual: str, attn: str, sorted_names: list[str]) -> str:
    """A GEMM of A = attn (read by its prologue) with bias and residual added in the epilogue,
    its arguments in the order of their names (as the schedule lists the extras)."""
    pro = Prologue((f"const float pv1 = {attn}[r * 29 + c];",), "pv1")
    spec = GemmSpec(name, 37, 53, 29, trans_b=True, unit=AVX2, linkage="static", a_prologue=pro)
    args = tuple(EpilogueArg(n, "const float*") for n in sorted_names)
    epi = Epilogue("bias_add", args, (f"v += {bias}[j];", f"v += {residual}[i * 53 + j];"))
    return render_gemm(spec, epi)


def test_layers_with_differently_sorted_extras_share_one_instance() -> None:
    first = _layer("k6_c_mm", "p_arg17_1", "p_getitem", "p_getitem_3", ["p_arg17_1", "p_getitem", "p_getitem_3"])
    last = _layer("k15_c_mm", "p_arg33_1", "p_getitem_8", "p_getitem_11", ["p_arg33_1", "p_getitem_11", "p_getitem_8"])
    (a,) = set(re.findall(r"^#ifndef VG_GEMM_(\w+)$", first, re.M))
    (b,) = set(re.findall(r"^#ifndef VG_GEMM_(\w+)$", last, re.M))
    assert a == b
    # Each forward passes its own buffers in the instance's order: the prologue's, the bias, the residual.
    assert f"vg_gemm_{a}(A, B, C, p_getitem_3, p_arg17_1, p_getitem, nthreads);" in first
    assert f"vg_gemm_{a}(A, B, C, p_getitem_11, p_arg33_1, p_getitem_8, nthreads);" in last
