"""Tiled transposes (schedule/transpose.py, codegen/cpp/transpose.py): pointwise kernels whose
operands are contiguous along different loops walk 2-D tiles, the transposed operand staged
through an L1 buffer. Results must equal eager (integers exactly) for odd sizes, broadcasts,
permutes of 3-D/4-D tensors, transposed outputs and every dtype; the schedule must pick the walk
exactly where an operand is transposed."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from tests.codegen.native_helpers import check, hand_plan, inputs, scalar
from tests.kernel_families import tiers_here

import vfuse
from vfuse.ir import DType, GraphBuilder, Op
from vfuse.schedule.kernel import Kernel, Walk
from vfuse.targets.isa import Isa

_G = torch.Generator().manual_seed(3)


def _rand(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(*shape, generator=_G).to(dtype)
    return torch.randint(-1000, 1000, shape, generator=_G).to(dtype)


def _kernels(compiled: object) -> list[Kernel]:
    program = compiled.compiled.executor.program  # type: ignore[attr-defined]
    return [k for k in program.kernels if isinstance(k, Kernel)]


def _run(fn: Callable, *xs: torch.Tensor, tiled: bool = True) -> list[Kernel]:
    compiled = vfuse.compile(fn, xs, backend="cpp")
    got, want = compiled(*xs), fn(*xs)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w)  # a misplaced element is off by O(1); ints exactly
    ks = _kernels(compiled)
    assert any(k.walk is Walk.TILED_TRANSPOSE for k in ks) == tiled, [(k.walk, k.transpose) for k in ks]
    return ks


def _chain(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.relu(x.t() + y) * torch.sigmoid(y)


@pytest.mark.parametrize("shape", [(67, 131), (131, 67), (64, 96), (100, 70), (2, 4099), (4099, 3), (5, 4099)])
def test_transposed_operand_odd_sizes(shape: tuple[int, int]) -> None:
    m, n = shape
    (k,) = _run(_chain, _rand(n, m), _rand(m, n))
    assert k.transpose is not None and len(k.transpose.staged) == 1


def test_plain_chain_keeps_the_flat_walk() -> None:
    _run(lambda x, y: torch.relu(x + y) * torch.sigmoid(y), _rand(67, 131), _rand(67, 131), tiled=False)


def test_size_one_rows_are_not_tiled() -> None:
    # x.t() of a (n, 1) tensor is contiguous: nothing to transpose.
    _run(_chain, _rand(4099, 1), _rand(1, 4099), tiled=False)


@pytest.mark.parametrize("bias", [(1, 131), (67, 1), (131,)])
def test_broadcast_operands(bias: tuple[int, ...]) -> None:
    _run(lambda x, b: torch.tanh(x.t() * 2 + b), _rand(131, 67), _rand(*bias))


def test_nchw_to_nhwc_and_back() -> None:
    x, y = _rand(2, 7, 17, 19), _rand(2, 17, 19, 7)
    _run(lambda x, y: x.permute(0, 2, 3, 1) * 0.5 + y, x, y)
    _run(lambda x, y: x + y.permute(0, 3, 1, 2), x, y)


def test_3d_permute_and_batch_broadcast() -> None:
    _run(lambda x, y: (x.permute(0, 2, 1) - y).abs(), _rand(3, 61, 89), _rand(89, 61))


def test_transposed_output() -> None:
    def fn(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = torch.sigmoid(x) * y
        return z, z.t().contiguous() + 1

    _run(fn, _rand(97, 83), _rand(97, 83))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int32, torch.int64, torch.uint8, torch.float64])
def test_dtypes(dtype: torch.dtype) -> None:
    x, y = _rand(131, 67, dtype=dtype), _rand(67, 131, dtype=dtype)
    _run(lambda x, y: x.t() * 3 + y, x, y)


def test_program_text_names_the_tiles() -> None:
    compiled = vfuse.compile(_chain, (_rand(256, 128), _rand(128, 256)), backend="cpp")
    (k,) = _kernels(compiled)
    t = k.transpose
    assert t is not None and t.rows * t.cols * 4 * 4 <= 64 << 10  # 3 accesses + the buffer fit L1
    source = compiled.compiled.executor.source
    assert f"vf_transpose_{t.block}<float>(" in source


def test_one_kernel_reads_an_input_both_ways() -> None:
    """z and z.t() + 1 of a square z in one kernel: stores follow the nest, so x and y are read
    directly for z and through the transposed tiles for z.t() (a hand plan keeps one kernel)."""
    b = GraphBuilder()
    x, y = inputs(b, ((89, 89), DType.F32), ((89, 89), DType.F32))
    z = b.add(Op.MUL, [b.add(Op.SIGMOID, [x]), y])
    zt = b.add(Op.ADD, [b.add(Op.PERMUTE, [z], perm=(1, 0)), scalar(b, 1.0)])
    graph = b.build([z, zt])
    ex = check(graph, [_rand(89, 89), _rand(89, 89)], hand_plan(graph, [[n.name for n in graph.compute_nodes]]))
    (k,) = [k for k in ex.program.kernels if isinstance(k, Kernel)]
    assert k.walk is Walk.TILED_TRANSPOSE and k.transpose is not None and len(k.transpose.staged) == 2


_STREAM_CASES = [
    (67, 144, DType.F32),
    (131, 272, DType.F32),
    (96, 416, DType.BF16),
    (67, 131, DType.F32),
    (19, 400, DType.BF16),
]


@pytest.mark.parametrize(("n", "m", "dtype"), _STREAM_CASES)
def test_streamed_tiles_match_the_reference(monkeypatch: pytest.MonkeyPatch, n: int, m: int, dtype: DType) -> None:
    """A target whose LLC these kernels outgrow: the tiles' rows are stored around the caches
    (row buffers, `vf_stream`, a fence per thread) where every output row starts on a cache line
    (m x itemsize a multiple of 64: partial tiles at odd n, a partial last tile along m, two
    outputs, one threaded case, 131 x 272), and plainly where rows start mid-line (m = 131 fp32,
    400 bf16 at 19 rows); results equal the reference executor's."""
    import dataclasses

    from tests.codegen import native_helpers

    cpu = native_helpers.target()
    monkeypatch.setattr(native_helpers, "target", lambda: dataclasses.replace(cpu, l3_bytes=4096))
    b = GraphBuilder()
    x, y = inputs(b, ((m, n), dtype), ((n, m), dtype))
    s = b.add(Op.ADD, [b.add(Op.PERMUTE, [x], perm=(1, 0)), y])
    graph = b.build([b.add(Op.MUL, [b.add(Op.RELU, [s]), b.add(Op.SIGMOID, [y])]), s])
    tdt = torch.bfloat16 if dtype is DType.BF16 else torch.float32
    tol = 2e-2 if tdt is torch.bfloat16 else 1e-5  # bf16: a rounding of the fused fp32 value; misplaced: O(1)
    ex = check(graph, [_rand(m, n, dtype=tdt), _rand(n, m, dtype=tdt)], rtol=tol, atol=tol)
    (k,) = [k for k in ex.program.kernels if isinstance(k, Kernel)]
    aligned = m * tdt.itemsize % 64 == 0
    assert k.walk is Walk.TILED_TRANSPOSE and k.stream == aligned and k.passes[0].streamed == aligned
    src = ex.source[ex.source.index("static void k0") :]
    assert src.count("vf_stream(&") == (2 if aligned else 0) and ("vf_stream_fence();" in src) == aligned
    assert ", 0, 1);" in src and (", 1, 1);" in src) != aligned  # streamed outputs are not prefetched for writing
    if not aligned:  # a run of 64 elements from mid-line touches 5 lines (fp32), 3 (bf16): one more prefetched
        assert f"l < {k.transpose.cols + 64 // tdt.itemsize}; l += {64 // tdt.itemsize})" in src


def test_tiles_in_the_llc_store_plainly() -> None:
    compiled = vfuse.compile(_chain, (_rand(256, 128), _rand(128, 256)), backend="cpp")
    (k,) = _kernels(compiled)
    assert k.walk is Walk.TILED_TRANSPOSE and not k.stream
    assert "vf_stream(&" not in compiled.compiled.executor.source


@pytest.mark.parametrize("tier", tiers_here(), ids=lambda t: t.value)
def test_every_tier_transposes_blocks_and_edges(tier: Isa) -> None:
    """Each tier's block transpose (w = 8: in-lane unpacks, then 128-bit halves; w = 4: SSE/NEON
    rounds) at sizes with partial blocks and tiles, fewer rows than a block, and a permuted 3-D view."""
    for fn, xs in (
        (_chain, (_rand(131, 67), _rand(67, 131))),
        (_chain, (_rand(4099, 5), _rand(5, 4099))),
        (lambda x, y: (x.permute(0, 2, 1) - y).abs(), (_rand(2, 61, 89), _rand(89, 61))),
    ):
        compiled = vfuse.compile(fn, xs, backend="cpp", isa=tier.value)
        torch.testing.assert_close(compiled(*xs), fn(*xs))
        assert any(k.walk is Walk.TILED_TRANSPOSE for k in _kernels(compiled))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("l2", "spread"), [(512 << 10, True), (1 << 20, False)])
@pytest.mark.parametrize("shape", [(144, 80), (131, 67), (67, 200)])
def test_tiles_prefetch_the_next_tile(
    monkeypatch: pytest.MonkeyPatch, l2: int, spread: bool, shape: tuple[int, int], threads: int
) -> None:
    """The tile walked next (along v, then the next band of u) is prefetched: the plain load's and
    the output's rows (for writing: this output stays in cache) and the staged load's runs, whole-
    edge runs with constant trip counts (rows on a line: 144 x 80 fp32; mid-line: 131 x 67, 67 x 200). On a
    small-L2 core (Zen 3) a share before each tile row; on others all at the tile's start
    (`TransposeTiles.spread`: Zen 4's AVX2 tier 1.24-1.41x faster). Partial tiles and the
    last band (no next tile) equal eager at 1 and 2 threads."""
    import dataclasses

    from tests.codegen import native_helpers

    cpu = native_helpers.target()
    monkeypatch.setattr(native_helpers, "target", lambda: dataclasses.replace(cpu, l2_bytes=l2))
    n, m = shape
    b = GraphBuilder()
    x, y = inputs(b, ((m, n), DType.F32), ((n, m), DType.F32))
    s = b.add(Op.RELU, [b.add(Op.ADD, [b.add(Op.PERMUTE, [x], perm=(1, 0)), y])])
    graph = b.build([b.add(Op.MUL, [s, b.add(Op.SIGMOID, [y])])])
    xs = [_rand(m, n), _rand(n, m)]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        ex = check(graph, xs)
        torch.testing.assert_close(ex(list(xs))[0], _chain(*xs))
    finally:
        torch.set_num_threads(before)
    (k,) = [k for k in ex.program.kernels if isinstance(k, Kernel)]
    t = k.transpose
    assert k.walk is Walk.TILED_TRANSPOSE and t is not None and t.prefetch and t.spread == spread
    src = ex.source[ex.source.index("static void k0") :]
    head, body = src[: src.index("for (int64_t i0 = ub;")], src[src.index("for (int64_t i0 = ub;") :]
    runs = (t.cols, t.rows) if n % 16 == 0 else (t.cols + 16, t.rows + 16)  # one line more from mid-line
    assert all(f"l < {r}; l += 16" in src for r in runs) and "un = vf_wrap ? ub + " in src
    assert src.count("* un + vn + r *") == 2 and ", 1, 1);" in src  # the next tile's rows, not this tile's
    rows = "for (int64_t r = 0; r < une - un; ++r)"
    if spread:
        assert body.count("__builtin_prefetch(") == 3 and "const int64_t r = i0 - ub;" in body and rows not in src
    else:
        assert head.count("__builtin_prefetch(") == 3 and "__builtin_prefetch(" not in body
        assert head.count(rows) == 2 and "for (int64_t j = 0; j < vne - vn; ++j)" in head


def test_streams_the_hardware_follows_are_not_prefetched() -> None:
    """NCHW -> NHWC with 3 channels: the planes are read in runs of a thousand elements and the
    output's 12-byte rows lie back to back, streams the hardware prefetchers follow: no
    prefetch; 64 channels (256-byte runs in rows far apart) keep theirs; both equal eager."""
    for c, prefetched in ((3, False), (64, True)):
        x, y = _rand(2, c, 37, 41), _rand(2, 37, 41, c)
        compiled = vfuse.compile(lambda x, y: x.permute(0, 2, 3, 1) * 0.5 + y, (x, y), backend="cpp")
        torch.testing.assert_close(compiled(x, y), x.permute(0, 2, 3, 1) * 0.5 + y)
        (k,) = _kernels(compiled)
        assert k.walk is Walk.TILED_TRANSPOSE and k.transpose is not None
        src = compiled.compiled.executor.source
        assert ("__builtin_prefetch(" in src[src.index("static void k0") :]) == prefetched, (c, k.transpose)
