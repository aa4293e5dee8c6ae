"""A warm process skips our own compile of a graph with symbolic sizes: its program, on disk.

The graph cache (entry/warm.py) gives a later process the ATen graph AOTAutograd traced; what we
then made of it over its symbols (the optimized IR graph, the fusion plan, the scheduled Program and
its C++) is kept beside it, one entry per variant the graph compiled to (`graphs/<key>.<guards'
digest>.program`, written when the variant is compiled). A hit (the first variant when the graph is
loaded, each later one when Dynamic needs it) skips fake-tensor propagation over the ATen graph (the
largest part of a hit: symbolic sizes make every fake tensor cost sympy arithmetic), lowering,
planning, scheduling and rendering; the library comes from the kernel cache by its source.

The program serves the sizes its guards admit, whatever sizes it was compiled at (its hints only
chose performance settings, docs/dynamic.md), so an entry is used when the graph's target (the
machine and instruction-set tier it was planned for: the graph's key does not name it) and symbols
are those it was compiled with, their value ranges lie within those it was compiled with (a decision
proved over a range holds over any part of it) and each saved guard holds at the call's sizes; the
guards then become the new compilation's own. A kept symbol the later graph has as a constant (seen:
a size the first process's guards pinned to 2 arrives as the SymInt constant 2) takes that constant:
it is read where the first process read it (the entry's `bindings`) and its range is that value.
SymSizes are saved as their expressions and bound to the new compilation's SymEnv on load
(`persistent_id`): no SymEnv, with its compiled evaluators, is pickled. Only graphs whose outputs
are all computed tensors (no sizes, views of inputs or constants among them: those need node
metadata) are kept; an item of a multi-output operator's result (LayerNorm's normalized output,
`getitem(native_layer_norm, 0)`) is such a tensor when the operator returns it fresh (no alias
annotation). An unreadable or corrupt entry is a miss with a warning; entries are written atomically
and read from the graph cache's directory only (loading one runs its pickled code, as for the graph
cache).
"""

from __future__ import annotations

import hashlib
import io
import math
import operator
import pickle
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sympy
import torch
from torch.utils._sympy.value_ranges import ValueRanges

from vfuse.cachedir import write_bytes_atomic
from vfuse.entry.dynamic import MAX_VARIANTS, _aliases_input
from vfuse.entry.warm import GraphCache
from vfuse.fusion import FusionPlan
from vfuse.ir import Graph
from vfuse.ir.sym import SymEnv, SymSize
from vfuse.runtime.arena_outputs import ArenaOutputExecutor
from vfuse.runtime.native import NativeExecutor
from vfuse.runtime.symbolic import bindings_of
from vfuse.schedule import Program

FORMAT = 2  # of an entry: a dict with these keys (2: "bindings")
_FIELDS = ("format", "key", "target", "symbols", "bindings", "guards", "parts")

Parts = tuple[Graph, FusionPlan, Program, str]  # the optimized graph, its plan, the Program, its C++
Loaded = tuple[Parts, SymEnv]  # and the env its sizes are bound to


class ProgramCache:
    """Symbolic programs by graph-cache key beside `graphs`' entries, in a directory only this
    user can write (else none is read or written); `hits`, `misses` and `saved` count lookups
    (tests assert on them)."""

    def __init__(self, graphs: GraphCache) -> None:
        self.graphs = graphs
        self.root = graphs.root
        self.hits = self.misses = self.saved = 0

    def load(self, key: str, env: SymEnv, target: str, inputs: Sequence[Any] | None = None) -> Loaded | None:
        """A program kept under `key` for `target` (the planning target's repr) that serves
        `env`'s hints, with the env its sizes are bound to: `env` with its guards added, or a
        new one that also has the kept symbols this graph has as constants, read from `inputs`
        (the call's arguments or the graph's example values; None: no such symbol allowed).
        None when there is none (corrupt entries are skipped with a warning)."""
        for path in self._variants(key):
            try:
                data = path.read_bytes()
            except FileNotFoundError:  # replaced meanwhile
                continue
            try:
                loaded = _decode(data, key, env, target, inputs)
            except Exception as e:  # corrupt, truncated, another version's: compiled afresh
                warnings.warn(
                    f"vfuse: program cache entry {path} is unreadable ({type(e).__name__}: {e}); compiling it",
                    stacklevel=2,
                )
                continue
            if loaded is not None:
                self.hits += 1
                return loaded
        self.misses += 1
        return None

    def _variants(self, key: str) -> list[Path]:
        """The entries kept under `key`, one per variant (`<key>.<guards' digest>.program`)."""
        return sorted(self.root.glob(f"{key}.*.program")) if self.graphs.usable() else []

    def save(self, key: str, env: SymEnv, parts: Parts, target: str) -> None:
        """Keep `parts` compiled under `env` (its guards final) for `target`, beside the key's
        other variants (at most MAX_VARIANTS; one with the same guards is replaced); a cache that
        cannot be written is left alone."""
        if not self.graphs.usable():
            return
        try:
            guards = list(env.guards)
            path = self.root / f"{key}.{hashlib.sha256(repr(guards).encode()).hexdigest()[:16]}.program"
            if not path.exists() and len(self._variants(key)) >= MAX_VARIANTS:
                return
            try:
                encoded = _encode(parts)
            except (pickle.PicklingError, TypeError, RuntimeError, AttributeError):
                return  # holds an object pickle cannot keep (a torch C++ object): compiled each process
            entry = {
                "format": FORMAT,
                "key": key,
                "target": target,
                "symbols": _symbols(env),
                "bindings": _bindings(parts[0], env),
                "guards": guards,
                "parts": encoded,
            }
            write_bytes_atomic(path, pickle.dumps(entry, protocol=pickle.HIGHEST_PROTOCOL))
            self.saved += 1
        except Exception as e:
            warnings.warn(f"vfuse: program cache entry not written: {type(e).__name__}: {e}", stacklevel=2)

    def save_static(self, key: str, compiled: Any, target: str) -> None:
        """Keep a fixed-shape program (a CompiledGraph whose executor runs C++; a Triton one was
        built by g++ on load): no symbols, no guards. The caller vouches that it updates no
        input and compiled in no parameter."""
        executor = compiled.executor
        if type(executor) in (NativeExecutor, ArenaOutputExecutor):  # C++ (not Triton's source, not sized)
            parts = (compiled.graph, compiled.plan, executor.program, executor.source)
            self.save(key, SymEnv({}), parts, target)


def _bindings(graph: Graph, env: SymEnv) -> dict[str, tuple[int, int]]:
    """Where each symbol is read (`runtime.symbolic.bindings_of`): name -> (input, dim; -1: the
    input is the size)."""
    try:
        return {b.name: (b.index, b.dim) for b in bindings_of(graph, env)} if env.symbols else {}
    except ValueError:  # a symbol no input gives: kept, but served only where every symbol is one
        return {}


def _symbols(env: SymEnv) -> list[tuple[sympy.Symbol, str, str]]:
    """Each symbol (assumptions included) with its value range: what the program's proofs used."""
    return [(s, str(env.ranges[s].lower), str(env.ranges[s].upper)) for s in env.symbols]


def _serving(env: SymEnv, entry: dict[str, Any], inputs: Sequence[Any] | None) -> SymEnv | None:
    """The env a kept entry's program runs under here, or None where it does not serve `env`:
    each of `env`'s symbols kept, its range within the kept one (a proof over a range holds over
    any part of it; not equal ranges: the later process's shape environment gets the first's
    guards back simplified, `s0 - 3 != 1` as `s0 != 4`, and those narrow Dynamo's ranges where
    the first process's spelling did not: issue 15); kept symbols `env` lacks take the constant
    `inputs` has where the first process read them."""
    kept, where = entry["symbols"], entry["bindings"]
    if not isinstance(kept, list) or not all(_kept_symbol(k) for k in kept) or not isinstance(where, dict):
        raise ValueError("not a program cache entry")
    ranges = {symbol: (lo, hi) for symbol, lo, hi in kept}
    for symbol, lo, hi in _symbols(env):
        if symbol not in ranges:
            return None
        if not _bound(ranges[symbol][0]) <= _bound(lo) <= _bound(hi) <= _bound(ranges[symbol][1]):
            return None
    extra = {symbol: ranges[symbol] for symbol in ranges if symbol not in env.hints}
    if not extra:
        return env
    constants = {s: _constant(inputs, where.get(s.name)) for s in extra}
    if any(v is None or not _bound(extra[s][0]) <= v <= _bound(extra[s][1]) for s, v in constants.items()):
        return None
    both = {s: (env.hints[s], env.ranges[s]) for s in env.symbols}
    both.update({s: (v, ValueRanges(v, v)) for s, v in constants.items()})  # type: ignore[misc]
    served = SymEnv(both)
    served.arguments = {**env.arguments, **{s.name: where[s.name][0] for s in extra if where[s.name][1] == -1}}
    for g in env.guards:
        served.guard(g)
    return served


def _kept_symbol(k: Any) -> bool:
    return isinstance(k, tuple) and len(k) == 3 and isinstance(k[0], sympy.Symbol)


def _constant(inputs: Sequence[Any] | None, at: Any) -> int | None:
    """The plain int at `at` = (input, dim; -1: the input itself) of `inputs`; None where it is
    symbolic, missing or no size."""
    if inputs is None or not (isinstance(at, tuple) and len(at) == 2 and 0 <= at[0] < len(inputs)):
        return None
    x, dim = inputs[at[0]], at[1]
    try:
        value = x if dim == -1 else x.shape[dim]
    except (AttributeError, IndexError, TypeError):
        return None
    if isinstance(value, torch.SymInt) and value.node.expr.is_Integer:  # a size Dynamo specialized
        return int(value.node.expr)
    return value if type(value) is int else None


def _bound(text: str) -> float:
    """A range's end as `_symbols` writes it (an integer or torch's and sympy's infinities)."""
    infinite = {"int_oo": math.inf, "oo": math.inf, "-int_oo": -math.inf, "-oo": -math.inf}
    return infinite[text] if text in infinite else int(text)


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, SymSize):
            return ("size", obj.expr)
        if isinstance(obj, SymEnv):
            return ("env",)
        if isinstance(obj, torch._ops.OpOverload):  # a torch fallback's op: pybind11, not picklable
            return ("op", obj.namespace, obj._opname, obj._overloadname)
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, env: SymEnv) -> None:
        super().__init__(io.BytesIO(data))
        self.env = env

    def persistent_load(self, pid: Any) -> Any:
        if pid == ("env",):
            return self.env
        if isinstance(pid, tuple) and len(pid) == 2 and pid[0] == "size" and isinstance(pid[1], sympy.Basic):
            if not pid[1].free_symbols <= set(self.env.symbols):
                raise ValueError(f"size {pid[1]} over symbols this graph does not have")
            return SymSize(pid[1], self.env)
        if isinstance(pid, tuple) and len(pid) == 4 and pid[0] == "op" and all(isinstance(p, str) for p in pid[1:]):
            return getattr(getattr(getattr(torch.ops, pid[1]), pid[2]), pid[3])  # unknown op: AttributeError
        raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")


def _encode(parts: Parts) -> bytes:
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(parts)
    return buf.getvalue()


def _decode(data: bytes, key: str, env: SymEnv, target: str, inputs: Sequence[Any] | None) -> Loaded | None:
    """The entry's parts and the env they are bound to (`_serving`; None: it does not serve
    `env`); raises for a corrupt one."""
    entry = pickle.loads(data)
    if isinstance(entry, dict) and entry.get("format") == FORMAT - 1 and entry.get("key") == key:
        return None  # an earlier version's entry (no bindings): compiled and replaced without a warning
    if not isinstance(entry, dict) or tuple(entry) != _FIELDS:
        raise ValueError("not a program cache entry")
    if entry["format"] != FORMAT or entry["key"] != key:
        raise ValueError(f"entry of format {entry['format']} for another key")
    guards = entry["guards"]
    if not isinstance(guards, list) or not all(isinstance(g, sympy.Basic) for g in guards):
        raise ValueError("not a program cache entry")
    if entry["target"] != target:
        return None  # planned for another machine or tier (the graph's key does not say)
    served = _serving(env, entry, inputs)
    if served is None:
        return None  # other symbols, or sizes outside the ranges its proofs used
    if not all(_holds(g, served) for g in guards):
        return None  # sizes outside the program's guards: another variant
    parts = _Unpickler(entry["parts"], served).load()
    types = (Graph, FusionPlan, Program, str)
    if not isinstance(parts, tuple) or len(parts) != 4 or not all(isinstance(p, t) for p, t in zip(parts, types)):
        raise ValueError("not a program cache entry")
    for g in guards:
        served.guard(g)
    return parts, served


def _holds(guard: sympy.Basic, env: SymEnv) -> bool:
    """The guard at `env`'s hints; raises for one that is no condition over its symbols."""
    value = guard.xreplace(env.hints)
    if value not in (sympy.true, sympy.false):
        raise ValueError(f"guard {guard} is no condition on this graph's sizes")
    return bool(value)


def plain_outputs(gm: torch.fx.GraphModule) -> bool:
    """Whether every output of `gm` is a tensor an ATen operator computes (no size, constant,
    view of an input or item an operator returns aliased): the outputs Dynamic takes as they
    are, without node metadata (placeholders' meta['val'] only, to tell tensor inputs)."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    values = out.args[0] if isinstance(out.args[0], list | tuple) else (out.args[0],)
    return all(_computed_tensor(v) for v in values)


def _computed_tensor(v: Any) -> bool:
    if not isinstance(v, torch.fx.Node) or v.op != "call_function":
        return False
    if v.target is operator.getitem:
        return _fresh_item(v)
    op = v.target
    if not isinstance(op, torch._ops.OpOverload) or _aliases_input(v):
        return False
    returns = op._schema.returns
    return len(returns) == 1 and isinstance(returns[0].type, torch.TensorType)


def _fresh_item(v: torch.fx.Node) -> bool:
    """`getitem(op(...), i)` where `op` returns a tuple whose item `i` is a tensor it allocates
    (hf_bert's last LayerNorm: its program was never kept before, session 15)."""
    source, index = v.args if len(v.args) == 2 else (None, None)
    if not isinstance(source, torch.fx.Node) or source.op != "call_function" or not isinstance(index, int):
        return False
    op = source.target
    if not isinstance(op, torch._ops.OpOverload) or op.is_view:
        return False
    returns = op._schema.returns
    if not 0 <= index < len(returns) or len(returns) < 2:  # one return: a list (split), not a tuple
        return False
    item = returns[index]
    return isinstance(item.type, torch.TensorType) and item.alias_info is None
