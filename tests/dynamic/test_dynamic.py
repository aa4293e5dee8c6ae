"""Dynamic shapes end to end: one compiled graph and one set of kernels for every size.

torch.compile(dynamic=True), automatic dynamic, mark_dynamic and torch.export's Dim each compile
a graph once over its symbols; every later size its guards admit runs without compiling
(g++ is never called again: the build is patched to fail), numerics match eager at odd sizes
(primes, 2, sizes past L2), forward and backward, SymInt outputs included."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
import sympy
import torch
from torch.export import Dim
from torch.fx.experimental.proxy_tensor import make_fx

import vfuse
import vfuse.compiler as compiler
import vfuse.entry.dynamic as dynamic_entry
from vfuse.context import Context, Options
from vfuse.errors import VfuseInputError
from vfuse.frontend.symbols import sym_env
from vfuse.runtime.symbolic import SymbolicExecutor
from vfuse.schedule.kernel import Walk


class Block(torch.nn.Module):
    """LayerNorm -> Linear -> GELU -> Linear + residual, then softmax: rows, GEMMs, pointwise."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, 3 * d)
        self.down = torch.nn.Linear(3 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.down(torch.nn.functional.gelu(self.up(self.ln(x))))
        return torch.softmax(h, -1) * h


@pytest.fixture
def no_more_builds(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts native builds; `builds.append(-1)` makes every later build fail the test."""
    builds: list[int] = []
    real = compiler.build

    def build(*args: object, **kwargs: object) -> object:
        assert -1 not in builds, "a new size compiled native code"
        builds.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(compiler, "build", build)
    yield builds


def test_symbolic_program_serves_every_size(no_more_builds: list[int]) -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.relu(x * 2 + y).sum(-1) + torch.softmax(x, -1).amax(-1), (x + 1).exp()

    gm = make_fx(f, tracing_mode="symbolic")(torch.randn(8, 100), torch.randn(8, 100))
    env = sym_env(gm)
    cg = compiler.compile_fx(gm, Context(Options(verify=True, raise_codegen_errors=True)), symbols=env)
    assert isinstance(cg.executor, SymbolicExecutor)
    no_more_builds.append(-1)
    admitted = [(8, 100), (13, 100), (1, 100), (5000, 100), (3, 100)]
    for shape in admitted:
        x, y = torch.randn(*shape), torch.randn(*shape)
        for got, want in zip(cg(x, y), f(x, y), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert cg.executor.instantiated == len(admitted)


def test_sizes_outside_the_guards_are_refused_by_name() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x.sum(-1)

    gm = make_fx(f, tracing_mode="symbolic")(torch.randn(6, 9))
    env = sym_env(gm)
    env.guard(sympy.Lt(env.symbols[0], 50))  # as a specializing decision would
    cg = compiler.compile_fx(gm, Context(Options(raise_codegen_errors=True)), symbols=env)
    x = torch.randn(7, 9)
    torch.testing.assert_close(cg(x)[0], x.sum(-1))
    with pytest.raises(VfuseInputError, match=f"{env.symbols[0].name}=64"):
        cg(torch.randn(64, 9))


def test_dynamic_true_compiles_one_graph_for_every_length(no_more_builds: list[int]) -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    m, backend = Block(), vfuse.backend()
    c = torch.compile(m, backend=backend, dynamic=True)
    with torch.no_grad():
        for i, t in enumerate((5, 17, 2, 64, 127, 1000)):
            x = torch.randn(3, t, 32)
            torch.testing.assert_close(c(x), m(x), rtol=1e-4, atol=1e-5)
            if i == 0:
                no_more_builds.append(-1)
    assert backend.stats["graphs"] == 1 and backend.stats["eager_graphs"] == 0
    assert backend.stats["fallbacks"] == {}


def test_training_forward_and_backward_with_a_size_output() -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    m, backend = Block(), vfuse.backend()
    ref = copy.deepcopy(m)

    def step(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        return model(x).square().mean(), x.shape[1] + 1

    c = torch.compile(lambda x: step(m, x), backend=backend, dynamic=True)
    for t in (7, 13, 4, 31):
        x = torch.randn(2, t, 32)
        (loss, n), (want, n_ref) = c(x), step(ref, x)
        loss.backward()
        want.backward()
        assert n == n_ref
        torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
        for p, q in zip(m.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)
        m.zero_grad()
        ref.zero_grad()
    assert backend.stats["graphs"] == 2 and backend.stats["eager_graphs"] == 0  # forward + backward


def test_automatic_dynamic_and_mark_dynamic() -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    m, backend = Block(), vfuse.backend()
    c = torch.compile(m, backend=backend)  # automatic dynamic: the second size makes the dim symbolic
    with torch.no_grad():
        for t in (5, 7, 9, 23):
            x = torch.randn(2, t, 32)
            torch.testing.assert_close(c(x), m(x), rtol=1e-4, atol=1e-5)
    assert backend.stats["graphs"] == 2  # t=5 fixed, t=7 symbolic (serving 9 and 23)
    torch._dynamo.reset()
    backend = vfuse.backend()
    c = torch.compile(m, backend=backend)
    with torch.no_grad():
        for t in (6, 11, 3):
            x = torch.randn(t, 4, 32)
            torch._dynamo.mark_dynamic(x, 0)
            torch.testing.assert_close(c(x), m(x), rtol=1e-4, atol=1e-5)
    assert backend.stats["graphs"] == 1


def test_size_arithmetic_and_torch_steps_take_the_call_sizes() -> None:
    """Views split a symbolic size; an op run through torch (arange of a symbolic length) gets
    the call's sizes in its arguments."""
    torch._dynamo.reset()
    backend = vfuse.backend()

    def f(x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        heads = x.view(b, t, 4, c // 4).transpose(1, 2).softmax(-1)
        pos = torch.arange(t, dtype=x.dtype)
        return heads.transpose(1, 2).reshape(b * t, c) + pos.repeat(b)[:, None]

    c = torch.compile(f, backend=backend, dynamic=True)
    for b, t in ((2, 5), (3, 11), (2, 2), (5, 37)):
        x = torch.randn(b, t, 16)
        torch.testing.assert_close(c(x), f(x), rtol=1e-5, atol=1e-5)
    assert backend.stats["graphs"] == 1


def test_guard_miss_compiles_another_variant(monkeypatch: pytest.MonkeyPatch) -> None:
    real = dynamic_entry.sym_env

    def with_guard(gm: torch.fx.GraphModule, args: object = None) -> object:
        env = real(gm, args)  # type: ignore[arg-type]
        for s in env.symbols:  # as a decision taken at the hint would
            env.guard(sympy.Lt(s, 20) if env.hints[s] < 20 else sympy.Ge(s, 20))
        return env

    monkeypatch.setattr(dynamic_entry, "sym_env", with_guard)
    torch._dynamo.reset()
    backend = vfuse.backend()
    c = torch.compile(lambda x: torch.tanh(x).sum(0), backend=backend, dynamic=True)
    for n in (3, 7, 25, 40, 5):
        x = torch.randn(n, 6)
        torch.testing.assert_close(c(x), torch.tanh(x).sum(0), rtol=1e-5, atol=1e-5)
    assert backend.stats["graphs"] == 2  # n < 20 and n >= 20


def test_dropout_seeds_and_sizes_share_the_seed_array() -> None:
    """The RNG seeds sit before the sizes in the kernels' seed array: the backward regenerates
    the forward's mask at every size."""
    torch._dynamo.reset()
    backend = vfuse.backend()
    c = torch.compile(lambda x: torch.nn.functional.dropout(x * 3, 0.5, training=True), backend=backend, dynamic=True)
    for t in (33, 70, 5):
        x = torch.randn(4, t, requires_grad=True)
        y = c(x)
        y.sum().backward()
        kept = y != 0
        assert 0.3 < kept.float().mean() < 0.7
        torch.testing.assert_close(x.grad, kept.float() * 6.0)


def test_export_with_dim_and_freeze() -> None:
    torch.manual_seed(0)
    m = Block().eval()
    batch = Dim("batch", min=2, max=4096)
    for freeze in (False, True):
        c = vfuse.compile(m, (torch.randn(8, 32),), dynamic_shapes={"x": {0: batch}}, freeze=freeze)
        with torch.no_grad():
            for n in (8, 3, 17, 1000):
                x = torch.randn(n, 32)
                torch.testing.assert_close(c(x), m(x), rtol=1e-4, atol=1e-5)
        assert c.variants == [] and c.compiled.executor.env.guards == []


def test_report_names_symbols_guards_and_flipping_decisions() -> None:
    from vfuse.report.text import render_text

    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        a = torch.exp(x) * y
        return torch.softmax(a, -1) + a.sum(-1, keepdim=True) / a.amax(-1, keepdim=True)

    n = Dim("n", min=2, max=1 << 22)
    x, y = torch.randn(8, 64), torch.randn(8, 64)
    report = vfuse.explain(f, x, y, dynamic_shapes={"x": {1: n}, "y": {1: n}})
    assert len(report.symbols) == 1 and "= 64 here (2..4194304)" in report.symbols[0]
    # The planner's choice at the hint (64 wide rows) is not the one at the range's ends.
    merges = [f for f in report.flips if f.startswith("%")]
    assert merges and all("prologue-into-reduction" in f for f in merges)
    # The schedule's: 8 rows of 64 run on one thread, of 4096 (32768 elements: PARALLEL_MIN) on several,
    # chosen by each call.
    (n_sym,) = (s.split(" = ")[0] for s in report.symbols)
    assert f"k0 (row) threads: chosen per call, several where 8*{n_sym} >= 32768 loop points" in report.flips
    text = render_text(report)
    assert "symbolic sizes" in text and "decisions that flip" in text
    c = vfuse.compile(f, (x, y), dynamic_shapes={"x": {1: n}, "y": {1: n}})
    for width in (64, 3, 1000, 4099):
        a, b = torch.randn(8, width), torch.randn(8, width)
        torch.testing.assert_close(c(a, b), f(a, b), rtol=1e-5, atol=1e-5)


def test_conv_with_a_dynamic_batch() -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(), torch.nn.Conv2d(16, 8, 1)
    ).eval()
    backend = vfuse.backend()
    c = torch.compile(m, backend=backend)
    with torch.no_grad():
        for n in (2, 3, 7, 2):
            x = torch.randn(n, 8, 13, 11)
            torch._dynamo.mark_dynamic(x, 0)
            torch.testing.assert_close(c(x), m(x), rtol=1e-4, atol=1e-5)
    assert backend.stats["graphs"] == 1


def test_sizes_as_values_and_slices_of_buffers_take_no_guard() -> None:
    """A mean over a symbolic dim divides by a run-time count (no torch step); `pos[:, :t]` of
    a 128-long buffer serves t = 128 too; a linear's output viewed per head into attention is
    not specialized on the length modulo 4 (each compiled one variant per size class before)."""
    torch._dynamo.reset()

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.lin = torch.nn.Embedding(128, 64), torch.nn.Linear(64, 64)
            self.register_buffer("pos", torch.arange(128)[None])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            h = x + self.emb(self.pos[:, :t])
            q = self.lin(h).view(b, t, 4, 16).transpose(1, 2)
            a = torch.nn.functional.scaled_dot_product_attention(q, q, q).transpose(1, 2).reshape(b, t, 64)
            return a - a.mean(-1, keepdim=True) + t

    m, backend = M().eval(), vfuse.backend()
    c = torch.compile(m, backend=backend, dynamic=True)
    with torch.no_grad():
        for t in (37, 50, 128, 12, 4):
            x = torch.randn(2, t, 64)
            torch.testing.assert_close(c(x), m(x), rtol=1e-4, atol=1e-4)
    assert backend.stats["graphs"] == 1 and backend.stats["fallbacks"] == {}


def test_tiled_transpose_at_run_time_sizes() -> None:
    """The tiled walk (tiles chosen at the hint, clamped at run time) at sizes with tails."""
    torch._dynamo.reset()
    backend = vfuse.backend()

    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.relu(x.t() + y) * torch.sigmoid(y)

    c = torch.compile(f, backend=backend, dynamic=True)
    for a, b in ((200, 300), (257, 129), (64, 64), (1000, 77), (3, 5000)):
        x, y = torch.randn(a, b), torch.randn(b, a)
        torch.testing.assert_close(c(x, y), f(x, y))
    assert backend.stats["graphs"] == 1
    (graph,) = backend.compiled
    assert [k.walk for k in graph.executor.program.kernels] == [Walk.TILED_TRANSPOSE]


def test_lookup_table_over_a_run_time_length() -> None:
    """dequantize -> GELU -> quantize as a 256-entry table read over a symbolic length; a table
    whose entries would depend on a size is left to per-shape compilation (it is a static)."""
    torch._dynamo.reset()
    backend = vfuse.backend()

    def f(q: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.gelu((q.float() - 3.0) * 0.05)
        return torch.clamp(torch.round(y / 0.04) + 5, -128, 127).to(torch.int8)

    c = torch.compile(f, backend=backend, dynamic=True)
    for n in (1000, 4099, 77, 100_003):
        q = torch.randint(-128, 127, (n,), dtype=torch.int8)
        torch.testing.assert_close(c(q), f(q), rtol=0, atol=0)
    (graph,) = backend.compiled
    assert [k.walk for k in graph.executor.program.kernels] == [Walk.LOOKUP_TABLE]
    torch._dynamo.reset()
    backend = vfuse.backend()
    c = torch.compile(lambda q: ((q.float() * q.shape[0]) > 10).to(torch.uint8), backend=backend, dynamic=True)
    for n in (9, 13):
        q = torch.randint(-128, 127, (n,), dtype=torch.int8)
        torch.testing.assert_close(c(q), ((q.float() * n) > 10).to(torch.uint8))


def test_outputs_that_view_inputs_are_views_at_every_size() -> None:
    """x[a:b:c] with closure ints Dynamo lifts to SymInts, and x.expand_as(y) of a transposed x:
    AOTAutograd rebuilds such outputs from the compiled output's strides and offset when the view
    has symbolic arguments, so they must be real views of the call's input (row 0 came back, or
    a storage error, before)."""
    torch._dynamo.reset()

    def make(a: int, b: int, c: int) -> object:
        return lambda x: (x[a:b:c], x.sum(0))

    f = make(1, 3, 2)
    backend = vfuse.backend()
    c = torch.compile(f, backend=backend, dynamic=True)
    for n in (11, 17, 5):
        x = torch.arange(n * 16, dtype=torch.float32).reshape(n, 16)
        for got, want in zip(c(x), f(x), strict=True):
            torch.testing.assert_close(got, want)
    g = lambda x, y: (x.expand_as(y), y * 2)  # noqa: E731
    c = torch.compile(g, backend=vfuse.backend(), dynamic=True)
    for xs, ys in (((4, 37), (1, 37, 4)), ((5, 11), (1, 11, 5)), ((7, 3), (1, 3, 7))):
        x, y = torch.randn(*xs).t(), torch.randn(*ys)
        got = c(x, y)
        for a, b in zip(got, g(x, y), strict=True):
            torch.testing.assert_close(a, b)
        assert got[0].data_ptr() == x.data_ptr()  # a view, as eager's


def test_variance_count_stays_symbolic() -> None:
    """var/std/layer_norm over a symbolic dim divide by a run-time count (N - correction): no
    guard on N (it specialized every size before), and x / (N - 1) is never taken for x / 1."""
    torch._dynamo.reset()
    backend = vfuse.backend()

    def f(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x.var(-1), x.std(0, unbiased=False), torch.nn.functional.layer_norm(x, x.shape[-1:])

    c = torch.compile(f, backend=backend, dynamic=True)
    for shape in ((11, 37), (5, 16), (64, 3), (2, 2)):
        x = torch.randn(*shape)
        for got, want in zip(c(x), f(x), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert backend.stats["graphs"] == 1 and backend.stats["fallbacks"] == {}
