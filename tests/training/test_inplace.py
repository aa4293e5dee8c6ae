"""Input updates written in place (entry/mutations.py, schedule/inplace.py): an inference graph's
`copy_(input, value)` becomes a store into the input's memory where no later read needs the old
value, else a fresh output copied in after the call; the numbers are eager's either way."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import vfuse
from vfuse.schedule.printer import format_program


def count_copies(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts Tensor.copy_ calls from Python: AOTAutograd's epilogue copies each updated input
    with one (so does vfuse for an update it could not write in place)."""
    count = [0]
    real = torch.Tensor.copy_

    def counting(self: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        count[0] += 1
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "copy_", counting)
    return count


def _compiled_graphs(backend: vfuse.backend) -> list:
    return [c for c in backend.compiled if c.stats.backend == "cpp"]


@pytest.mark.parametrize("make", [
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01),
    lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, foreach=True),
], ids=["sgd_momentum", "adamw_foreach"])  # fmt: skip
def test_optimizer_step_writes_every_update_in_place(make: Callable, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every parameter and state tensor, of odd sizes (one of 1 element), is stored into
    by the step's kernel: no copy_ runs during a compiled step (AOTAutograd's epilogue made one
    per updated tensor), the tensors keep their storage, and the values are eager's bit for bit
    (SGD) / state bit for bit and parameters to the fp32 bias correction's error (AdamW)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    init = [torch.randn(s) for s in ((1,), (7,), (1003,), (13, 31))]
    eager = [torch.nn.Parameter(p.clone()) for p in init]
    comp = [torch.nn.Parameter(p.clone()) for p in init]
    opt_e, opt_c = make(eager), make(comp)
    backend = vfuse.backend(strict=True)
    step = torch.compile(lambda: opt_c.step(), backend=backend)
    for n in range(4):
        for pe, pc in zip(eager, comp, strict=True):
            pe.grad = torch.randn(pe.shape)
            pc.grad = pe.grad.clone()
        opt_e.step()
        if n < 2:
            step()  # compiles: the first step makes the state, the second is the steady state's
            ptrs = [t.data_ptr() for p in comp for t in (p, *opt_c.state[p].values())]
            continue
        with monkeypatch.context() as m:
            copies = count_copies(m)
            step()
        assert copies == [0]
        assert [t.data_ptr() for p in comp for t in (p, *opt_c.state[p].values())] == ptrs
    graph = _compiled_graphs(backend)[-1]  # the steady state (the first step made the state)
    assert len(graph.in_place) == sum(1 + len(opt_c.state[p]) for p in comp)
    assert graph.graph.outputs == ()  # nothing left to return
    lr = opt_e.param_groups[0]["lr"]
    for pe, pc in zip(eager, comp, strict=True):
        for k, v in opt_e.state[pe].items():
            torch.testing.assert_close(opt_c.state[pc][k], v, rtol=0, atol=0)
        atol = 0 if isinstance(opt_e, torch.optim.SGD) else 1e-4 * lr
        torch.testing.assert_close(pc.detach(), pe.detach(), rtol=0, atol=atol)


@pytest.mark.parametrize("make", [
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
], ids=["sgd_momentum", "adamw"])  # fmt: skip
def test_non_contiguous_and_empty_parameters(make: Callable) -> None:
    """A transposed parameter (AdamW's state too: zeros_like keeps the strides; SGD's momentum
    is a clone of the contiguous gradient) cannot be stored into row-major: its update returns
    a fresh value copied in; a parameter of 0 elements has nothing to write; the others are
    written in place. Eager's values."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    init = [torch.randn(31, 13).t(), torch.randn(17), torch.randn(0)]
    eager = [torch.nn.Parameter(p.clone(memory_format=torch.preserve_format)) for p in init]
    comp = [torch.nn.Parameter(p.clone(memory_format=torch.preserve_format)) for p in init]
    assert not comp[0].is_contiguous()
    opt_e, opt_c = make(eager), make(comp)
    backend = vfuse.backend(strict=True)
    step = torch.compile(lambda: opt_c.step(), backend=backend)
    lr = opt_e.param_groups[0]["lr"]
    for _ in range(3):
        for pe, pc in zip(eager, comp, strict=True):
            pe.grad = torch.randn(pe.shape)
            pc.grad = pe.grad.clone()
        opt_e.step()
        step()
        for pe, pc in zip(eager, comp, strict=True):
            atol = 0 if isinstance(opt_e, torch.optim.SGD) else 1e-4 * lr
            torch.testing.assert_close(pc.detach(), pe.detach(), rtol=0, atol=atol)
            for k, v in opt_e.state[pe].items():
                torch.testing.assert_close(opt_c.state[pc][k], v, rtol=0, atol=0)
    graph = _compiled_graphs(backend)[-1]
    updated = [t for p in comp for t in (p, *opt_c.state[p].values())]
    assert 0 < len(graph.in_place) <= sum(t.is_contiguous() for t in updated) < len(updated)


def _inputs(shapes: tuple[tuple[int, ...], ...]) -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(s) for s in shapes]


def _x_plus_1_sum(x, w):
    s = (x * w).sum()  # reads x before its update
    x.add_(1)
    return s


def _transposed(x):
    x.copy_(x.t() * 2 + 1)  # element (i, j) reads (j, i): the old values are needed after stores


def _old_read_by_a_later_kernel(x, y):
    old = torch.softmax(x, 0)  # a column kernel after the update's pointwise kernel
    x.mul_(y)
    return old


def _scaled_by_its_sum(x):
    s = x.sum()  # a full reduction over x, then every element rewritten: threaded
    x.mul_(s)
    return s


def _softmax_of_the_update(x, y):
    x.mul_(y)
    return torch.softmax(x, 0)  # one column kernel storing the update and reading x in every pass


def _flipped(x, y):
    x.add_(x.flip(0))
    return x * y  # the new x, returned from the updated input


def _swap_updates(a, b):
    a.add_(b)
    b.add_(a)  # reads the new a


def _softmax_in_place(x):
    x.copy_(torch.softmax(x, -1))  # a row kernel: every pass reads x before the last stores it


def _running_mean(s, x):
    s.mul_(0.9).add_(x.mean(0), alpha=0.1)
    return x - s  # reads the new s


def _update_and_return_it(x, y):
    x.mul_(2)
    return x, x + y  # the updated input itself is an output


def _read_old_after(x, y):
    x.copy_(y * 2)  # a new value computed from another input only
    return (x * 3).sum(1), y.sum(0) * x  # the new x, in a row and in a column reduction


CASES = {
    "read_before_update": (_x_plus_1_sum, ((67, 5), (67, 5))),
    "transposed_self_read": (_transposed, ((37, 37),)),
    "flipped_self_read": (_flipped, ((41, 3), (41, 3))),
    "updates_reading_each_other": (_swap_updates, ((1009,), (1009,))),
    "softmax_rows": (_softmax_in_place, ((13, 257),)),
    "running_mean": (_running_mean, ((29,), (61, 29))),
    "update_returned": (_update_and_return_it, ((5, 7), (5, 7))),
    "scaled_by_its_sum": (_scaled_by_its_sum, ((257, 131),)),
    "softmax_of_the_update": (_softmax_of_the_update, ((19, 7), (19, 7))),
    "new_value_read_after": (_read_old_after, ((23, 11), (23, 11))),
    "old_value_read_after": (_old_read_by_a_later_kernel, ((19, 7), (19, 7))),
}


@pytest.mark.parametrize("name", list(CASES))
def test_updates_match_eager(name: str) -> None:
    """Aliasing cases: reads of an input's old value in the writing kernel (other elements) or in
    later kernels, updates reading each other, the updated input returned. The updated inputs
    and the outputs are eager's (the softmax to its rounding)."""
    fn, shapes = CASES[name]
    torch._dynamo.reset()
    eager_in, comp_in = _inputs(shapes), _inputs(shapes)
    backend = vfuse.backend(strict=True)
    compiled = torch.compile(fn, backend=backend)
    with torch.no_grad():
        for _ in range(2):
            want, got = fn(*eager_in), compiled(*comp_in)
            for w, g in zip(eager_in, comp_in, strict=True):
                torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
            # Sums of up to 257 terms of |6y| in another order than eager's (the scalar tier adds
            # sequentially): a few ulps of the terms' size, not of the result's.
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
    assert backend.stats["eager_graphs"] == 0


def test_batch_norm_train_mode_without_grad_updates_running_stats() -> None:
    """An inference graph (no_grad) of a train-mode BatchNorm: its running mean, variance and
    batch count are updated as eager's over several calls, its output is eager's."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    make = lambda: torch.nn.Sequential(torch.nn.Conv2d(3, 5, 3), torch.nn.BatchNorm2d(5), torch.nn.ReLU())  # noqa: E731
    eager = make().train()
    comp = make().train()
    comp.load_state_dict(eager.state_dict())
    compiled = torch.compile(comp, backend=vfuse.backend(strict=True))
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 3, 9, 11)
            torch.testing.assert_close(compiled(x), eager(x), rtol=1e-5, atol=1e-5)
    for name, want in eager.state_dict().items():
        torch.testing.assert_close(comp.state_dict()[name], want, rtol=1e-5, atol=1e-6, msg=name)


def test_non_contiguous_input_at_call_time_runs_on_a_copy() -> None:
    """A graph compiled for a contiguous input written in place, called with a strided one of
    the same shape (a per-shape compile does not guard strides): the update reaches the input.
    Profiling the graph leaves its inputs as they were."""

    def update(p, g):
        p.copy_(p - 0.5 * g)
        return ()

    p, g = torch.randn(6, 4), torch.randn(6, 4)
    gm = make_fx(update)(p.clone(), g)
    backend = vfuse.backend(strict=True)
    fn = backend.compile_static(gm, {}, "inference", [p, g])
    assert backend.compiled[0].in_place == (0,)
    want = p - 0.5 * g
    fn([p, g])
    torch.testing.assert_close(p, want, rtol=0, atol=0)
    strided = torch.randn(4, 6).t()
    want = strided - 0.5 * g
    fn([strided, g])
    torch.testing.assert_close(strided, want, rtol=0, atol=0)
    before = p.clone()
    assert backend.compiled[0].profile(p, g, reps=2)  # times the kernel on a copy of p
    torch.testing.assert_close(p, before, rtol=0, atol=0)


def test_softmax_written_in_place_in_its_row_kernel() -> None:
    """Structure: a row kernel reading its input in every pass stores the result into it."""
    torch._dynamo.reset()
    backend = vfuse.backend(strict=True)
    x = torch.randn(8, 300)
    want = F.softmax(x, -1)
    with torch.no_grad():
        torch.compile(_softmax_in_place, backend=backend)(x)
    torch.testing.assert_close(x, want)
    (graph,) = _compiled_graphs(backend)
    assert graph.in_place == (0,) and graph.executor.program.in_place


def test_an_updated_input_returned_is_the_input_itself() -> None:
    """`return x.mul_(2)` (the graph returns copy_'s result): the caller gets its own tensor,
    updated; with a torch step (index_put) and with an int counter and a bool mask beside it."""

    def fn(x, n, m, i, v):
        n.add_(1)
        m.logical_or_(x > 0)
        return x.mul_(2), x.index_put_((i,), v)

    def make() -> list[torch.Tensor]:
        torch.manual_seed(0)
        return [torch.randn(9), torch.tensor(3), torch.zeros(9, dtype=torch.bool), torch.tensor([1, 4]), torch.randn(2)]

    torch._dynamo.reset()
    eager, comp = make(), make()
    compiled = torch.compile(fn, backend=vfuse.backend(strict=True))
    with torch.no_grad():
        for _ in range(2):
            fn(*eager)
            first, second = compiled(*comp)
            assert first is comp[0] and second is comp[0]
            for w, g in zip(eager, comp, strict=True):
                torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_threaded_updates_share_one_parallel_region() -> None:
    """Parameters big enough to fork threads (32K elements and more): their loops share one
    parallel region without barriers between them (codegen/cpp/horizontal.py), the step
    counters (read by every part's bias correction) are written last; eager's state bit for bit."""
    from vfuse.codegen.cpp.horizontal import SHARED_LOOP

    torch._dynamo.reset()
    torch.manual_seed(0)
    init = [torch.randn(s) for s in ((257, 131), (40009,), (5,))]
    eager = [torch.nn.Parameter(p.clone()) for p in init]
    comp = [torch.nn.Parameter(p.clone()) for p in init]
    opt_e = torch.optim.AdamW(eager, lr=1e-2, weight_decay=0.1)
    opt_c = torch.optim.AdamW(comp, lr=1e-2, weight_decay=0.1)
    backend = vfuse.backend(strict=True)
    step = torch.compile(lambda: opt_c.step(), backend=backend)
    for _ in range(3):
        for pe, pc in zip(eager, comp, strict=True):
            pe.grad = torch.randn(pe.shape)
            pc.grad = pe.grad.clone()
        opt_e.step()
        step()
        for pe, pc in zip(eager, comp, strict=True):
            torch.testing.assert_close(pc.detach(), pe.detach(), rtol=0, atol=1e-6)
            for k, v in opt_e.state[pe].items():
                torch.testing.assert_close(opt_c.state[pc][k], v, rtol=0, atol=0)
    graph = _compiled_graphs(backend)[-1]
    source = graph.executor.source
    assert source.count(SHARED_LOOP) == 2 and source.count("#pragma omp parallel num_threads(nt)\n") == 1
    assert len(graph.in_place) == 12 and "last 1 part(s)" in format_program(graph.executor.program)


def test_updates_in_a_graph_with_symbolic_sizes() -> None:
    """torch.compile(dynamic=True): the graph with symbolic sizes leaves its input updates to
    AOTAutograd (no copy_ for its symbolic path to refuse, no warning); eager's values at
    each size."""

    def fn(x, y):
        x.mul_(2).add_(y)
        return x.sum()

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=vfuse.backend(strict=True), dynamic=True)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (5, 9, 17):
            torch.manual_seed(n)
            x, y = torch.randn(n), torch.randn(n)
            want_x = x.clone()
            want = fn(want_x, y)
            torch.testing.assert_close(compiled(x, y), want)
            torch.testing.assert_close(x, want_x, rtol=0, atol=0)
    assert not [w for w in caught if "vfuse" in str(w.message)]
