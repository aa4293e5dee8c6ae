"""The graph cache (entry/warm.py): a later process takes AOTAutograd's ATen graph from disk.

A "later process" here is a new backend after `torch._dynamo.reset()`: Dynamo traces again and
the backend has no memory of the first; only the cache directory is shared. Every test checks
outputs against eager; hits are asserted by AOTAutograd's call count, not by timing.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._dynamo.backends.common as aot_common

import vfuse
from vfuse.entry import warm


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vfuse-graph-cache")  # kernels compiled once for the module


@pytest.fixture
def traces(monkeypatch: pytest.MonkeyPatch, cache_dir: Path) -> Iterator[list[int]]:
    """Counts AOTAutograd traces; each test starts with no graph entries."""
    for f in (cache_dir / "graphs").glob("*"):
        f.unlink()
    count: list[int] = []
    real = aot_common.aot_module_simplified

    def traced(*args: Any, **kwargs: Any) -> Any:
        count.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(aot_common, "aot_module_simplified", traced)
    monkeypatch.delenv("VFUSE_GRAPH_CACHE", raising=False)
    torch._dynamo.reset()
    yield count
    torch._dynamo.reset()


def _process(fn: Callable, cache_dir: Path, **compile_kw: Any) -> tuple[Callable, Any]:
    """A compiled `fn` as a fresh process would make it (Dynamo reset, a new backend)."""
    torch._dynamo.reset()
    backend = vfuse.backend(strict=True, cache_dir=cache_dir)
    return torch.compile(fn, backend=backend, **compile_kw), backend


def _ln_gelu(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(torch.nn.functional.layer_norm(x, x.shape[-1:], w) * 2 + x.shape[0])


def test_hit_skips_aot_and_matches_eager_at_every_size(traces: list[int], cache_dir: Path) -> None:
    w = torch.randn(24)
    sizes = (5, 9, 13, 2, 31)
    with torch.no_grad():
        first, b1 = _process(_ln_gelu, cache_dir, dynamic=True)
        for n in sizes:
            x = torch.randn(n, 24)
            torch.testing.assert_close(first(x, w), _ln_gelu(x, w))
        assert b1.graph_cache.saved == 1 and b1.graph_cache.hits == 0
        aot_first = len(traces)
        assert aot_first >= 1
        second, b2 = _process(_ln_gelu, cache_dir, dynamic=True)
        for n in reversed(sizes):  # the first call at another size than the saved one
            x = torch.randn(n, 24)
            torch.testing.assert_close(second(x, w), _ln_gelu(x, w))
        x = torch.randn(7, 24)[:, :24]
        torch.testing.assert_close(second(x, w), _ln_gelu(x, w))
    assert b2.graph_cache.hits == 1 and b2.graph_cache.saved == 0
    assert len(traces) == aot_first  # no AOTAutograd trace in the second process
    assert b2.stats["graphs"] >= 1  # compiled by vfuse, not run eagerly
    assert b2.stats["eager_graphs"] == 0


def test_static_graph_hits_too(traces: list[int], cache_dir: Path) -> None:
    w = torch.randn(17)
    x = torch.randn(3, 17)
    with torch.no_grad():
        for k in range(2):
            fn, backend = _process(_ln_gelu, cache_dir, dynamic=False)
            torch.testing.assert_close(fn(x, w), _ln_gelu(x, w))
            assert (backend.graph_cache.hits, backend.graph_cache.saved) == ((0, 1) if k == 0 else (1, 0))
    assert len(traces) == 1


def test_corrupt_entry_is_a_miss_with_a_warning(traces: list[int], cache_dir: Path) -> None:
    w = torch.randn(24)
    x = torch.randn(6, 24)
    with torch.no_grad():
        fn, _ = _process(_ln_gelu, cache_dir, dynamic=True)
        fn(x, w)
        (entry,) = (cache_dir / "graphs").glob("*.pkl")
        for garbage in (b"", b"not a pickle", pickle.dumps({"format": 1}), entry.read_bytes()[:40]):
            entry.write_bytes(garbage)
            fn, backend = _process(_ln_gelu, cache_dir, dynamic=True)
            with pytest.warns(UserWarning, match="graph cache entry .* is unreadable"):
                got = fn(x, w)
            torch.testing.assert_close(got, _ln_gelu(x, w))
            assert backend.graph_cache.misses == 1 and backend.graph_cache.saved == 1  # written anew
    assert len(traces) == 5


def test_guards_false_at_these_sizes_is_a_miss(traces: list[int], cache_dir: Path) -> None:
    w = torch.randn(24)
    with torch.no_grad():
        fn, _ = _process(_ln_gelu, cache_dir, dynamic=True)
        fn(torch.randn(6, 24), w)
        (path,) = (cache_dir / "graphs").glob("*.pkl")
        entry = pickle.loads(path.read_bytes())
        entry["guards"] = "L['t0'] == 123457"  # a guard the next sizes fail
        path.write_bytes(pickle.dumps(entry))
        fn, backend = _process(_ln_gelu, cache_dir, dynamic=True)
        x = torch.randn(9, 24)
        torch.testing.assert_close(fn(x, w), _ln_gelu(x, w))
    assert backend.graph_cache.misses == 1 and backend.graph_cache.hits == 0
    assert len(traces) == 2


def test_training_graphs_are_not_cached(traces: list[int], cache_dir: Path) -> None:
    lin = torch.nn.Linear(8, 5)
    for k in range(2):
        fn, backend = _process(lambda x: torch.tanh(lin(x)).sum(), cache_dir, dynamic=True)
        x = torch.randn(k + 3, 8, requires_grad=True)
        fn(x).backward()
        want = x.detach().clone().requires_grad_()
        torch.tanh(lin(want)).sum().backward()
        torch.testing.assert_close(x.grad, want.grad)
        assert (backend.graph_cache.hits, backend.graph_cache.saved) == (0, 0)
    assert not list((cache_dir / "graphs").glob("*.pkl"))


def test_input_mutation_is_not_cached_and_still_happens(traces: list[int], cache_dir: Path) -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x.add_(y)
        return x * 2

    with torch.no_grad():
        for n in (4, 4, 11):
            fn, backend = _process(f, cache_dir, dynamic=True)
            x, y = torch.randn(n, 3), torch.randn(n, 3)
            want_x = x + y
            torch.testing.assert_close(fn(x, y), want_x * 2)
            torch.testing.assert_close(x, want_x)
            assert backend.graph_cache.saved == 0 and backend.graph_cache.hits == 0


class _Norm(torch.nn.Module):
    """A float attribute Dynamo first passes as a tensor, then specializes (AOTAutograd's
    `_tensorify_python_scalars` restarts its analysis)."""

    def __init__(self) -> None:
        super().__init__()
        self.eps = 1e-5
        self.w = torch.nn.Parameter(torch.randn(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.layer_norm(x, (16,), self.w, None, self.eps).relu()


def test_restart_marker_and_hit_skip_both_traces(traces: list[int], cache_dir: Path) -> None:
    m = _Norm()
    with torch.no_grad():
        fn, b1 = _process(m, cache_dir, dynamic=True)
        x = torch.randn(5, 16)
        torch.testing.assert_close(fn(x), m(x))
        aot_first = len(traces)
        fn, b2 = _process(m, cache_dir, dynamic=True)
        for n in (3, 12):
            x = torch.randn(n, 16)
            torch.testing.assert_close(fn(x), m(x))
    assert b1.graph_cache.saved == 2  # the restart's marker and the graph after it
    assert (b2.graph_cache.restarts, b2.graph_cache.hits, b2.graph_cache.misses) == (1, 1, 0)
    assert aot_first == 1 and len(traces) == aot_first  # the restart asked for before tracing (entry/restart.py)


def test_only_torch_functions_are_keyed_by_name() -> None:
    @torch._dynamo.allow_in_graph
    def mine(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    assert warm._qualified(mine) is None
    assert warm._qualified(torch.ops.aten.add.Tensor) == "torch.ops.aten.add.Tensor"
    assert warm._qualified(torch.nn.functional.layer_norm) == "torch.nn.functional.layer_norm"


def test_cache_off_by_environment(traces: list[int], cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VFUSE_GRAPH_CACHE", "0")
    w = torch.randn(24)
    with torch.no_grad():
        for _ in range(2):
            fn, backend = _process(_ln_gelu, cache_dir, dynamic=True)
            x = torch.randn(6, 24)
            torch.testing.assert_close(fn(x, w), _ln_gelu(x, w))
            assert backend.graph_cache is None
    assert len(traces) == 2


class _Block(torch.nn.Module):
    """Submodules put module paths in the traced graph's node metadata, which the pickle drops."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(24)
        self.proj = torch.nn.Linear(24, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.proj(self.norm(x))) + x


def test_a_hit_compiles_no_kernel_the_saving_process_did_not(traces: list[int], cache_dir: Path) -> None:
    # Unpickling traces the graph's code again and renames its nodes; the names reach kernel
    # sources, so before they were restored the first warm process ran g++ again.
    block = _Block()
    with torch.no_grad():
        first, b1 = _process(block, cache_dir, dynamic=True)
        x = torch.randn(11, 24)
        torch.testing.assert_close(first(x), block(x))
        assert b1.graph_cache.saved >= 1
        libraries = sorted(cache_dir.rglob("*.so"))
        second, b2 = _process(block, cache_dir, dynamic=True)
        torch.testing.assert_close(second(x), block(x))
        y = torch.randn(5, 24)
        torch.testing.assert_close(second(y), block(y))
    assert b2.graph_cache.hits >= 1 and b2.graph_cache.misses == 0, (b1.graph_cache.saved, b2.graph_cache.misses)
    assert sorted(cache_dir.rglob("*.so")) == libraries


def _traced_graph() -> tuple[torch.fx.GraphModule, torch.Tensor]:
    """make_fx's graph with repeated ops (`add`, `add_1`) and a constant it lifts (`lift_fresh_copy`):
    GraphModule's own pickle renamed the one and folded the other."""
    c, lift = torch.tensor([1.0, -2.0, 3.0, 0.5, 7.0]), torch.ops.aten.lift_fresh_copy.default
    x = torch.randn(7, 5)  # a lambda: annotations in this module are strings FX cannot pickle
    return torch.fx.experimental.proxy_tensor.make_fx(lambda x: ((x + 1) * lift(c) + x).relu() + 3)(x), x


def test_snapshot_keeps_the_graph_node_for_node() -> None:
    gm, x = _traced_graph()
    nodes = [(n.op, n.name, str(n.target)) for n in gm.graph.nodes]
    assert "add_1" in gm.code and "lift_fresh_copy" in gm.code
    back = warm._decode(warm.snapshot(gm))
    assert [(n.op, n.name, str(n.target)) for n in back.graph.nodes] == nodes
    assert back.code == gm.code
    torch.testing.assert_close(back(x), gm(x))
    fresh = back.graph.call_function(torch.ops.aten.neg.default, (next(iter(back.graph.nodes)),))
    assert fresh.name not in {name for _, name, _ in nodes}  # the graph's namespace knows every name


@pytest.mark.parametrize("change", ["order", "operator", "attribute"])
def test_a_damaged_snapshot_is_refused(change: str) -> None:
    gm, _ = _traced_graph()
    nodes, attrs = pickle.loads(warm.snapshot(gm))
    if change == "order":
        nodes.reverse()  # every node used before it is made
    elif change == "operator":
        op, name, _, args, kwargs = nodes[2]
        nodes[2] = (op, name, warm._Op("aten", "no_such_op", "default"), args, kwargs)
    else:
        attrs.clear()
    with pytest.raises((KeyError, AttributeError, RuntimeError, ValueError)):
        warm._decode(pickle.dumps((nodes, attrs)))
