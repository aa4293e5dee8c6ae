"""SCATTER_ADD (ir/defs/scatter.py): max_pool2d and embedding backward on CPU as one template kernel
(codegen/cpp/scatter.py) that adds each element's terms in eager's order, so gradients match
eager bit for bit under every walk (serial, planes, output row ranges) and thread count; an index
out of range raises VfuseIndexError naming the first bad one; no torch step in the backward."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import vfuse
from vfuse.errors import VfuseIndexError
from vfuse.fusion import plan_fusion
from vfuse.ir import DType, GraphBuilder, Op, TensorType, opdef
from vfuse.ir.ops import Attrs
from vfuse.schedule import build
from vfuse.schedule.kernel import ContractionKernel, ScatterWalk, TorchStep
from vfuse.targets import get_target

aten = torch.ops.aten


def _pool_backward(args: tuple) -> object:
    kernel, stride, padding, dilation, ceil = args

    def backward(g: torch.Tensor, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return aten.max_pool2d_with_indices_backward(g, x, kernel, stride, padding, dilation, ceil, idx)

    return backward


def _scatter_kernels(compiled) -> list:
    program = getattr(compiled, "compiled", compiled).executor.program  # vfuse.compile's, or a backend's
    kernels = [k for k in program.kernels if isinstance(k, ContractionKernel) and k.op is Op.SCATTER_ADD]
    torch_steps = [s for s in program.steps if isinstance(s, TorchStep)]
    assert not torch_steps, torch_steps
    return kernels


@pytest.fixture(params=[1, 3])
def threads(request: pytest.FixtureRequest):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


POOLS = [
    # (x shape, (kernel, stride, padding, dilation, ceil_mode), walk)
    ((2, 3, 13, 11), ([3, 3], [2, 2], [1, 1], [1, 1], False), ScatterWalk.SERIAL),
    ((1, 1, 1, 1), ([1, 1], [1, 1], [0, 0], [1, 1], False), ScatterWalk.SERIAL),
    ((3, 7, 5), ([3, 2], [1, 2], [1, 0], [1, 1], True), ScatterWalk.SERIAL),  # unbatched, ceil_mode
    ((2, 5, 47, 53), ([3, 3], [1, 1], [1, 1], [2, 2], False), ScatterWalk.ROW_RANGES),  # dilated, overlapping
    ((4, 8, 37, 41), ([3, 3], [2, 2], [1, 1], [1, 1], True), ScatterWalk.PLANES),  # ResNet stem, primes
]


@pytest.mark.parametrize(("shape", "geometry", "walk"), POOLS)
def test_max_pool2d_backward_is_one_scatter_and_bit_exact(shape, geometry, walk, threads: int) -> None:
    torch.manual_seed(0)
    x = torch.randn(shape).round()  # rounded: ties, and several windows choosing one input
    kernel, stride, padding, dilation, ceil = geometry
    y, idx = aten.max_pool2d_with_indices(x, kernel, stride, padding, dilation, ceil)
    g = torch.randn_like(y)
    backward = _pool_backward(geometry)
    compiled = vfuse.compile(backward, (g, x, idx), strict=True)
    (k,) = _scatter_kernels(compiled)
    assert k.scatter is walk
    want = backward(g, x, idx)
    got = compiled(g, x, idx)
    assert torch.equal(got, want)
    assert torch.equal(compiled(g, x, idx), got)  # reproducible run to run


@pytest.mark.parametrize(
    ("walk_shape", "walk"),
    [
        ((2, 3, 5, 5), ScatterWalk.SERIAL),
        ((2, 3, 80, 80), ScatterWalk.ROW_RANGES),
        ((32, 2, 23, 23), ScatterWalk.PLANES),
    ],
)
def test_max_pool2d_backward_bad_index_raises_the_first(walk_shape: tuple, walk: ScatterWalk) -> None:
    """A saved index outside the plane raises (never written); the first bad one in row-major
    order is named, whichever thread saw it (serial, row ranges, planes)."""
    x = torch.randn(walk_shape)
    geometry = ([3, 3], [2, 2], [1, 1], [1, 1], False)
    y, idx = aten.max_pool2d_with_indices(x, *geometry)
    g = torch.randn_like(y)
    compiled = vfuse.compile(_pool_backward(geometry), (g, x, idx), strict=True)
    assert [k.scatter for k in _scatter_kernels(compiled)] == [walk]
    plane = walk_shape[-1] * walk_shape[-2]
    wrong = idx.clone()
    wrong[1, 1, 1, 0] = plane
    wrong[-1, -1, -1, -1] = -3
    with pytest.raises(VfuseIndexError, match=f"index {plane} is out of bounds .* size {plane}"):
        compiled(g, x, wrong)
    assert torch.equal(compiled(g, x, idx), _pool_backward(geometry)(g, x, idx))  # still fine after


EMBEDDINGS = [
    # (rows, index shape, width, padding_idx, index dtype)
    (37, (2, 13), 16, None, torch.int64),
    (11, (5,), 3, 2, torch.int64),  # padding_idx: no gradient
    (1, (3,), 5, None, torch.int32),  # one row, int32 indices
    (13, (1, 1), 1, 12, torch.int64),
    (1009, (3, 101), 67, 0, torch.int64),  # row ranges, prime sizes
    (7, (0,), 4, None, torch.int64),  # no indices: zeros
]


@pytest.mark.parametrize(("rows", "ishape", "width", "padding_idx", "itype"), EMBEDDINGS)
def test_embedding_backward_is_one_scatter_and_bit_exact(rows, ishape, width, padding_idx, itype, threads) -> None:
    torch.manual_seed(0)
    idx = torch.randint(0, min(rows, 5), ishape, dtype=itype)  # repeated indices
    if padding_idx is not None and idx.numel():
        idx.view(-1)[0] = padding_idx
    g = torch.randn(*ishape, width)
    pad = -1 if padding_idx is None else padding_idx

    def backward(g: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return aten.embedding_dense_backward(g, idx, rows, pad, False)

    compiled = vfuse.compile(backward, (g, idx), strict=True)
    assert len(_scatter_kernels(compiled)) == (1 if idx.numel() else 0)
    got = compiled(g, idx)
    assert torch.equal(got, backward(g, idx))
    if padding_idx is not None:
        assert not got[padding_idx].any()


def test_embedding_backward_bad_index_raises() -> None:
    g, idx = torch.randn(2, 300, 64), torch.randint(0, 1000, (2, 300))
    compiled = vfuse.compile(lambda g, i: aten.embedding_dense_backward(g, i, 1000, -1, False), (g, idx))
    (k,) = _scatter_kernels(compiled)
    assert k.scatter is ScatterWalk.ROW_RANGES
    for bad in (1000, -1):
        wrong = idx.clone()
        wrong[1, 7] = bad
        with pytest.raises(VfuseIndexError, match=f"index {bad} is out of bounds for dimension 0 with size 1000"):
            compiled(g, wrong)


def test_training_step_gradients_without_fallbacks() -> None:
    """Embedding (padding token) and a max pool in one model: one step's gradients are eager's,
    with no backward op in torch."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    embed = torch.nn.Embedding(53, 8, padding_idx=1)
    tokens = torch.randint(0, 53, (2, 36))
    tokens[0, :3] = 1

    def step(w: torch.Tensor) -> torch.Tensor:
        e = F.embedding(tokens, w, padding_idx=1).reshape(2, 6, 6, 8).permute(0, 3, 1, 2)
        return F.max_pool2d(e, 3, 2, 1).square().sum()

    backend = vfuse.backend(strict=True)
    w = embed.weight.detach().clone().requires_grad_()
    (got,) = torch.autograd.grad(torch.compile(step, backend=backend)(w), w)
    (want,) = torch.autograd.grad(step(w), w)
    assert torch.equal(got, want)
    assert not backend.stats["fallbacks"], backend.stats


def test_reference_semantics_with_init_and_skip() -> None:
    """The op's reference (the interpreter's): terms in order onto `init`, `skip` dropped, bounds checked."""
    ref = opdef(Op.SCATTER_ADD).ref
    values = torch.arange(12, dtype=torch.float64).reshape(2, 3, 2)
    index = torch.tensor([[0, 2, 0], [1, 1, 3]])
    init = torch.full((2, 4, 2), 0.5, dtype=torch.float64)
    want = init.clone()
    for b in range(2):
        for n in range(3):
            if index[b, n] != 3:
                want[b, index[b, n]] += values[b, n]
    assert torch.equal(ref(values, index, init, Attrs.of(rows=4, skip=3, wrap=False, taps=1, dim=0)), want)
    with pytest.raises(VfuseIndexError, match="index 3 is out of bounds for dimension 1 with size 3"):
        ref(values, index, Attrs.of(rows=3, skip=None, wrap=False, taps=1, dim=1))
    # Two taps per value, one index row for both planes, -1 skipped (never an error).
    shared = torch.tensor([[2, -1, 0, 2, -1, 1]])
    want = torch.zeros(2, 3, 2, dtype=torch.float64)
    for b in range(2):
        for m, r in enumerate(shared[0].tolist()):
            if r != -1:
                want[b, r] += values[b, m // 2]
    got = ref(values, shared, Attrs.of(rows=3, skip=-1, wrap=False, taps=2, dim=0))
    assert torch.equal(got, want)


def test_triton_programs_run_the_scatter_in_torch() -> None:
    """No deterministic Triton scatter: a program for the Triton renderer keeps SCATTER_ADD in torch,
    explicitly (schedule.contraction.TRITON_IN_TORCH); GPU targets lower the backwards to their
    gather forms instead (tests/training/test_backward_ops.py)."""
    b = GraphBuilder()
    values = b.add(Op.INPUT, name="v", index=0, type=TensorType((4, 6, 5), DType.F32))
    index = b.add(Op.INPUT, name="i", index=1, type=TensorType((4, 6), DType.I64))
    graph = b.build([b.add(Op.SCATTER_ADD, [values, index], rows=9, skip=None, wrap=False, taps=1, dim=0)])
    h100 = get_target("h100")
    (step,) = build(plan_fusion(graph, h100), h100, triton=True).steps
    assert isinstance(step, TorchStep) and "no Triton template for scatter_add" in step.reason
    cpu = get_target("cpu")
    (seg,) = build(plan_fusion(graph, cpu), cpu).steps
    assert [k.op for k in seg.kernels] == [Op.SCATTER_ADD]


def _serial_index_put(x: torch.Tensor, idx: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """x[idx] += v one term at a time in index order (eager's order on one thread)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return aten.index_put(x, [idx], v, True)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(("shape", "n", "vshape"), [((7, 30), 13, None), ((1, 5), 3, (5,)), ((11, 3, 2), 40, (1, 2))])
def test_index_put_accumulate_is_one_scatter(shape, n, vshape, threads: int) -> None:
    """x[idx] += v (index_put, accumulate): repeated and negative indices, broadcast values; eager's
    one-thread result bit for bit (eager on several threads adds in no fixed order), run to run."""
    torch.manual_seed(0)
    x, idx = torch.randn(shape), torch.randint(-shape[0], shape[0], (n,))
    v = torch.randn(vshape if vshape else (n, *shape[1:]))
    fn = lambda x, i, v: aten.index_put(x, [i], v, True)  # noqa: E731
    compiled = vfuse.compile(fn, (x, idx, v), strict=True)
    (k,) = _scatter_kernels(compiled)
    assert len(k.operands) == 3  # onto x: the init operand
    got = compiled(x, idx, v)
    assert torch.equal(got, _serial_index_put(x, idx, v)) and torch.equal(compiled(x, idx, v), got)
    bad = idx.clone()
    bad[-1] = -shape[0] - 1
    with pytest.raises(VfuseIndexError, match=f"index {-shape[0] - 1} is out of bounds"):
        compiled(x, bad, v)


def test_indexing_backward_scatters_onto_zeros() -> None:
    """The backward of x[idx] is index_put onto zeros: the template zeroes (no init operand)."""
    torch._dynamo.reset()
    x, idx = torch.randn(9, 5, requires_grad=True), torch.tensor([4, -1, 4, 0, 8, 4])
    backend = vfuse.backend(strict=True)
    fn = lambda x: (x[idx] * 3).square().sum()  # noqa: E731
    (got,) = torch.autograd.grad(torch.compile(fn, backend=backend)(x), x)
    (want,) = torch.autograd.grad(fn(x), x)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    assert not backend.stats["fallbacks"], backend.stats
    kernels = [k for c in backend.compiled for k in _scatter_kernels(c)]
    assert [len(k.operands) for k in kernels] == [2]


@pytest.mark.parametrize(("shape", "dim"), [((5, 6, 4), 0), ((5, 6, 4), 1), ((3, 37), -1), ((1,), 0)])
def test_scatter_add_is_one_scatter_and_bit_exact(shape, dim) -> None:
    torch.manual_seed(0)
    s, src = torch.randn(shape), torch.randn(shape)
    idx = torch.randint(0, shape[dim], shape)
    fn = lambda s, i, src: s.scatter_add(dim, i, src)  # noqa: E731
    compiled = vfuse.compile(fn, (s, idx, src), strict=True)
    assert len(_scatter_kernels(compiled)) == 1
    assert torch.equal(compiled(s, idx, src), fn(s, idx, src))


def test_embedding_backward_with_symbolic_lengths_compiles_once() -> None:
    """dynamic=True: the scatter takes its sizes at run time, so one backward serves every length
    (not compiled per shape), each gradient eager's bit for bit."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    emb = torch.nn.Embedding(50, 8, padding_idx=0)
    fn = torch.compile(lambda t: emb(t).square().sum(), backend=vfuse.backend(strict=True), dynamic=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (7, 11, 13):
            tokens = torch.randint(0, 50, (2, n))
            emb.zero_grad()
            fn(tokens).backward()
            got = emb.weight.grad.clone()
            emb.zero_grad()
            emb(tokens).square().sum().backward()
            assert torch.equal(got, emb.weight.grad), n
    assert not [w for w in caught if "compiled per shape" in str(w.message)]


@pytest.mark.parametrize(
    ("shape", "dim", "n"), [((6, 7, 5), 0, 23), ((6, 7, 5), 1, 3), ((2, 31), -1, 64), ((1,), 0, 1)]
)
def test_index_add_is_one_scatter_and_bit_exact(shape, dim, n) -> None:
    torch.manual_seed(0)
    x, idx = torch.randn(shape), torch.randint(0, shape[dim], (n,))
    src_shape = list(shape)
    src_shape[dim] = n
    src = torch.randn(src_shape)
    fn = lambda x, i, s: x.index_add(dim, i, s)  # noqa: E731
    compiled = vfuse.compile(fn, (x, idx, src), strict=True)
    assert len(_scatter_kernels(compiled)) == 1
    assert torch.equal(compiled(x, idx, src), fn(x, idx, src))
    bad = idx.clone()
    bad[-1] = -1
    with pytest.raises(VfuseIndexError, match="index -1 is out of bounds"):
        compiled(x, bad, src)


def test_large_embedding_backward_on_a_gpu_target_scatters_in_torch() -> None:
    """GPU targets keep the one-hot form for small tables only (lower_gather.GPU_ONE_HOT_TERMS): a
    large one is a SCATTER_ADD that the Triton backend runs in torch (Triton's interpreter here)."""
    pytest.importorskip("triton")
    g, idx = torch.randn(2, 256, 8), torch.randint(0, 5000, (2, 256))
    fn = lambda g, i: aten.embedding_dense_backward(g, i, 5000, 3, False)  # noqa: E731
    compiled = vfuse.compile(fn, (g, idx), backend="triton", target="h100", strict=True)
    steps = [s for s in compiled.compiled.executor.program.steps if isinstance(s, TorchStep)]
    assert len(steps) == 1 and "no Triton template for scatter_add" in steps[0].reason
    assert torch.equal(compiled(g, idx), fn(g, idx))


AVG_POOLS = [
    # (x shape, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override, walk)
    ((2, 3, 13, 11), 3, 2, 1, False, True, None, ScatterWalk.SERIAL),
    ((1, 2, 7, 9), 3, 2, 1, True, False, None, ScatterWalk.SERIAL),  # ceil_mode past the padding
    ((3, 7, 5), (3, 2), (1, 2), (1, 0), True, True, None, ScatterWalk.SERIAL),  # unbatched
    ((2, 5, 47, 53), 3, 1, 1, False, False, 5, ScatterWalk.ROW_RANGES),
    ((4, 8, 37, 41), 3, 2, 1, True, True, None, ScatterWalk.PLANES),
]


@pytest.mark.parametrize(("shape", "k", "s", "p", "ceil", "include", "override", "walk"), AVG_POOLS)
def test_avg_pool2d_backward_is_one_scatter_and_bit_exact(shape, k, s, p, ceil, include, override, walk, threads):
    """Each window's gradient divided once, then spread over its taps (a CONSTANT index row, padded
    taps skipped) in eager's order: bit for bit, every walk and thread count."""
    torch.manual_seed(0)
    x = torch.randn(shape)
    y = F.avg_pool2d(x, k, s, p, ceil, include, override)
    g = torch.randn_like(y)
    pair = lambda v: [v, v] if isinstance(v, int) else list(v)  # noqa: E731
    fn = lambda g, x: aten.avg_pool2d_backward(g, x, pair(k), pair(s), pair(p), ceil, include, override)  # noqa: E731
    compiled = vfuse.compile(fn, (g, x), strict=True)
    (kernel,) = _scatter_kernels(compiled)
    assert kernel.scatter is walk and kernel.attrs["taps"] == pair(k)[0] * pair(k)[1]
    assert torch.equal(compiled(g, x), fn(g, x))
