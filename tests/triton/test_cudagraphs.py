"""CUDA Graph policy (runtime/cudagraphs.py) with a fake driver on CPU tensors: the Triton executor's
graph path runs in Triton's interpreter, the fake records pools, captures and replays (a replay
reruns the captured work on the captured tensors, as a CUDA graph replays on its addresses).
Checked: warm-up then one capture per input-shape key, replays after, inputs copied into static
buffers whose addresses never change, parameters read in place, the seed written per call (dropout
differs per call and matches the uncaptured run), graphs that cannot be captured never are (the
reason recorded), and static_outputs as on the CPU. Plus the lean launcher's kernel reuse per
pointer alignment with a fake jit function."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from tests.triton.triton_cases import compile_triton

from vfuse.entry.observe import CompileStats
from vfuse.runtime.cudagraphs import GraphStats, ReplayCost
from vfuse.runtime.triton import LeanLaunch, TritonExecutor

pytest.importorskip("triton", reason="triton is not installed (pip install 'vfuse[gpu]')")


class FakeGraph:
    def __init__(self, driver: FakeDriver, body: Callable[[], None]) -> None:
        self.driver, self.body = driver, body

    def replay(self) -> None:
        self.driver.replays += 1
        self.body()


class FakeDriver:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pools: list[object] = []
        self.captures = self.replays = self.syncs = 0
        self.capturing = False

    def new_pool(self) -> object:
        self.pools.append(object())
        return self.pools[-1]

    def capture(self, body: Callable[[], None], pool: Any) -> FakeGraph:
        assert pool in self.pools
        self.captures += 1
        self.capturing = True
        try:
            body()  # records the work; a real capture runs nothing, so the runner must replay
        finally:
            self.capturing = False
        return FakeGraph(self, body)

    def synchronize(self) -> None:
        self.syncs += 1


def _graphed(fn: Callable, args: tuple[torch.Tensor, ...], **options: Any) -> tuple[Any, TritonExecutor, list]:
    compiled = compile_triton(fn, args, **options)
    ex = compiled.compiled.executor
    assert isinstance(ex, TritonExecutor)
    drivers: list[FakeDriver] = []
    ex.driver = lambda d: drivers.append(FakeDriver(d)) or drivers[-1]
    ex.graph_devices = ("cpu",)
    ex.replay_cost = None  # capture every key: these tests check the mechanics, not the policy
    return compiled, ex, drivers


def _stats(ex: TritonExecutor) -> GraphStats:
    assert ex.stats.cuda_graphs is not None
    return ex.stats.cuda_graphs


def test_warm_up_then_capture_once_then_replay_with_inputs_copied() -> None:
    fn = lambda x, w: F.layer_norm(x, (13,), w).relu() * 2  # noqa: E731
    x, w = torch.randn(7, 13), torch.randn(13)
    compiled, ex, drivers = _graphed(fn, (x, w))
    xs = [x, *(torch.randn(7, 13) for _ in range(3))]
    seen = [compiled(xi, w) for xi in xs]
    (driver,) = drivers
    assert CompileStats.of([compiled.compiled]).cuda_graphs == {"captured": 1}
    s = _stats(ex)
    assert (s.warmups, s.captures, s.replays, s.uncaptured) == (1, 1, 3, 0)
    assert (driver.captures, driver.replays, len(driver.pools)) == (1, 3, 1)
    (cap,) = ex._graphs[torch.device("cpu")]._graphs.values()
    # x: a new tensor per call, copied into its static buffer; w: passed again at its address
    # (the warm-up's), so it is held: read in place, never copied
    assert cap.copied == (0,) and cap.pinned == {1: w.data_ptr()} and cap.inputs[1] is w
    assert s.copies == 3
    ptrs = [t.data_ptr() for t in cap.inputs]
    compiled(x, w)
    assert [t.data_ptr() for t in cap.inputs] == ptrs and torch.equal(cap.inputs[0], x)
    # fresh outputs by default: no result is overwritten by a later call
    assert len({o.data_ptr() for o in seen}) == len(seen)
    for xi, out in zip(xs, seen, strict=True):
        torch.testing.assert_close(out, fn(xi, w))


def test_inputs_passed_again_are_read_in_place_until_one_moves() -> None:
    """A caller reusing its input buffers: the replay copies nothing and reads what is in them
    now (updated in place too); a buffer at another address later is copied from then on (one
    capture more), the others stay held."""
    fn = lambda x, y: torch.relu(x + y) * y  # noqa: E731
    x, y = torch.randn(5, 11), torch.randn(5, 11)
    compiled, ex, drivers = _graphed(fn, (x, y))
    for _ in range(3):
        torch.testing.assert_close(compiled(x, y), fn(x, y))
    x.mul_(-2)  # in place: the held buffer is what the graph reads
    torch.testing.assert_close(compiled(x, y), fn(x, y))
    s = _stats(ex)
    assert (s.warmups, s.captures, s.replays, s.copies) == (1, 1, 3, 0)
    (cap,) = ex._graphs[torch.device("cpu")]._graphs.values()
    assert cap.copied == () and cap.inputs[0] is x and cap.inputs[1] is y
    x2 = torch.randn(5, 11)
    for xi in (x2, torch.randn(5, 11), x):  # x moved: copied for good, even when x comes back
        torch.testing.assert_close(compiled(xi, y), fn(xi, y))
    (cap,) = ex._graphs[torch.device("cpu")]._graphs.values()
    assert cap.copied == (0,) and cap.pinned == {1: y.data_ptr()} and cap.inputs[0] is not x
    assert (s.captures, s.replays, s.copies, drivers[0].captures) == (2, 6, 3, 2)
    assert "(3 input copies)" in s.describe()


def test_a_held_input_that_moves_is_priced_again_with_its_copy() -> None:
    """Captured without copies (x held), the key is priced again once x moves: a copy of a
    large input against one launch saved is declined, and the key runs uncaptured."""
    fn = lambda x: x.exp() * 2  # noqa: E731
    x = torch.randn(64, 64)
    compiled, ex, _ = _graphed(fn, (x,), static_outputs=True)
    ex.replay_cost = ReplayCost(launches=2, device_s=1e-9, launch_s=3e-6, bandwidth=1e9)  # a copy: 32 us
    for _ in range(3):
        torch.testing.assert_close(compiled(x), fn(x))
    s = _stats(ex)
    assert (s.captures, s.replays, s.copies) == (1, 2, 0)
    x2 = torch.randn(64, 64)
    torch.testing.assert_close(compiled(x2), fn(x2))
    assert (s.captures, s.replays, s.uncaptured) == (1, 2, 1) and "copy 0.02 MiB in 1 copies" in s.declined
    torch.testing.assert_close(compiled(x), fn(x))  # declined for good
    assert s.uncaptured == 2 and not ex._graphs[torch.device("cpu")]._graphs


def test_a_replay_draws_no_seed_for_a_graph_without_random_numbers() -> None:
    fn = lambda x: x.sigmoid() + 1  # noqa: E731
    x = torch.randn(6)
    compiled, ex, _ = _graphed(fn, (x,))
    seeds: list[int] = []
    ex.seed = lambda: seeds.append(1)  # type: ignore[method-assign]
    for _ in range(4):
        torch.testing.assert_close(compiled(x), fn(x))
    assert _stats(ex).replays == 3 and len(seeds) == 1  # the warm-up draws; replays skip seed()


def test_one_capture_per_input_shape_key() -> None:
    fn = lambda x: torch.softmax(x, -1)  # noqa: E731
    x = torch.randn(3, 5)
    _compiled, ex, _drivers = _graphed(fn, (x,))
    runner_inputs = [x, x.t().contiguous().t(), x, x.t().contiguous().t(), x]  # two stride keys
    for t in runner_inputs:
        torch.testing.assert_close(ex([t])[0], fn(t))
    s = _stats(ex)
    assert (s.warmups, s.captures, s.replays) == (2, 2, 3)
    assert len(ex._graphs[torch.device("cpu")]._graphs) == 2


def test_parameters_keep_their_address_and_a_moved_one_recaptures() -> None:
    lin = torch.nn.Parameter(torch.randn(9))
    fn = lambda x, w: torch.tanh(x * w) + w  # noqa: E731
    x = torch.randn(4, 9)
    _compiled, ex, _drivers = _graphed(fn, (x, lin.detach()))
    for _ in range(3):
        torch.testing.assert_close(ex([x, lin])[0], fn(x, lin).detach())
    (cap,) = ex._graphs[torch.device("cpu")]._graphs.values()
    assert cap.copied == () and cap.pinned == {0: x.data_ptr(), 1: lin.data_ptr()} and cap.inputs[1] is lin
    with torch.no_grad():
        lin.mul_(3)  # updated in place: read in place at replay, nothing copied
    torch.testing.assert_close(ex([x, lin])[0], fn(x, lin).detach())
    assert _stats(ex).captures == 1
    moved = torch.nn.Parameter(lin.detach().clone())
    torch.testing.assert_close(ex([x, moved])[0], fn(x, moved).detach())
    assert _stats(ex).captures == 2  # another address: captured again


def test_seed_written_per_call_so_dropout_differs_like_eager() -> None:
    fn = lambda x: F.dropout(x, 0.5, training=True) * 3  # noqa: E731
    x = torch.ones(6, 40)
    compiled, ex, _ = _graphed(fn, (x,))
    plain = compile_triton(fn, (x,))
    torch.manual_seed(7)
    graphed = [compiled(x) for _ in range(4)]
    torch.manual_seed(7)
    reference = [plain(x) for _ in range(4)]
    assert _stats(ex).replays == 3
    for g, r in zip(graphed, reference, strict=True):
        torch.testing.assert_close(g, r)  # same seeds drawn in the same order as uncaptured
    masks = [tuple((g == 0).flatten().tolist()) for g in graphed]
    assert len(set(masks)) == 4  # every call its own mask, replays included


def test_a_graph_with_faults_or_torch_fallbacks_is_never_captured() -> None:
    emb = lambda i, t: F.embedding(i, t) * 2  # noqa: E731
    i, t = torch.tensor([[0, 3], [2, 1]]), torch.randn(4, 6)
    compiled, ex, drivers = _graphed(emb, (i, t))
    for _ in range(3):
        torch.testing.assert_close(compiled(i, t), emb(i, t))
    s = _stats(ex)
    assert (s.captures, s.replays, s.uncaptured) == (0, 0, 3)
    assert "record faults" in s.blocker and s.describe().startswith("not captured")
    assert drivers[0].captures == 0
    summary = CompileStats.of([compiled.compiled])
    assert summary.cuda_graphs == {s.blocker: 1} and f"not captured ({s.blocker})" in str(summary)
    with pytest.raises(IndexError, match=r"out of range|out of bounds"):
        compiled(torch.tensor([[0, 9], [2, 1]]), t)  # faults still raised on uncaptured calls

    fallback = lambda x: torch.linalg.det(x).exp()  # noqa: E731
    x = torch.randn(3, 4, 4)
    compiled, ex, drivers = _graphed(fallback, (x,))
    for _ in range(3):
        torch.testing.assert_close(compiled(x), fallback(x))
    assert _stats(ex).captures == 0 and "may synchronize" in _stats(ex).blocker


def test_cuda_graphs_option_off_runs_uncaptured() -> None:
    fn = lambda x: x.sigmoid()  # noqa: E731
    x = torch.randn(5)
    compiled, ex, _drivers = _graphed(fn, (x,), cuda_graphs=False)
    for _ in range(3):
        torch.testing.assert_close(compiled(x), fn(x))
    assert _stats(ex).captures == 0 and _stats(ex).blocker == "the cuda_graphs option is off"


def test_static_outputs_return_the_captured_buffers() -> None:
    fn = lambda x: (x * 2).exp()  # noqa: E731
    x = torch.randn(3, 7)
    compiled, _ex, _ = _graphed(fn, (x,), static_outputs=True)
    compiled(x)  # warm-up
    a = compiled(x)
    x2 = torch.randn(3, 7)
    b = compiled(x2)
    assert a.data_ptr() == b.data_ptr()  # the next call overwrites: documented for static_outputs
    torch.testing.assert_close(a, fn(x2))


class _Kernel:
    def __init__(self, log: list) -> None:
        self.log, self.function, self.packed_metadata = log, object(), object()

    def run(self, *args: Any) -> None:
        assert args[4] is self.function and args[5] is self.packed_metadata  # the launcher's own handles
        self.log.append(("direct", args[:4], len(args) - 9))


class _Jit:
    def __init__(self) -> None:
        self.log: list = []

    def run(self, *args: Any, grid: tuple[int], warmup: bool, **options: int) -> _Kernel:
        self.log.append(("jit", grid, options, tuple(a.data_ptr() % 16 == 0 for a in args)))
        return _Kernel(self.log)


def test_lean_launch_reuses_the_kernel_per_pointer_alignment() -> None:
    fn = _Jit()
    run = LeanLaunch(fn, grid=5, warps=4, stream=lambda: 77, stages=3)
    a, b = torch.zeros(64), torch.zeros(64)
    run([a, b])
    run([a, b])
    run([a[1:], b])  # a misaligned view: Triton must specialize again
    run([a[1:], b])
    kinds = [e[0] for e in fn.log]
    assert kinds == ["jit", "direct", "jit", "direct"]
    assert fn.log[0] == ("jit", (5,), {"num_warps": 4, "num_stages": 3}, (True, True))
    assert fn.log[2][3] == (False, True)
    assert fn.log[1] == ("direct", (5, 1, 1, 77), 2)
    LeanLaunch(fn, grid=0, warps=1, stream=lambda: 0)([a])  # an empty grid launches nothing
    assert len(fn.log) == 4
    LeanLaunch(fn, grid=1, warps=2, stream=lambda: 0)([a])  # no stages: Triton's default
    assert fn.log[4][2] == {"num_warps": 2}


def test_a_capture_that_fails_runs_uncaptured_from_then_on() -> None:
    class Refusing(FakeDriver):
        def capture(self, body: Callable[[], None], pool: Any) -> FakeGraph:
            raise RuntimeError("operation not permitted when stream is capturing")

    fn = lambda x: x.exp() * 2  # noqa: E731
    x = torch.randn(9)
    compiled, ex, _ = _graphed(fn, (x,))
    ex.driver = Refusing
    for _ in range(4):
        torch.testing.assert_close(compiled(x), fn(x))
    s = _stats(ex)
    assert (s.warmups, s.captures, s.replays, s.uncaptured) == (1, 0, 0, 3)
    assert s.blocker == "capture failed: RuntimeError: operation not permitted when stream is capturing"


def test_replay_cost_verdicts() -> None:
    h200 = dict(launch_s=3e-6, bandwidth=4.8e12)
    # One kernel over two 128 MiB inputs: the copies cost more than the launch they replace.
    why = ReplayCost(launches=1, device_s=100e-6, **h200).verdict(256 << 20, 2, 128 << 20, 1)
    assert "copy 384.00 MiB in 3 copies" in why and "1 launch(es)" in why
    # A dozen launches over small inputs: one replay wins.
    assert ReplayCost(launches=12, device_s=5e-6, **h200).verdict(1 << 12, 1, 1 << 12, 1) == ""
    # Device-bound: launches hide behind the kernels, so the copies are pure loss.
    assert ReplayCost(launches=12, device_s=500e-6, **h200).verdict(16 << 20, 1, 16 << 20, 1)
    # static_outputs: no clones, no copies (parameters only): a replay of many launches wins.
    assert ReplayCost(launches=3, device_s=1e-6, **h200).verdict(0, 0, 0, 0) == ""


@pytest.mark.parametrize("launches", [1, 40])
def test_the_runner_follows_the_replay_cost(launches: int) -> None:
    fn = lambda x, y: (x * y + 1).relu()  # noqa: E731
    x, y = torch.randn(9, 31), torch.randn(9, 31)
    compiled, ex, drivers = _graphed(fn, (x, y))
    ex.replay_cost = ReplayCost(launches=launches, device_s=1e-6, launch_s=3e-6, bandwidth=1e12)
    for _ in range(3):
        torch.testing.assert_close(compiled(x, y), fn(x, y))
    s = _stats(ex)
    if launches == 1:  # 2 copies + 1 clone + the replay: 4 launches for 1
        assert (s.captures, s.uncaptured) == (0, 2) and drivers[0].captures == 0
        assert s.describe().startswith("not captured (cost model): a replay would copy")
    else:
        assert (s.captures, s.replays, s.declined) == (1, 2, "")


def test_an_input_only_torch_reads_keeps_its_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inputs are made row-major only for the kernels that index them: a channels-last image
    that only a torch step reads reaches torch channels-last (cuDNN's fast layout)."""
    import vfuse.runtime.steps as steps

    seen: list[tuple[int, ...]] = []
    run = steps.interp.run_node

    def spy(node: Any, args: list[Any]) -> Any:
        seen.extend(tuple(a.stride()) for a in args if isinstance(a, torch.Tensor) and a.dim() == 4)
        return run(node, args)

    x = torch.randn(2, 5, 7, 3).contiguous(memory_format=torch.channels_last)
    fn = lambda x, y: torch.sort(x, -1).values * 2 + y  # noqa: E731
    y = torch.randn(3)
    compiled = compile_triton(fn, (x, y))
    monkeypatch.setattr(steps.interp, "run_node", spy)
    torch.testing.assert_close(compiled(x, y), fn(x, y))
    assert x.stride() in seen  # sort (torch) got the channels-last tensor itself
