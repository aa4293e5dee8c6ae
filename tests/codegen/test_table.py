"""Lookup-table kernels (schedule/table.py, codegen/cpp/table.py): a pointwise chain of one
byte-wide input and constants is evaluated for all 256 bytes once, then looked up. Results
must equal the reference executor and, bit for bit, the plain (non-table) kernel."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch
from tests.codegen.native_helpers import inputs, scalar, target

from vfuse import interp
from vfuse.compiler import native_executor
from vfuse.context import Context, Options
from vfuse.fusion import plan_fusion
from vfuse.ir import DType, Graph, GraphBuilder, Op
from vfuse.runtime.native import NativeExecutor
from vfuse.schedule.kernel import Kernel


def _executor(graph: Graph, tgt: object = None) -> NativeExecutor:
    tgt = tgt or target()
    return native_executor(plan_fusion(graph, tgt), tgt, Context(Options.from_env()))


def _tables(ex: NativeExecutor) -> list[str]:
    return [k.table for k in ex.program.kernels if isinstance(k, Kernel) and k.table]


def _check(graph: Graph, xs: list[torch.Tensor], monkeypatch: pytest.MonkeyPatch, tgt: object = None) -> NativeExecutor:
    """Run with tables (asserting one is used), against the reference and the plain kernels."""
    ex = _executor(graph, tgt)
    assert _tables(ex), ex.source
    got = ex(list(xs))
    for g, w in zip(got, interp.run(graph, xs), strict=True):
        if w.dtype.is_floating_point:
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, equal_nan=True)
        else:
            assert torch.equal(g, w)
    with monkeypatch.context() as m:
        # vfuse.schedule re-exports the function `build` under its module's name.
        m.setattr(sys.modules["vfuse.schedule.build"], "with_table", lambda k: k)
        plain = _executor(graph, tgt)
        assert not _tables(plain)
        for g, w in zip(got, plain(list(xs)), strict=True):
            assert g.dtype == w.dtype and torch.equal(g.view(-1).view(torch.uint8), w.view(-1).view(torch.uint8))
    return ex


def _dequant_gelu(b: GraphBuilder, q: str) -> str:
    x = b.add(Op.MUL, [b.add(Op.SUB, [b.add(Op.CAST, [q], dtype=DType.F32), scalar(b, 3.0)]), scalar(b, 0.05)])
    return b.add(Op.GELU, [x], approximate="none")


def _requant(b: GraphBuilder, g: str) -> str:
    y = b.add(Op.ADD, [b.add(Op.ROUND, [b.add(Op.DIV, [g, scalar(b, 0.04)])]), scalar(b, -5.0)])
    y = b.add(Op.MINIMUM, [b.add(Op.MAXIMUM, [y, scalar(b, -128.0)]), scalar(b, 127.0)])
    return b.add(Op.CAST, [y], dtype=DType.I8)


def _all_bytes(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    n = torch.Size(shape).numel()
    return (torch.arange(n) % 256).to(torch.uint8).view(dtype).reshape(shape).clone()


@pytest.mark.parametrize("shape", [(3, 1001), (64, 4096)])
def test_dequant_gelu_quant_int8(shape: tuple[int, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    b = GraphBuilder()
    (q,) = inputs(b, (shape, DType.I8))
    graph = b.build([_requant(b, _dequant_gelu(b, q))])
    ex = _check(graph, [_all_bytes(shape, torch.int8)], monkeypatch)
    assert "vf_table_bytes(" in ex.source  # contiguous int8 -> int8: the byte-shuffle loop


def test_int8_to_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    b = GraphBuilder()
    (q,) = inputs(b, ((5, 999), DType.I8))
    graph = b.build([_dequant_gelu(b, q)])
    ex = _check(graph, [_all_bytes((5, 999), torch.int8)], monkeypatch)
    assert "vf_table_dwords(" in ex.source  # contiguous int8 -> float32: byte planes


def test_streamed_int8_and_float32_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    b = GraphBuilder()
    (q,) = inputs(b, ((7, 1029), DType.I8))
    g = _dequant_gelu(b, q)
    graph = b.build([_requant(b, g), g])
    small_llc = dataclasses.replace(target(), l3_bytes=4096)
    ex = _check(graph, [_all_bytes((7, 1029), torch.int8)], monkeypatch, small_llc)
    assert "vf_table_bytes(" in ex.source and "vf_table_dwords(" in ex.source
    assert all(k.stream for k in ex.program.kernels if isinstance(k, Kernel))  # non-temporal stores


def test_bool_to_float(monkeypatch: pytest.MonkeyPatch) -> None:
    b = GraphBuilder()
    (m,) = inputs(b, ((17, 300), DType.BOOL))
    x = b.add(Op.ADD, [b.add(Op.MUL, [b.add(Op.CAST, [m], dtype=DType.F32), scalar(b, 2.5)]), scalar(b, -1.0)])
    graph = b.build([b.add(Op.EXP, [x])])
    _check(graph, [torch.rand(17, 300) < 0.5], monkeypatch)


def test_uint8_permuted_view(monkeypatch: pytest.MonkeyPatch) -> None:
    b = GraphBuilder()
    (q,) = inputs(b, ((40, 70), DType.U8))
    t = b.add(Op.PERMUTE, [q], perm=(1, 0))
    x = b.add(Op.SQRT, [b.add(Op.MUL, [b.add(Op.CAST, [t], dtype=DType.F32), scalar(b, 0.5)])])
    y = b.add(Op.MINIMUM, [b.add(Op.ROUND, [b.add(Op.MUL, [x, scalar(b, 20.0)])]), scalar(b, 255.0)])
    graph = b.build([b.add(Op.CAST, [y], dtype=DType.U8)])
    ex = _check(graph, [_all_bytes((40, 70), torch.uint8)], monkeypatch)
    assert "vf_table_bytes(" not in ex.source  # the permuted load keeps its index map


def test_second_tensor_input_is_not_tabulated() -> None:
    b = GraphBuilder()
    q, s = inputs(b, ((8, 64), DType.I8), ((8, 64), DType.F32))
    graph = b.build([_requant(b, b.add(Op.MUL, [_dequant_gelu(b, q), s]))])
    ex = _executor(graph)
    assert not _tables(ex)
    xs = [_all_bytes((8, 64), torch.int8), torch.rand(8, 64)]
    for g, w in zip(ex(list(xs)), interp.run(graph, xs), strict=True):
        assert torch.equal(g, w)


def test_scalar_inputs_fill_the_table_per_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scale, zero point and output scale as 0-d inputs (an unfrozen module, Dynamo's lifted
    floats): the table reads them at run time and is refilled when they change; results equal
    the reference's for every value, bit for bit (int8 out). Few elements: no table (256
    evaluations per fill would not pay)."""
    b = GraphBuilder()
    q, scale, zero, out_scale = inputs(b, ((64, 4099), DType.I8), ((), DType.F32), ((), DType.F32), ((), DType.F32))
    x = b.add(Op.MUL, [b.add(Op.SUB, [b.add(Op.CAST, [q], dtype=DType.F32), zero]), scale])
    y = b.add(Op.ROUND, [b.add(Op.DIV, [b.add(Op.GELU, [x], approximate="none"), out_scale])])
    y = b.add(Op.MINIMUM, [b.add(Op.MAXIMUM, [y, scalar(b, -128.0)]), scalar(b, 127.0)])
    graph = b.build([b.add(Op.CAST, [y], dtype=DType.I8)])
    ex = _executor(graph)
    assert _tables(ex) and "thread_local" in ex.source and "vf_table_bytes(" in ex.source
    qs = _all_bytes((64, 4099), torch.int8)
    for s, z, o in ((0.05, 3.0, 0.04), (0.2, -7.0, 0.01), (0.05, 3.0, 0.04), (0.05, 3.0, 0.5)):
        xs = [qs, torch.tensor(s), torch.tensor(z), torch.tensor(o)]
        (got,) = ex(list(xs))
        (want,) = interp.run(graph, xs)
        assert torch.equal(got, want), (s, z, o)
    small = GraphBuilder()
    q, scale = inputs(small, ((8, 64), DType.I8), ((), DType.F32))
    g = small.add(Op.GELU, [small.add(Op.MUL, [small.add(Op.CAST, [q], dtype=DType.F32), scale])], approximate="none")
    assert not _tables(_executor(small.build([small.add(Op.EXP, [g])])))


def _scrambled(b: GraphBuilder, q: str) -> str:
    """A byte function with no smooth rows (x * 37 + 11, squared, wrapped to int8): every row delta of the
    AVX2 shuffle chains differs, unlike a quantized GELU's."""
    x = b.add(Op.CAST, [q], dtype=DType.I32)
    y = b.add(Op.ADD, [b.add(Op.MUL, [x, scalar(b, 37, DType.I32)]), scalar(b, 11, DType.I32)])
    return b.add(Op.CAST, [b.add(Op.MUL, [y, y])], dtype=DType.I8)


# Around the AVX2 loop's steps (64 and 32 bytes, then scalar), a parallel block (65536) and primes.
@pytest.mark.parametrize("n", [7, 31, 32, 33, 63, 64, 65, 95, 97, 127, 257, 4099, 65536 + 97, 131071])
def test_byte_table_sizes_and_every_value(n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every byte value at every position of a vector, for lengths that end in each of the loop's tails:
    bit for bit the plain kernel's (`_check`; the reference's too, within float tolerance for the float
    output), for a scrambled table (byte entries) and the dequantized GELU (4-byte entries). No quantized
    GELU: a last-ulp change of GELU flips its ties (byte 105: 127.5) against the reference."""
    b = GraphBuilder()
    (q,) = inputs(b, ((n,), DType.I8))
    graph = b.build([_scrambled(b, q), _dequant_gelu(b, q)])
    gen = torch.Generator().manual_seed(n)
    xs = (torch.arange(n) * 7 + torch.randint(0, 256, (n,), generator=gen)) % 256
    ex = _check(graph, [xs.to(torch.uint8).view(torch.int8)], monkeypatch)
    assert ex.source.count("vf_table_bytes(") >= 2 and ex.source.count("vf_table_dwords(") >= 2  # + the loops
