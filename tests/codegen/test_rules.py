"""The C++ tables cover every op of the kinds the backend fuses."""

from __future__ import annotations

from vfuse.codegen.cpp.contraction import _TEMPLATES as CPP_TEMPLATES
from vfuse.codegen.cpp.rules import COMPUTE_TYPE, CPP_RULES, REDUCE_RULES, STORAGE_TYPE
from vfuse.codegen.triton.render import TEMPLATES as TRITON_TEMPLATES
from vfuse.fusion.forms import CONTRACTION_LABELS
from vfuse.ir import DType, Kind, Op, all_opdefs
from vfuse.report.patterns import CONTRACTIONS as REPORT_NAMES
from vfuse.schedule.contraction import TRITON_IN_TORCH
from vfuse.schedule.lower import _VIEWS

# Pointwise ops the lowering turns into dedicated statements rather than table entries.
STRUCTURAL = {Op.FULL: "Const", Op.IOTA: "Iota", Op.RAND: "Rand"}


def test_every_fusable_op_has_a_rule() -> None:
    fused = (Kind.ELEMENTWISE, Kind.BROADCAST, Kind.INJECTIVE)
    missing = [
        op
        for op, d in all_opdefs().items()
        if d.kind in fused and op not in CPP_RULES and op not in STRUCTURAL and op not in _VIEWS
    ]
    assert missing == []


def test_every_reduction_has_a_rule() -> None:
    reductions = {op for op, d in all_opdefs().items() if d.kind is Kind.REDUCE}
    assert reductions == set(REDUCE_RULES)


def test_no_rule_for_ops_the_backend_does_not_fuse() -> None:
    for op in CPP_RULES:
        assert all_opdefs()[op].kind in (Kind.ELEMENTWISE, Kind.BROADCAST, Kind.INJECTIVE), op


def test_every_dtype_has_a_c_type() -> None:
    assert set(STORAGE_TYPE) == set(DType) == set(COMPUTE_TYPE)


def test_every_contraction_has_a_template_label_and_a_triton_entry() -> None:
    """Each contraction has a C++ template, a planner label and a report name; on the Triton backend either
    a template (codegen/triton) or an explicit entry saying it runs in torch there."""
    contractions = {op for op, d in all_opdefs().items() if d.kind is Kind.CONTRACTION}
    assert contractions == set(CPP_TEMPLATES) == set(CONTRACTION_LABELS) == set(REPORT_NAMES)
    assert contractions == set(TRITON_TEMPLATES) | TRITON_IN_TORCH and not set(TRITON_TEMPLATES) & TRITON_IN_TORCH
