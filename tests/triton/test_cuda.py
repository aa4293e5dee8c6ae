"""backend="triton" on a real GPU (skipped without CUDA; benchmarks/device_check.sh runs them on a lent
H200): kernels on CUDA tensors against eager, the lean launcher on misaligned views, faults, CUDA
Graphs (warm-up, one capture, replays, parameters in place, fresh or static outputs, dropout per
call), torch.compile with CUDA tensors, and the offline registers against the driver's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import vfuse
from vfuse.runtime.cudagraphs import GraphStats
from vfuse.runtime.triton import LeanLaunch, TritonExecutor

pytest.importorskip("triton", reason="triton is not installed (pip install 'vfuse[gpu]')")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
TARGET = "h100"


def _compile(fn: Callable, args: tuple[Any, ...], capture: str = "always", **options: Any) -> Any:
    """capture="always": every input-shape key is captured (the mechanics under test), not only
    where the cost model predicts a replay wins ("cost")."""
    compiled = vfuse.compile(fn, args, backend="triton", target=TARGET, **options)
    if capture == "always":
        _executor(compiled).replay_cost = None
    return compiled


def _executor(compiled: Any) -> TritonExecutor:
    ex = compiled.compiled.executor
    assert isinstance(ex, TritonExecutor)
    return ex


def _graphs(compiled: Any) -> GraphStats:
    stats = _executor(compiled).stats.cuda_graphs
    assert stats is not None
    return stats


CASES: dict[str, tuple[Callable, Callable[[], tuple[torch.Tensor, ...]]]] = {
    "pointwise": (lambda x, y: (x * y + 1).relu().tanh(), lambda: (torch.randn(37, 41), torch.randn(41))),
    "layernorm_gelu": (
        lambda x, w: F.gelu(F.layer_norm(x, (1000,), w)),
        lambda: (torch.randn(33, 1000), torch.randn(1000)),
    ),
    "softmax_long": (lambda x: torch.softmax(x, -1), lambda: (torch.randn(5, 9001),)),
    "column_sum": (lambda x: x.sum(0) + x.amax(0), lambda: (torch.randn(300, 77),)),
    "bf16_rms_silu": (
        lambda x, w: F.silu(F.rms_norm(x.bfloat16(), (256,), w.bfloat16())).float(),
        lambda: (torch.randn(64, 256), torch.randn(256)),
    ),
    # an odd count: mask-free full blocks (16-byte accesses), the tail program masked; a bool output
    "pointwise_odd": (lambda x, y: ((x - y).sigmoid(), x > y), lambda: (torch.randn(100003), torch.randn(100003))),
    "linear_gelu": (lambda x, w: F.gelu(x @ w.t()), lambda: (torch.randn(130, 96), torch.randn(70, 96))),
    "fp8_linear": (  # fp8 operands straight into an fp8 wgmma, the scales on the accumulator
        lambda a, b: (a.float() * 0.5) @ (b.float() * 0.25).t(),
        lambda: (torch.randn(130, 96).to(torch.float8_e4m3fn), torch.randn(70, 96).to(torch.float8_e4m3fn)),
    ),
    "attention_causal": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        lambda: tuple(torch.randn(2, 3, 65, 32) for _ in range(3)),
    ),
    # NHWC implicit GEMM (K steps within a tap: 32 channels), a channels-last image and a BN epilogue
    "bf16_conv_nhwc_bn_relu": (
        lambda x, w, m, v: F.batch_norm(F.conv2d(x, w, padding=1), m, v, training=False).relu(),
        lambda: (
            torch.randn(2, 32, 9, 11).bfloat16().contiguous(memory_format=torch.channels_last),
            torch.randn(24, 32, 3, 3).bfloat16() * 0.1,
            torch.randn(24).bfloat16(),
            torch.rand(24).bfloat16() + 0.5,
        ),
    ),
    "conv_nhwc_odd_channels_stride2": (  # 3 channels: K lanes decode their tap
        lambda x, w: F.conv2d(x, w, stride=2, padding=1),
        lambda: (torch.randn(1, 3, 13, 10), torch.randn(8, 3, 3, 3)),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("graphs", [False, True])
def test_cuda_matches_eager(case: str, graphs: bool) -> None:
    fn, make = CASES[case]
    args = tuple(t.cuda() for t in make())
    compiled = _compile(fn, args, cuda_graphs=graphs)
    want = fn(*args)
    # bf16 outputs: eager rounds to bf16 after each op, vfuse once at the end (one bf16 ulp apart)
    tol = 1.6e-2 if case.startswith("bf16") else 2e-3
    for _ in range(3):  # warm-up, capture + replay, replay
        torch.testing.assert_close(compiled(*args), want, rtol=tol, atol=tol)
    s = _graphs(compiled)
    if graphs:
        assert (s.warmups, s.captures, s.replays) == (1, 1, 2), s
    else:
        assert s.captures == 0 and s.blocker == "the cuda_graphs option is off"


def test_graph_replays_read_new_inputs_and_return_fresh_outputs() -> None:
    fn = lambda x, w: F.layer_norm(x, (512,), w).relu()  # noqa: E731
    w = torch.randn(512, device="cuda")
    xs = [torch.randn(64, 512, device="cuda") for _ in range(5)]
    compiled = _compile(fn, (xs[0], w))
    outs = [compiled(x, w) for x in xs]
    torch.cuda.synchronize()
    for x, out in zip(xs, outs, strict=True):
        torch.testing.assert_close(out, fn(x, w))
    assert len({o.data_ptr() for o in outs}) == len(outs)
    s = _graphs(compiled)
    assert (s.warmups, s.captures, s.replays) == (1, 1, 4)


def test_parameters_are_read_in_place_by_the_graph() -> None:
    w = torch.nn.Parameter(torch.randn(256, device="cuda"), requires_grad=False)
    fn = lambda x, w: torch.sigmoid(x * w)  # noqa: E731
    x = torch.randn(32, 256, device="cuda")
    compiled = _compile(fn, (x, w))
    for _ in range(3):
        compiled(x, w)
    w.mul_(-2)
    torch.testing.assert_close(compiled(x, w), fn(x, w))
    (cap,) = _executor(compiled)._graphs[x.device]._graphs.values()
    # x, passed again at its address, is held too: the replay copies nothing
    assert cap.inputs[1] is w and cap.inputs[0] is x and cap.copied == () and _graphs(compiled).captures == 1
    x2 = torch.randn(32, 256, device="cuda")  # another x: copied from then on (captured once more)
    torch.testing.assert_close(compiled(x2, w), fn(x2, w))
    (cap,) = _executor(compiled)._graphs[x.device]._graphs.values()
    assert cap.inputs[1] is w and cap.copied == (0,) and _graphs(compiled).captures == 2


def test_static_outputs_reuse_the_captured_buffer() -> None:
    x = torch.randn(1000, device="cuda")
    compiled = _compile(torch.exp, (x,), static_outputs=True)
    compiled(x)
    a = compiled(x)
    b = compiled(x * 2)
    assert a.data_ptr() == b.data_ptr()
    torch.testing.assert_close(b, torch.exp(x * 2))


def test_dropout_differs_per_replay_and_matches_the_uncaptured_sequence() -> None:
    fn = lambda x: F.dropout(x, 0.5, training=True)  # noqa: E731
    x = torch.ones(64, 128, device="cuda")
    graphed, plain = _compile(fn, (x,)), _compile(fn, (x,), cuda_graphs=False)
    torch.manual_seed(3)
    a = [graphed(x).clone() for _ in range(4)]
    torch.manual_seed(3)
    b = [plain(x).clone() for _ in range(4)]
    for u, v in zip(a, b, strict=True):
        torch.testing.assert_close(u, v)
    assert len({tuple(u.flatten()[:256].tolist()) for u in a}) == 4
    assert _graphs(graphed).replays == 3


def test_misaligned_views_and_faults() -> None:
    base = torch.randn(1001, device="cuda")
    compiled = _compile(lambda t: t * 3 + 1, (base[:1000],))
    for view in (base[:1000], base[1:], base[:1000]):
        torch.testing.assert_close(compiled(view), view * 3 + 1)
    emb = lambda i, t: F.embedding(i, t) * 2  # noqa: E731
    i, t = torch.tensor([[0, 3]], device="cuda"), torch.randn(4, 8, device="cuda")
    ce = _compile(emb, (i, t))
    torch.testing.assert_close(ce(i, t), emb(i, t))
    with pytest.raises(IndexError):
        ce(torch.tensor([[0, 4]], device="cuda"), t)
    assert "record faults" in _graphs(ce).blocker


def test_torch_compile_with_cuda_tensors() -> None:
    backend = vfuse.backend(backend="triton", target=TARGET, strict=True)
    fn = torch.compile(lambda x, w: F.rms_norm(x * 2, (64,), w), backend=backend, dynamic=False)
    x, w = torch.randn(8, 64, device="cuda"), torch.randn(64, device="cuda")
    for _ in range(3):
        torch.testing.assert_close(fn(x, w), F.rms_norm(x * 2, (64,), w))


def test_offline_registers_equal_the_drivers() -> None:
    x = torch.randn(64, 4096, device="cuda")
    compiled = _compile(lambda t: torch.softmax(t, -1), (x,), cuda_graphs=False)
    compiled(x)
    ex = _executor(compiled)
    launches = [run for run in ex._memory[x.device].launchers.values() if isinstance(run, LeanLaunch)]
    for run, kernel in zip(launches, ex.kernels, strict=False):
        (loaded,) = run.kernels.values()
        offline = kernel.resources(sm=int("".join(map(str, torch.cuda.get_device_capability()))))
        assert loaded.n_regs == offline["registers"] and loaded.n_spills == offline["spill_bytes"] == 0


def test_the_cost_model_leaves_large_inputs_and_single_kernels_uncaptured() -> None:
    """A replay copies inputs into static buffers: for one kernel over 64 MiB inputs it is
    predicted slower than launching, so calls run uncaptured and say why; results stay right."""
    x, y = torch.randn(4096, 4096, device="cuda"), torch.randn(4096, 4096, device="cuda")
    compiled = _compile(lambda a, b: (a + b).relu(), (x, y), capture="cost")
    for _ in range(3):
        torch.testing.assert_close(compiled(x, y), (x + y).relu())
    s = _graphs(compiled)
    assert s.captures == 0 and s.uncaptured == 2 and "copy" in s.declined, s


def test_the_autotuner_compiles_candidates_ahead_then_times_them(tmp_path: Any) -> None:
    """The first CUDA call of a GEMM with an empty autotune cache: every candidate compiled
    concurrently before timing (`TemplateTimer.prepare`), each timed by launching its compiled
    kernel; the choice runs and matches eager."""
    fn = lambda x, w: F.gelu(x @ w.t())  # noqa: E731
    x, w = torch.randn(256, 192, device="cuda"), torch.randn(320, 192, device="cuda")
    compiled = _compile(fn, (x, w), cache_dir=tmp_path)
    torch.testing.assert_close(compiled(x, w), fn(x, w), rtol=2e-3, atol=2e-3)
    tuner = _executor(compiled).autotuner
    assert tuner is not None and tuner.timed >= 2 and tuner.compile_s > 0, tuner
    print(f"autotune: {tuner.timed} candidates compiled ahead in {tuner.compile_s:.1f} s")


def test_the_first_call_loads_the_kernels_compiled_ahead() -> None:
    """Every kernel compiled at once before the first launch (`offline.precompile`); the JIT's
    launches then load those very kernels from Triton's cache (same hash), not new compiles."""
    fn = lambda x: (torch.softmax(x, -1), x.sum(0))  # noqa: E731
    x = torch.randn(37, 1001, device="cuda")
    compiled = _compile(fn, (x,), cuda_graphs=False)
    for got, want in zip(compiled(x), fn(x), strict=True):
        torch.testing.assert_close(got, want)
    ex = _executor(compiled)
    ahead = {f.result().hash for f in ex.precompiled.values()}
    launched = {k.hash for run in ex._memory[x.device].launchers.values() if isinstance(run, LeanLaunch)
                for k in run.kernels.values()}  # fmt: skip
    assert launched and launched <= ahead, (launched, ahead)
    print(f"precompiled {len(ahead)} kernels in {ex.precompile_s:.2f} s")
