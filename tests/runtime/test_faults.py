"""What eager torch raises for, compiled code raises too, never a signal or a silent wrong result:
gathers with an index out of range (IndexError; negative indices wrap only where eager wraps:
x[idx], not embedding or index_select) and integer division by zero (ZeroDivisionError, also a
RuntimeError as eager's); INT_MIN // -1 wraps like eager. The generated C++ and the reference
executor raise the same exception with the same message, naming the node.

Few distinct graphs (g++ is the slow part): one with every gather form, one with every integer
division of every integer dtype; the cases are inputs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from tests.codegen.native_helpers import executor, hand_plan, inputs, scalar, target

import vfuse
from vfuse import interp
from vfuse.codegen.cpp.faults import can_fault, is_fault_site
from vfuse.errors import VfuseIndexError, VfuseZeroDivisionError
from vfuse.fusion import plan_fusion
from vfuse.ir import DType, GraphBuilder, Op, TensorType
from vfuse.ir.defs.layout import IndexBounds
from vfuse.ir.opaque import ArgSlot, OpaqueCall
from vfuse.runtime.native import NativeExecutor
from vfuse.schedule import build
from vfuse.schedule.kernel import ContractionKernel

ROWS = 7  # a prime: the gathered dim
N = 13  # indices per gather
F32, I32 = DType.F32, DType.I32
BACKENDS = ("cpp", "interp")


def gathers(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    w, x, w1, i_index, i_emb, i_sel, i_comp, i_one = xs
    a = torch.relu(w[i_index] + 1.0)  # x[idx]: negative indices wrap; fused gather -> add -> relu
    b = F.embedding(i_emb, w).softmax(-1)  # a gather feeding a row reduction
    c = torch.index_select(x, 1, i_sel) * 2.0  # dim 1 of [3, 7, 5], int32 indices
    d = w[i_comp + 1] - 1.0  # an index computed in the graph
    e = w1[i_one] * 3.0  # a table of one row
    return a, b, c, d, e


def _gather_inputs(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(ROWS, 5, generator=g),
        torch.randn(3, ROWS, 5, generator=g),
        torch.randn(1, 4, generator=g),
        torch.randint(-ROWS, ROWS, (N,), generator=g),
        torch.randint(0, ROWS, (N,), generator=g),
        torch.randint(0, ROWS, (N,), generator=g, dtype=torch.int32),
        torch.randint(-ROWS - 1, ROWS - 1, (N,), generator=g),
        torch.randint(-1, 1, (3,), generator=g),
    ]


@functools.cache
def _compiled(fn: Callable, backend: str, example: Callable[[], list[torch.Tensor]]) -> Callable:
    """`fn` compiled once per backend for the inputs `example()` makes."""
    return vfuse.compile(fn, example(), backend=backend, raise_codegen_errors=True)


def compiled_gathers(backend: str) -> Callable:
    return _compiled(gathers, backend, _gather_inputs)


def _assert_same(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", [1, 2])
def test_gathers_in_range_match_eager(backend: str, seed: int) -> None:
    xs = _gather_inputs(seed)
    xs[3][0], xs[3][-1] = -ROWS, ROWS - 1  # the extremes, at the first and last position
    _assert_same(compiled_gathers(backend)(*xs), gathers(*xs))


def test_native_gathers_run_in_kernels() -> None:
    c = compiled_gathers("cpp")
    assert c.stats.backend == "cpp" and c.stats.torch_calls == 0, c.stats
    # The computed index is stored by a kernel of its own, so the gather's kernel checks a buffer.
    names = [k.name for k in c.compiled.executor.program.kernels]
    assert any(n.endswith("_ix") for n in names), names


# (index input, bad value, the index the error names): past the end, before the start (also
# for x[idx]), and negative where eager does not wrap.
BAD = [
    (3, ROWS, ROWS),
    (3, -ROWS - 1, -ROWS - 1),
    (3, 1 << 40, 1 << 40),
    (4, -1, -1),
    (4, ROWS, ROWS),
    (5, -1, -1),
    (5, ROWS + 5, ROWS + 5),
    (6, ROWS - 1, ROWS),  # i_comp + 1
    (6, -ROWS - 2, -ROWS - 1),
    (7, 1, 1),
    (7, -2, -2),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("position", [0, -1])
@pytest.mark.parametrize(("arg", "bad", "named"), BAD)
def test_gather_out_of_range_raises_like_eager(backend: str, position: int, arg: int, bad: int, named: int) -> None:
    xs = _gather_inputs()
    xs[arg][position] = bad
    with pytest.raises((IndexError, RuntimeError)):
        gathers(*xs)
    c = compiled_gathers(backend)
    with pytest.raises(VfuseIndexError) as err:
        c(*xs)
    assert isinstance(err.value, IndexError) and isinstance(err.value, RuntimeError)
    size = 1 if arg == 7 else ROWS
    assert f"index {named} is out of bounds for dimension {1 if arg == 5 else 0} with size {size}" in str(err.value)
    assert "FX node" in str(err.value)
    # The fault is cleared: the next call computes again.
    good = _gather_inputs()
    _assert_same(c(*good), gathers(*good))


@pytest.mark.parametrize("backend", BACKENDS)
def test_native_and_reference_report_the_first_bad_index(backend: str) -> None:
    xs = _gather_inputs()
    xs[4][2], xs[4][9] = ROWS + 3, -4  # both bad: torch names the first in row-major order
    with pytest.raises(VfuseIndexError, match=rf"index {ROWS + 3} is out of bounds"):
        compiled_gathers(backend)(*xs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gather_of_no_indices(backend: str) -> None:
    def f(w: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return w[i] + 1.0

    w, i = torch.randn(ROWS, 3), torch.zeros(0, dtype=torch.int64)
    c = vfuse.compile(f, (w, i), backend=backend, raise_codegen_errors=True)
    _assert_same((c(w, i),), (f(w, i),))


# ---- integer division ----

INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
# One pair of operands per dtype; int32's is big enough for the kernel to run on several threads.
SHAPES = {torch.int32: (181, 191)}
OPS = ("floordiv", "remainder", "fmod", "trunc")


def divisions(*operands: torch.Tensor) -> tuple[torch.Tensor, ...]:
    out = []
    for a, b in zip(operands[::2], operands[1::2], strict=True):
        out += [(a // b + 1) * 2, a % b, torch.fmod(a, b), torch.div(a, b, rounding_mode="trunc")]
    return tuple(out)


def expected(*operands: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """`divisions` in eager torch, except truncating division by -1, which eager's int32/int64
    kernel traps on for INT_MIN (SIGFPE): -a, wrapping like every other op here."""
    out = list(divisions(*(b if k % 2 == 0 else _not_minus_one(b) for k, b in enumerate(operands))))
    for k, (a, b) in enumerate(zip(operands[::2], operands[1::2], strict=True)):
        if a.dtype.is_signed:
            out[4 * k] = torch.where(b == -1, (-a + 1) * 2, out[4 * k])
            out[4 * k + 1] = torch.where(b == -1, torch.zeros_like(a), out[4 * k + 1])
            out[4 * k + 2] = torch.where(b == -1, torch.zeros_like(a), out[4 * k + 2])
            out[4 * k + 3] = torch.where(b == -1, -a, out[4 * k + 3])
    return tuple(out)


def _not_minus_one(b: torch.Tensor) -> torch.Tensor:
    return torch.where(b == -1, torch.ones_like(b), b) if b.dtype.is_signed else b


def _division_inputs(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for dt in INT_DTYPES:
        info, shape = torch.iinfo(dt), SHAPES.get(dt, (37,))
        a = torch.randint(info.min, info.max, shape, generator=g, dtype=torch.int64).to(dt)
        b = torch.randint(1 if dt is torch.uint8 else -9, 10, shape, generator=g, dtype=torch.int64).to(dt)
        out += [a, torch.where(b == 0, torch.ones_like(b), b)]
    return out


def compiled_divisions(backend: str) -> Callable:
    return _compiled(divisions, backend, _division_inputs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_integer_division_matches_eager(backend: str) -> None:
    xs = _division_inputs(3)
    for k, dt in enumerate(INT_DTYPES):
        a, b = xs[2 * k], xs[2 * k + 1]
        a.view(-1)[:3] = torch.tensor([torch.iinfo(dt).min, torch.iinfo(dt).max, 0], dtype=dt)
        b.view(-1)[:3] = torch.tensor([-1, -1, -1] if dt.is_signed else [1, 255, 7], dtype=dt)
    for got, want in zip(compiled_divisions(backend)(*xs), expected(*xs), strict=True):
        assert torch.equal(got, want)


def test_eager_wraps_int_min_by_minus_one_where_it_does_not_trap() -> None:
    # The reference for `expected`: eager's floor division, remainder and fmod wrap.
    for dt in (torch.int8, torch.int16, torch.int32, torch.int64):
        a, b = torch.tensor([torch.iinfo(dt).min], dtype=dt), torch.tensor([-1], dtype=dt)
        assert (a // b).item() == torch.iinfo(dt).min and (a % b).item() == 0 and torch.fmod(a, b).item() == 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("position", [0, -1])
@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_integer_division_by_zero_raises(backend: str, position: int, dtype: torch.dtype) -> None:
    xs = _division_inputs()
    k = INT_DTYPES.index(dtype)
    xs[2 * k + 1].view(-1)[position] = 0
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        divisions(*xs)
    c = compiled_divisions(backend)
    with pytest.raises(VfuseZeroDivisionError, match=r"integer division by zero.*ZeroDivisionError") as err:
        c(*xs)
    assert isinstance(err.value, ZeroDivisionError) and isinstance(err.value, RuntimeError)
    assert "FX node" in str(err.value)
    good = _division_inputs()
    for got, want in zip(c(*good), expected(*good), strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_float_division_by_zero_still_gives_inf_and_nan(backend: str) -> None:
    def f(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return a / b, a // b, a % b

    a, b = torch.tensor([1.0, -1.0, 0.0, 2.5]), torch.tensor([0.0, 0.0, 0.0, 0.0])
    c = vfuse.compile(f, (a, b), backend=backend, raise_codegen_errors=True)
    for got, want in zip(c(a, b), f(a, b), strict=True):
        torch.testing.assert_close(got, want, equal_nan=True)


def test_division_by_a_constant_zero_raises() -> None:
    def f(a: torch.Tensor) -> torch.Tensor:
        return a // 0 + 1

    a = torch.arange(-5, 6, dtype=torch.int32)
    c = vfuse.compile(f, (a,), backend="cpp", raise_codegen_errors=True)
    assert c.stats.torch_calls == 0, c.stats
    with pytest.raises(VfuseZeroDivisionError):
        c(a)


# ---- one IR program of several segments (the executor's general path) and lookup tables ----


@functools.cache
def _segments_program() -> tuple[NativeExecutor, dict[str, str]]:
    """Segment 0: a lookup-table kernel (int8 // 3), an int8 kernel dividing by a computed
    divisor (no table: the fill would divide by zero for a byte the input need not hold) and a
    gather; then cumsum through torch; segment 1: an integer division of its result."""
    b = GraphBuilder()
    x8, d, w, i = inputs(b, ((300,), DType.I8), ((5, 4), DType.I32), ((ROWS, 4), DType.F32), ((5,), DType.I64))
    three, div = scalar(b, 3, DType.I8), scalar(b, 3, DType.I8)
    tabulated = [b.add(Op.FLOOR_DIV, [x8, three])]
    tabulated.append(b.add(Op.MUL, [tabulated[-1], three]))
    table = b.add(Op.ADD, [tabulated[-1], three])
    sub = b.add(Op.SUB, [x8, div])
    computed = b.add(Op.FLOOR_DIV, [x8, sub])
    rows = b.add(Op.EMBEDDING, [w, i], bounds=IndexBounds.CHECK, dim=0)
    summed = b.add(Op.OPAQUE, [rows], call=OpaqueCall(torch.cumsum, (ArgSlot(0), 0)), out_type=TensorType((5, 4), F32))
    quotient = b.add(Op.REMAINDER, [b.add(Op.CAST, [summed], dtype=DType.I32), d])
    graph = b.build([table, computed, quotient])
    plan = hand_plan(graph, [[three, *tabulated, table], [div, sub, computed], [rows]])
    names = {"table": table, "computed": computed, "rows": rows, "quotient": quotient}
    return executor(graph, plan, raise_codegen_errors=True), names


def _segment_inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    x8 = torch.randint(-128, 128, (300,), generator=g, dtype=torch.int64).to(torch.int8)
    x8[x8 == 3] = 4
    d = torch.randint(1, 9, (5, 4), generator=g, dtype=torch.int32)
    return [x8, d, torch.randn(ROWS, 4, generator=g), torch.randint(0, ROWS, (5,), generator=g)]


def test_general_path_and_lookup_tables() -> None:
    ex, _ = _segments_program()
    assert ex.call_plan is None and ex.stats.native_calls == 2 and ex.stats.fallbacks == {"cumsum": 1}
    tables = {k.name: k.table for k in ex.program.kernels}
    assert tables["k0"] and not tables["k1"], tables  # int8 // 3 is tabulated; x // (x - 3) is not
    xs = _segment_inputs()
    for got, want in zip(ex(xs), interp.run(ex.graph, xs), strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize(("arg", "position", "value", "error", "node"), [
    (0, 0, 3, VfuseZeroDivisionError, "computed"),  # x8 - 3 == 0
    (0, -1, 3, VfuseZeroDivisionError, "computed"),
    (3, 0, ROWS, VfuseIndexError, "rows"),  # segment 0, before the torch step
    (3, -1, -1, VfuseIndexError, "rows"),
    (1, 0, 0, VfuseZeroDivisionError, "quotient"),  # segment 1, after it
    (1, -1, 0, VfuseZeroDivisionError, "quotient"),
])  # fmt: skip
def test_general_path_faults(arg: int, position: int, value: int, error: type, node: str) -> None:
    ex, names = _segments_program()
    xs = _segment_inputs()
    xs[arg].view(-1)[position] = value
    for run in (ex, lambda xs: interp.run(ex.graph, xs)):
        with pytest.raises(error, match=f"%{names[node]} = "):
            run(xs)
    good = _segment_inputs()
    assert all(torch.equal(g, w) for g, w in zip(ex(good), interp.run(ex.graph, good), strict=True))


def test_contraction_templates_leave_integer_division_outside() -> None:
    # The GEMM templates have no fault record: a division the planner fuses into a gemm group
    # (epilogue or operand prologue) is scheduled as an ordinary kernel, which reports it.
    b = GraphBuilder()
    x, w, k, a, d = inputs(b, ((33, 17), F32), ((17, 19), F32), ((33, 19), I32), ((33, 17), I32), ((33, 17), I32))
    y = b.add(Op.FLOOR_DIV, [b.add(Op.CAST, [b.add(Op.MATMUL, [x, w])], dtype=I32), k])
    z = b.add(Op.MATMUL, [b.add(Op.CAST, [b.add(Op.FLOOR_DIV, [a, d])], dtype=F32), w])
    graph = b.build([y, z])
    plan = plan_fusion(graph, target())
    assert all(g.label == "gemm" for g in plan.groups) and len(plan.groups) == 2
    program = build(plan, target())
    templates = [k for k in program.kernels if isinstance(k, ContractionKernel)]
    stmts = [s for t in templates for s in (*t.epilogue, *(s for p in t.prologues if p for s in p.stmts))]
    assert len(templates) == 2 and not any(is_fault_site(s) for s in stmts)
    assert sum(can_fault(k) for k in program.kernels) == 2
