"""The program cache (entry/warm_program.py): a later process takes the program a graph with
symbolic sizes compiled to from disk, beside its ATen graph (entry/warm.py).

A "later process" is a new backend after `torch._dynamo.reset()`, sharing only the cache
directory. A hit is asserted by what did not run (fake-tensor propagation, lowering, planning,
scheduling, counted here), never by timing; every call is checked against eager.
"""

from __future__ import annotations

import pickle
import re
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sympy
import torch
from torch.utils._sympy.numbers import int_oo
from torch.utils._sympy.value_ranges import ValueRanges

import vfuse
import vfuse.compiler as compiler
from vfuse.codegen.cpp import render as render_cpp
from vfuse.entry import warm, warm_program
from vfuse.entry.dumps import graph_context
from vfuse.frontend.symbols import sym_env
from vfuse.ir.sym import SymEnv, SymSize


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vfuse-program-cache")  # kernels compiled once for the module


@pytest.fixture
def work(monkeypatch: pytest.MonkeyPatch, cache_dir: Path) -> Iterator[Counter[str]]:
    """Counts the compile stages a hit skips; each test starts with no graph or program entries."""
    for f in (cache_dir / "graphs").glob("*"):
        f.unlink()
    count: Counter[str] = Counter()
    for module, name in ((warm, "propagate"), (compiler, "lower_fx"), (compiler, "plan"), (compiler, "schedule")):
        monkeypatch.setattr(module, name, _counted(getattr(module, name), name, count))
    monkeypatch.delenv("VFUSE_GRAPH_CACHE", raising=False)
    torch._dynamo.reset()
    yield count
    torch._dynamo.reset()


def _counted(fn: Callable, name: str, count: Counter[str]) -> Callable:
    def run(*args: Any, **kwargs: Any) -> Any:
        count[name] += 1
        return fn(*args, **kwargs)

    return run


def _process(fn: Callable, cache_dir: Path, **compile_kw: Any) -> tuple[Callable, Any]:
    torch._dynamo.reset()
    backend = vfuse.backend(strict=True, cache_dir=cache_dir)
    return torch.compile(fn, backend=backend, **compile_kw), backend


class _Block(torch.nn.Module):
    """LayerNorm, a GEMM with a GELU epilogue, a residual and a softmax over the rows."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(24)
        self.proj = torch.nn.Linear(24, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.proj(self.norm(x))) + x
        return torch.softmax(h * 0.5, dim=0)  # over the symbolic dim


def _run(fn: Callable, model: torch.nn.Module, sizes: tuple[int, ...]) -> None:
    for n in sizes:
        x = torch.randn(n, 24)
        torch.testing.assert_close(fn(x), model(x))


def _entry(cache_dir: Path) -> Path:
    (path,) = (cache_dir / "graphs").glob("*.program")
    return path


def test_hit_skips_propagation_and_planning_and_matches_eager(work: Counter[str], cache_dir: Path) -> None:
    block = _Block()
    with torch.no_grad():
        first, b1 = _process(block, cache_dir, dynamic=True)
        _run(first, block, (11, 3))
        assert b1.programs.saved == 1 and work["plan"] == 1 and work["propagate"] == 0
        libraries = sorted(cache_dir.rglob("*.so"))
        work.clear()
        second, b2 = _process(block, cache_dir, dynamic=True)
        _run(second, block, (7, 2, 13, 31, 64))  # hinted at 7 here, at 11 when saved
    assert (b2.graph_cache.hits, b2.programs.hits, b2.programs.saved) == (1, 1, 0)
    assert sum(work.values()) == 0, work  # no propagation, lowering, planning or scheduling
    assert b2.stats["graphs"] == 1 and b2.stats["eager_graphs"] == 0
    assert sorted(cache_dir.rglob("*.so")) == libraries  # the saved source: no g++


def test_a_stored_program_renders_as_it_was_saved(work: Counter[str], cache_dir: Path) -> None:
    block = _Block()
    with torch.no_grad():
        fn, backend = _process(block, cache_dir, dynamic=True)
        _run(fn, block, (9,))
    key = _entry(cache_dir).name.split(".")[0]  # <key>.<guards' digest>.program
    compiled = backend.compiled[-1]
    env = compiled.executor.env
    cache = warm_program.ProgramCache(warm.GraphCache(cache_dir))
    same = type(env)({s: (env.hints[s], env.ranges[s]) for s in env.symbols})
    target = repr(compiler.target_of(graph_context(backend.options, "g", "inference", ())))
    assert cache.load(key, same, target + " elsewhere") is None  # planned for another machine
    (graph, plan, program, source), served = cache.load(key, same, target)  # type: ignore[misc]
    assert served is same  # the same symbols: its own env
    assert render_cpp(program) == source == compiled.executor.source
    assert same.guards == env.guards
    assert str(graph) == str(compiled.graph) and len(plan.groups) == len(compiled.plan.groups)
    sizes = [d for b in program.buffers.values() for d in b.type.shape if isinstance(d, SymSize)]
    assert sizes and all(d.env is same for d in sizes)
    other = type(env)({s: (17, env.ranges[s]) for s in env.symbols})  # the hint shows in comments only
    (_, _, program, _), _ = cache.load(key, other, target)  # type: ignore[misc]
    assert re.sub(r"~ \d+", "", render_cpp(program)) == re.sub(r"~ \d+", "", source)


def _damaged(entry: dict[str, Any], how: str) -> bytes:
    if how == "truncated":
        return pickle.dumps(entry)[:60]
    if how == "parts":
        entry["parts"] = entry["parts"][: len(entry["parts"]) // 2]
    elif how == "guard":
        entry["guards"] = [*entry["guards"], sympy.Symbol("nobody") > 3]
    elif how == "types":
        entry["parts"] = warm_program._encode((1, 2, 3, "x"))  # type: ignore[arg-type]
    return pickle.dumps(entry)


@pytest.mark.parametrize("how", ["junk", "truncated", "parts", "guard", "types"])
def test_a_damaged_entry_is_a_miss_with_a_warning(work: Counter[str], cache_dir: Path, how: str) -> None:
    block = _Block()
    with torch.no_grad():
        fn, _ = _process(block, cache_dir, dynamic=True)
        _run(fn, block, (6,))
        path = _entry(cache_dir)
        data = b"not a pickle" if how == "junk" else _damaged(pickle.loads(path.read_bytes()), how)
        path.write_bytes(data)
        fn, backend = _process(block, cache_dir, dynamic=True)
        with pytest.warns(UserWarning, match="program cache entry .* is unreadable"):
            _run(fn, block, (6,))
        _run(fn, block, (10, 5))
    assert (backend.graph_cache.hits, backend.programs.misses, backend.programs.saved) == (1, 1, 1)  # written anew
    assert pickle.loads(_entry(cache_dir).read_bytes())["format"] == warm_program.FORMAT


def _stored_with_guard(block: _Block, cache_dir: Path, guard: Any) -> None:
    """Compiles `block` at 9 rows in one process, then adds `guard(symbol)` to its stored program."""
    fn, _ = _process(block, cache_dir, dynamic=True)
    _run(fn, block, (9,))
    path = _entry(cache_dir)
    entry = pickle.loads(path.read_bytes())
    (symbol, _, _), *_ = entry["symbols"]
    entry["guards"].append(guard(symbol))
    path.unlink()  # entries are named by their guards: a variant compiled without this one's is another file
    path.with_name(path.name.split(".")[0] + ".edited.program").write_bytes(pickle.dumps(entry))


def test_sizes_outside_its_guards_compile_another_variant(work: Counter[str], cache_dir: Path) -> None:
    """A stored program serving up to 20 rows: the hit runs it there; 31 rows compile anew, with
    the node metadata the hit skipped propagated then."""
    block = _Block()
    with torch.no_grad():
        _stored_with_guard(block, cache_dir, lambda symbol: sympy.Le(symbol, 20))
        work.clear()
        fn, backend = _process(block, cache_dir, dynamic=True)
        _run(fn, block, (9, 20, 3))
        assert sum(work.values()) == 0 and backend.programs.hits == 1
        _run(fn, block, (31, 9, 47))
    assert work["propagate"] == 1 and work["plan"] == 1  # the second variant only
    assert backend.stats["graphs"] == 2 and backend.stats["eager_graphs"] == 0


def test_every_variant_is_kept(work: Counter[str], cache_dir: Path) -> None:
    """A process that compiled two variants keeps both: a later one loads each where its sizes
    need it and compiles nothing (before, the second variant's entry replaced the first's)."""
    block = _Block()
    with torch.no_grad():
        _stored_with_guard(block, cache_dir, lambda symbol: sympy.Le(symbol, 20))
        fn, backend = _process(block, cache_dir, dynamic=True)
        _run(fn, block, (9, 31))  # the second variant compiled and kept
        assert backend.programs.hits == 1 and backend.programs.saved == 1
        (second,) = [p for p in (cache_dir / "graphs").glob("*.program") if ".edited." not in p.name]
        entry = pickle.loads(second.read_bytes())
        (symbol, _, _), *_ = entry["symbols"]
        entry["guards"].append(sympy.Gt(symbol, 20))  # so that neither entry serves every size
        second.write_bytes(pickle.dumps(entry))
        work.clear()
        fn, backend = _process(block, cache_dir, dynamic=True)
        _run(fn, block, (9, 31, 3, 47))
    assert sum(work.values()) == work["propagate"] == 1, work  # the second variant's sym_env reads node metadata
    assert (backend.programs.hits, backend.programs.saved) == (2, 0)
    assert backend.stats["graphs"] == 2 and backend.stats["eager_graphs"] == 0


def test_a_stored_program_for_other_sizes_is_not_used(work: Counter[str], cache_dir: Path) -> None:
    """A program whose guards the traced sizes fail: compiled as before (propagated, planned)."""
    block = _Block()
    with torch.no_grad():
        _stored_with_guard(block, cache_dir, lambda symbol: sympy.Ge(symbol, 1000))
        work.clear()
        fn, backend = _process(block, cache_dir, dynamic=True)
        _run(fn, block, (12, 5))
    assert (backend.programs.hits, backend.programs.misses, backend.programs.saved) == (0, 1, 1)
    assert work["propagate"] == 1 and work["plan"] == 1


def test_outputs_that_need_metadata_are_not_stored(work: Counter[str], cache_dir: Path) -> None:
    """A size and a view of an input among the outputs: Dynamic reads them from node metadata."""

    def f(x: torch.Tensor) -> tuple[torch.Tensor, int, torch.Tensor]:
        return (x * 2).relu(), x.shape[0] + 1, x[1:]

    with torch.no_grad():
        for k in range(2):
            fn, backend = _process(f, cache_dir, dynamic=True)
            x = torch.randn(7 + k, 5)
            got, want = fn(x), f(x)
            torch.testing.assert_close(got[0], want[0])
            assert got[1] == want[1] and got[2].data_ptr() == x[1:].data_ptr()
            assert backend.programs.saved == 0 and backend.programs.hits == 0


class _Normed(torch.nn.Module):
    """Ends in a LayerNorm: the graph's output is an item of native_layer_norm's result (hf_bert)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(24, 24)
        self.norm = torch.nn.LayerNorm(24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(torch.nn.functional.gelu(self.proj(x)) + x)


@pytest.mark.parametrize("dynamic", [True, None], ids=["dynamic", "auto"])
def test_a_graph_ending_in_a_layer_norm_is_kept(work: Counter[str], cache_dir: Path, dynamic: bool | None) -> None:
    """hf_bert's symbolic graph in automatic-dynamic mode returns getitem(native_layer_norm, 0):
    its program was never kept, so every warm process planned it again."""
    block = _Normed()
    with torch.no_grad():
        first, b1 = _process(block, cache_dir, dynamic=dynamic)
        _run(first, block, (5, 9, 13))
        planned = work["plan"]  # auto: the static graph at 5 rows, then the symbolic one
        assert b1.programs.saved == planned
        work.clear()
        second, b2 = _process(block, cache_dir, dynamic=dynamic)
        _run(second, block, (5, 9, 13, 16, 11))
    assert b2.programs.hits == planned and b2.programs.saved == 0  # auto: the static graph's program too
    assert sum(work.values()) == 0, work  # no propagation, lowering or planning
    assert b2.stats["eager_graphs"] == 0


def test_a_fixed_shape_program_is_kept(work: Counter[str], cache_dir: Path) -> None:
    """A graph of fixed shapes (automatic dynamic's first graph) keeps its program too: a later
    process neither propagates nor plans it, builds no library and computes eager's values."""
    block = _Normed()
    with torch.no_grad():
        first, b1 = _process(block, cache_dir, dynamic=False)
        _run(first, block, (6, 6))
        assert b1.programs.saved == 1 and work["plan"] == 1
        libraries = sorted(cache_dir.rglob("*.so"))
        work.clear()
        second, b2 = _process(block, cache_dir, dynamic=False)
        _run(second, block, (6, 6, 6))
    assert (b2.graph_cache.hits, b2.programs.hits, b2.programs.saved) == (1, 1, 0)
    assert sum(work.values()) == 0, work
    assert sorted(cache_dir.rglob("*.so")) == libraries
    assert b2.stats["graphs"] == 1 and b2.stats["eager_graphs"] == 0


def test_a_program_with_a_torch_fallback_is_kept(work: Counter[str], cache_dir: Path) -> None:
    """A torch op run as a fallback (an OpOverload, a pybind11 object pickle refuses) is kept by
    name: the later process runs the same op, computes eager's values and warns about nothing."""

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.special.i0e(x * 3).relu() + x.cumsum(0)

    x = torch.randn(7, 5)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # neither "not written" nor "unreadable"
        for round in range(2):
            fn, backend = _process(f, cache_dir, dynamic=False)
            torch.testing.assert_close(fn(x), f(x))
            assert backend.stats["fallbacks"], backend.stats  # the case this test is about
            assert (backend.programs.saved, backend.programs.hits) == ((1, 0) if round == 0 else (0, 1))


def test_a_program_that_updates_an_input_is_not_kept(work: Counter[str], cache_dir: Path) -> None:
    """Outputs written into inputs depend on the inputs' memory (schedule/inplace.py): not kept."""

    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        y.add_(1)
        return (x * 2).relu()

    with torch.no_grad():
        for _ in range(2):
            fn, backend = _process(f, cache_dir, dynamic=False)
            x, y = torch.randn(5, 3), torch.randn(5, 3)
            want = y + 1
            torch.testing.assert_close(fn(x, y), (x * 2).relu())
            torch.testing.assert_close(y, want)
            assert backend.programs.saved == 0 and backend.programs.hits == 0


def test_plain_outputs() -> None:
    gm = torch.fx.experimental.proxy_tensor.make_fx(lambda x: ((x + 1).relu(), x.t()))(torch.randn(3, 4))
    assert not warm_program.plain_outputs(gm)  # t() is a view of the input
    gm = torch.fx.experimental.proxy_tensor.make_fx(lambda x: ((x + 1).relu().t(), x + 2))(torch.randn(3, 4))
    assert warm_program.plain_outputs(gm)  # a view of a computed tensor is computed
    gm = torch.fx.experimental.proxy_tensor.make_fx(lambda x: (x + 1, x.shape[0]))(torch.randn(3, 4))
    assert not warm_program.plain_outputs(gm)  # a size
    gm = torch.fx.experimental.proxy_tensor.make_fx(lambda x: ((x + 1).relu(), x.sum(0)))(torch.randn(3, 4))
    assert warm_program.plain_outputs(gm)
    assert sym_env(gm) is None  # static: the program cache is for symbolic graphs only
    w = torch.randn(4)
    gm = torch.fx.experimental.proxy_tensor.make_fx(lambda x: torch.ops.aten.native_layer_norm(x, [4], w, w, 1e-5))(
        torch.randn(3, 4)
    )
    assert warm_program.plain_outputs(gm)  # items of a tuple the operator allocates
    gm = torch.fx.experimental.proxy_tensor.make_fx(lambda x: torch.split(x + 1, 2, 1)[0])(torch.randn(3, 4))
    assert not warm_program.plain_outputs(gm)  # split's items are views


def test_a_slice_from_both_ends_is_loaded_by_a_later_process(work: Counter[str], cache_dir: Path) -> None:
    """`w[:, 2:-1]`: AOTAutograd's trace guards `s1 - 3 != 1`, which leaves Dynamo's range of s1
    at [3, oo); the later process gets that guard back from the graph cache as `s1 != 4`, which
    narrows the range to [5, oo). The program proved over [3, oo) serves it: before, ranges had
    to be equal and every later process compiled and kept it again (issue 15, found by
    tests/fuzz/test_fuzz_warm.py)."""

    def f(w: torch.Tensor) -> torch.Tensor:
        return w[:, 2:-1] * 2 + 1

    with torch.no_grad():
        for k in range(2):
            fn, backend = _process(f, cache_dir, dynamic=True)
            for shape in ((5, 11), (3, 7), (2, 37), (6, 5)):
                w = torch.randn(shape)
                torch.testing.assert_close(fn(w), f(w))
            if k == 0:
                work.clear()
    assert (backend.graph_cache.hits, backend.programs.hits, backend.programs.saved) == (1, 1, 0)
    assert sum(work.values()) == 0, work  # no propagation, lowering, planning or scheduling
    assert backend.stats["eager_graphs"] == 0


def _env(*symbols: tuple[sympy.Symbol, int, Any, Any]) -> SymEnv:
    return SymEnv({s: (hint, ValueRanges(lo, hi)) for s, hint, lo, hi in symbols})


def test_a_program_serves_ranges_within_its_own() -> None:
    """A proof over a range holds over any part of it; a wider range or other symbols miss."""
    s, t = sympy.Symbol("s0", positive=True, integer=True), sympy.Symbol("s1", positive=True, integer=True)
    entry = {"symbols": [(s, "3", "int_oo"), (t, "2", "64")], "bindings": {"s0": (1, 0), "s1": (0, -1)}}
    inf = int_oo

    def serves(*symbols: tuple[sympy.Symbol, int, Any, Any]) -> bool:
        return warm_program._serving(_env(*symbols), entry, None) is not None

    assert serves((s, 3, 3, inf), (t, 2, 2, 64))
    assert serves((s, 5, 5, inf), (t, 2, 2, 8))
    assert not serves((s, 2, 2, inf), (t, 2, 2, 64))  # wider below
    assert not serves((s, 3, 3, inf), (t, 2, 2, inf))  # wider above
    assert not serves((t, 3, 3, 64), (sympy.Symbol("s2", positive=True, integer=True), 2, 2, 64))  # another symbol
    assert not serves((sympy.Symbol("s0"), 3, 3, inf), (t, 2, 2, 64))  # assumptions
    assert not serves((s, 3, 3, inf))  # s1 kept, a constant here: none given


def test_a_kept_symbol_this_graph_has_as_a_constant_takes_it() -> None:
    """torch's profile of an earlier process's sizes can specialize a dimension the first
    process had symbolic: the kept program serves, that symbol read where the first process read
    it (an argument here), its range the constant; a symbolic or out-of-range value misses."""
    s, t = sympy.Symbol("s0", positive=True, integer=True), sympy.Symbol("s1", positive=True, integer=True)
    entry = {"symbols": [(s, "3", "int_oo"), (t, "2", "64")], "bindings": {"s0": (1, 0), "s1": (0, -1)}}
    mine = _env((s, 9, 3, int_oo))
    mine.arguments = {"s0": 2}
    served = warm_program._serving(mine, entry, [5, torch.empty(9, 2)])
    assert served is not None and served.symbols == (s, t)
    assert served.hints == {s: 9, t: 5} and (served.ranges[t].lower, served.ranges[t].upper) == (5, 5)
    assert served.arguments == {"s0": 2, "s1": 0}
    assert warm_program._serving(mine, entry, [65, torch.empty(9, 2)]) is None  # outside its range
    assert warm_program._serving(mine, entry, [torch.empty(5), torch.empty(9, 2)]) is None  # no size
    assert warm_program._serving(mine, entry, [True, torch.empty(9, 2)]) is None  # not an int
    assert warm_program._serving(mine, {**entry, "bindings": {}}, [5, torch.empty(9, 2)]) is None  # not read


def _unflattened(b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """b's last dim of 2 split as (-1, 2): the first process compiles it symbolic with guards
    that pin it to 2 (or 3), and a later process's graph has it as the SymInt constant 2; c is
    a sliced view whose rows stay symbolic."""
    return c.permute(1, 0, 2, 3).log_softmax(0).sum(3) + b.unflatten(3, (-1, 2)).sum()


def test_a_symbol_a_later_process_specialized_is_served_as_its_constant(work: Counter[str], cache_dir: Path) -> None:
    """Found by make fuzz (test_fuzz_warm, session 23): the later process compiled and kept the
    program again, its graph having one symbol fewer than the kept program."""
    b = torch.randn(1, 1, 1, 2)
    with torch.no_grad():
        first, b1 = _process(_unflattened, cache_dir, dynamic=True)
        for rows in (11, 5):
            c = torch.randn(rows, 1, 2, 4)[..., :2]
            torch.testing.assert_close(first(b, c), _unflattened(b, c))
        work.clear()
        second, b2 = _process(_unflattened, cache_dir, dynamic=True)
        for rows in (11, 7, 13):
            c = torch.randn(rows, 1, 2, 4)[..., :2]
            torch.testing.assert_close(second(b, c), _unflattened(b, c))
    assert b1.programs.saved == 1 and (b2.programs.hits, b2.programs.saved) == (1, 0)
    assert work["plan"] == 0 and b2.stats["eager_graphs"] == 0
    served = b2.compiled[-1].executor.env
    constants = [s for s in served.symbols if served.ranges[s].lower == served.ranges[s].upper]
    assert len(served.symbols) == 3 and [served.hints[s] for s in constants] == [2]  # read from its argument


def test_an_earlier_formats_entry_is_a_quiet_miss(work: Counter[str], cache_dir: Path) -> None:
    """Entries of format 1 (before `bindings`) are compiled again and replaced, with no warning."""
    block = _Block()
    with torch.no_grad():
        fn, _ = _process(block, cache_dir, dynamic=True)
        _run(fn, block, (6,))
        path = _entry(cache_dir)
        entry = pickle.loads(path.read_bytes())
        del entry["bindings"]
        path.write_bytes(pickle.dumps({**entry, "format": warm_program.FORMAT - 1}))
        fn, backend = _process(block, cache_dir, dynamic=True)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _run(fn, block, (6,))
    assert (backend.programs.misses, backend.programs.saved) == (1, 1)
    assert pickle.loads(_entry(cache_dir).read_bytes())["format"] == warm_program.FORMAT
