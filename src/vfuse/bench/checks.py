"""Correctness check of a contender's output against eager, run before any timing.

A fast wrong answer is worse than no answer, so every contender is checked first and a
mismatch is carried into the report next to its timing rather than silently dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

# fp32 tolerances from the issue; int outputs (quantized) may differ by one step because
# a compiler may compute x/s as x*(1/s), moving values that sit on a rounding boundary.
FLOAT_RTOL = 1e-5
FLOAT_ATOL = 1e-5
INT_MAX_STEP = 1


@dataclass(frozen=True)
class Check:
    ok: bool
    kind: str  # "float" or "int"
    max_abs_err: float
    detail: str

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Check:
        return Check(bool(data["ok"]), str(data["kind"]), float(data["max_abs_err"]), str(data["detail"]))


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, (tuple, list)):
        return [leaf for v in value for leaf in _flatten(v)]
    return [value]


def _compare_tensor(expected: Tensor, actual: Any, rtol: float, atol: float) -> Check:
    kind = "float" if expected.is_floating_point() else "int"
    if not isinstance(actual, Tensor):
        return Check(False, kind, float("inf"), f"expected a tensor, got {type(actual).__name__}")
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        got = f"{tuple(actual.shape)} {actual.dtype}"
        return Check(False, kind, float("inf"), f"expected {tuple(expected.shape)} {expected.dtype}, got {got}")
    if expected.numel() == 0:
        return Check(True, kind, 0.0, "empty")
    if kind == "int":
        err = (actual.to(torch.int64) - expected.to(torch.int64)).abs().max().item()
        return Check(err <= INT_MAX_STEP, kind, float(err), f"max step {err} (allowed {INT_MAX_STEP})")
    diff = (actual.double() - expected.double()).abs()
    err = float(diff.nan_to_num(nan=float("inf")).max().item())
    ok = torch.allclose(actual, expected, rtol=rtol, atol=atol, equal_nan=True)
    return Check(ok, kind, err, f"max abs err {err:.3g} (rtol {rtol:g}, atol {atol:g})")


def compare(expected: Any, actual: Any, rtol: float = FLOAT_RTOL, atol: float = FLOAT_ATOL) -> Check:
    """Compare (possibly nested) outputs leaf by leaf; the result is the worst leaf.

    rtol / atol apply to float leaves (a workload may loosen them: see `Workload.rtol`).
    """
    exp_leaves, act_leaves = _flatten(expected), _flatten(actual)
    if len(exp_leaves) != len(act_leaves):
        return Check(False, "float", float("inf"), f"expected {len(exp_leaves)} outputs, got {len(act_leaves)}")
    checks = [_compare_tensor(e, a, rtol, atol) for e, a in zip(exp_leaves, act_leaves, strict=True)]
    failed = [c for c in checks if not c.ok]
    worst = max(checks, key=lambda c: c.max_abs_err)
    return failed[0] if failed else worst
