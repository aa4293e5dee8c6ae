"""Run OpInfo cases through vfuse and eager, and sort each sample into match / mismatch / crash."""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from tests.opinfo.harness import (
    UNSPECIFIED,
    Case,
    Outcome,
    Result,
    batched,
    fresh_copies,
    lowered_opinfos,
    op_id,
    samples,
    tolerance,
)

import vfuse


def _quiet(fn: Callable, *args: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args)


def eager(case: Case) -> Any:
    """The eager result, or the exception eager raised (such samples are not counted)."""
    try:
        return _quiet(case.call, *case.tensors)
    except Exception as e:
        return e


def compile_and_run(cases: Sequence[Case], fullgraph: bool = True) -> tuple[list[Any], Any]:
    """Every case's output from one vfuse-compiled function, and the backend (for its stats).

    Not strict: what vfuse cannot compile must fall back visibly (a warning, counted in
    stats["eager_graphs"]), which is what a user gets. fullgraph=True keeps a batch one graph
    (one translation unit); a case with a graph break (`.item()`) runs alone with
    fullgraph=False, where the recompile limit is lifted so that no piece silently runs eagerly."""
    fn, tensors = batched(fresh_copies(cases))
    torch._dynamo.reset()
    backend = vfuse.backend(backend="cpp")
    with torch._dynamo.config.patch(recompile_limit=100_000, accumulated_recompile_limit=100_000):
        outs = _quiet(torch.compile(fn, backend=backend, dynamic=False, fullgraph=fullgraph), *tensors)
    return outs, backend


def compare(case: Case, got: Any, expected: Any, dtype: torch.dtype) -> Result:
    """MATCH when `got` is within the OpInfo's tolerance of eager. In float16/bfloat16, else
    NEAR_REFERENCE when it is no farther from the op computed in float64 than 4x eager is (the
    fuzzer's criterion, and Inductor's fp64 reference): vfuse keeps fused intermediates in float32
    (docs/semantics.md) where eager rounds each op, and a cancellation near 0 turns that ulp into
    a large relative difference."""
    name = op_id(case.info)
    try:
        if case.info.name in UNSPECIFIED:
            pytree.tree_map(lambda g, e: _same_meta(g, e), got, expected)
        else:
            atol, rtol = tolerance(case.info, dtype)
            torch.testing.assert_close(got, expected, atol=atol, rtol=rtol, equal_nan=True)
    except AssertionError as e:
        if dtype in (torch.float16, torch.bfloat16) and _near_reference(case, got, expected):
            return Result(name, dtype, case.index, Outcome.NEAR_REFERENCE)
        return Result(name, dtype, case.index, Outcome.MISMATCH, f"{_describe(case)}: {_first_lines(str(e))}")
    return Result(name, dtype, case.index, Outcome.MATCH)


def _near_reference(case: Case, got: Any, expected: Any) -> bool:
    wide = case.widened()
    try:
        ref = _quiet(wide.call, *wide.tensors)
        trio = zip(*(pytree.tree_leaves(x) for x in (got, expected, ref)), strict=True)
        return all(_no_farther(g, e, r) for g, e, r in trio)
    except Exception:
        return False


def _no_farther(got: Any, eager: Any, ref: Any) -> bool:
    if not isinstance(eager, torch.Tensor) or not eager.is_floating_point():
        return bool(torch.equal(got, eager)) if isinstance(eager, torch.Tensor) else got == eager
    g, e, r = got.double(), eager.double(), ref.double()
    if not torch.equal(g.isnan(), e.isnan()) or not torch.equal(g.isinf(), e.isinf()):
        return False
    finite = e.isfinite() & r.isfinite()
    if not finite.any():
        return True
    err_got, err_eager = ((x - r)[finite].abs().max().item() for x in (g, e))
    return err_got <= 4 * err_eager + 2 * torch.finfo(eager.dtype).eps * r[finite].abs().max().item()


def _same_meta(g: Any, e: Any) -> None:
    if isinstance(e, torch.Tensor):
        assert isinstance(g, torch.Tensor) and g.shape == e.shape and g.dtype == e.dtype, f"{g!r} vs {e!r}"


def _first_lines(text: str, n: int = 4) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[:n])


def _describe(case: Case) -> str:
    shapes = ", ".join(f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}" for t in case.tensors)
    return f"sample {case.index} ({shapes}; {case.constants[:6]})"


def run_cases(cases: Sequence[Case], dtype: torch.dtype, fallbacks: Counter[str] | None = None) -> list[Result]:
    """Results for `cases` (one compile; on a failure, halves compiled apart to pin it on a sample)."""
    expected = [eager(c) for c in fresh_copies(cases)]
    runnable = [(c, e) for c, e in zip(cases, expected) if not isinstance(e, Exception)]
    return _run(runnable, dtype, fallbacks if fallbacks is not None else Counter())


def _run(pairs: Sequence[tuple[Case, Any]], dtype: torch.dtype, fallbacks: Counter[str]) -> list[Result]:
    if not pairs:
        return []
    try:
        try:
            outs, backend = compile_and_run([c for c, _ in pairs])
        except torch._dynamo.exc.Unsupported:
            if len(pairs) > 1:
                raise
            outs, backend = compile_and_run([c for c, _ in pairs], fullgraph=False)
        eager_graphs = backend.eager_fallbacks
    except Exception as e:
        outs, eager_graphs, error = [], [], e
    else:
        error = None
    if (error is not None or eager_graphs) and len(pairs) > 1:
        half = len(pairs) // 2  # pin the failure on its sample
        return _run(pairs[:half], dtype, fallbacks) + _run(pairs[half:], dtype, fallbacks)
    if error is not None:
        case = pairs[0][0]
        detail = f"{_describe(case)}: {type(error).__name__}: {_first_lines(str(error), 3)}"
        return [Result(op_id(case.info), dtype, case.index, Outcome.CRASH, detail)]
    fallbacks.update(backend.stats["fallbacks"])
    results = [compare(c, g, e, dtype) for (c, e), g in zip(pairs, outs)]
    if eager_graphs and results[0].outcome is Outcome.MATCH:
        results[0] = Result(results[0].op, dtype, results[0].sample, Outcome.EAGER_GRAPH, eager_graphs[0])
    return results


def cases_of(info: Any, dtype: torch.dtype, limit: int | None = None) -> list[Case]:
    return [Case.of(info, i, s) for i, s in enumerate(samples(info, dtype, limit))]


def summarize(results: Iterable[Result]) -> dict[tuple[str, torch.dtype], Counter[Outcome]]:
    table: dict[tuple[str, torch.dtype], Counter[Outcome]] = {}
    for r in results:
        table.setdefault((r.op, r.dtype), Counter())[r.outcome] += 1
    return table


def chunks(size: int) -> list[tuple[Any, ...]]:
    """The lowered OpInfos in fixed groups of `size` (one compiled graph per group in the subset run)."""
    infos = lowered_opinfos()
    return [infos[i : i + size] for i in range(0, len(infos), size)]
