"""A warm process skips AOTAutograd: the ATen graph it traced for an inference graph, on disk.

Dynamo traces the user's code in every process, and AOTAutograd then turns its graph into the
same ATen graph each time (~0.5-1 s of a text model's warm compile). For the graphs that
`entry/direct.py` hands to Dynamo without AOTAutograd's runtime wrappers (inference, plain
tensor and size inputs, no input mutated, no output aliasing an input), that ATen graph is all
a later process needs. It is kept under the cache directory (`graphs/<key>.pkl`), keyed on what
Dynamo hands the backend: the graph's code and the functions it calls, each input's dtype,
device, sizes and strides (symbols by name: the graph serves every size its guards admit),
grad mode, the torch and Python versions, vfuse's options and its installed source files.

The graph is kept node for node (`snapshot`: names included, which reach the kernels' sources:
a hit compiles kernels the saving process already built). On a hit it is rebuilt and its nodes'
`meta['val']` recomputed by fake-tensor propagation over Dynamo's own example values (symbolic
sizes included). The guards the traced graph relied on (those of the shape environment over the
size inputs when it was saved) are evaluated first: false at these sizes is a miss; true, they
are added to Dynamo's shape environment, so Dynamo checks them as if AOTAutograd had run.
`compile_aten` then compiles the graph as on a miss (kernels come from the kernel cache, by
source). A graph whose program is kept beside it (entry/warm_program.py: with symbolic sizes,
or fixed ones) skips both the propagation and our compile: `load`'s `ready` makes it from the
placeholders' metadata alone, and the rest is propagated only if another variant must be compiled.

Anything the key cannot vouch for is not cached: training graphs, frozen parameters, graphs
calling functions outside torch or reading module attributes, tensor subclasses, float inputs,
sizes not carried by a size input. An unreadable or corrupt entry is a miss with a warning.
Entries are written to a temporary file and renamed: a killed or concurrent writer leaves whole
files only. Like the kernels beside them, entries are only read from a directory only this user
can write (`cachedir.usable_dir`): loading one runs its pickled code. VFUSE_GRAPH_CACHE=0 turns
the cache off.
"""

from __future__ import annotations

import builtins
import dataclasses
import functools
import hashlib
import math
import operator
import os
import pickle
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import sympy
import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

import vfuse
from vfuse.cachedir import usable_dir, write_bytes_atomic

FORMAT = 2  # of an entry: a dict with these keys (2: the graph's nodes as they are, `snapshot`)
_FIELDS = ("format", "key", "graph", "guards", "restart")
_PLAIN_MODULES = {builtins.__name__, operator.__name__, "_operator", math.__name__}


class GraphCache:
    """ATen graphs by key under `cache_dir/graphs`; `hits`, `misses`, `restarts` (markers
    acted on) and `saved` count this backend's lookups (tests assert on them)."""

    def __init__(self, cache_dir: Path) -> None:
        self.root = Path(cache_dir) / "graphs"
        self.hits = self.misses = self.saved = self.restarts = 0
        self._usable: bool | None = None

    def usable(self) -> bool:
        if self._usable is None:
            self._usable = usable_dir(self.root) is not None
        return self._usable

    def load(
        self,
        key: str,
        gm: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        ready: Callable[[torch.fx.GraphModule], Any] | None = None,
    ) -> tuple[torch.fx.GraphModule, list[Any], Any] | None:
        """The ATen graph saved under `key`, with meta['val'] set and its guards added to the
        shape environment, its example inputs (faked as AOTAutograd fakes them) and what `ready`
        made of it; None on a miss (no entry, a corrupt one, guards false at these sizes).
        `ready(graph)` (placeholders' meta['val'] set) returns what the
        caller compiled from elsewhere (entry/warm_program.py) or None: when not None, the
        graph's other nodes get no meta['val'] until `ensure_meta` (the largest part of a hit)."""
        entry = self._read(key) if self.usable() else None
        if entry is not None and entry["restart"] and _restart(entry["restart"]):
            self.restarts += 1
            _raise_restart()
        if entry is not None and entry["graph"] is not None:
            graph, guards = entry["graph"], entry["guards"]
            try:
                values = fake_inputs(example_inputs, example_values(gm))
                if values is not None and _guards_hold(guards, values):
                    made = _ready(graph, values, ready)
                    if made is None:
                        propagate(graph, values)
                    self.hits += 1
                    return graph, values, made
            except Exception as e:  # a graph this torch cannot replay: compiled afresh
                warnings.warn(f"vfuse: graph cache entry {key[:16]} not used: {type(e).__name__}: {e}", stacklevel=3)
        self.misses += 1
        return None

    def _read(self, key: str) -> dict[str, Any] | None:
        """The entry under `key` with its graph unpickled; None (with a warning) for a file
        that is no entry of this format for this key."""
        path = self.root / f"{key}.pkl"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            entry = pickle.loads(data)
            if not isinstance(entry, dict) or tuple(entry) != _FIELDS:
                raise ValueError("not a graph cache entry")
            if entry["format"] != FORMAT or entry["key"] != key:
                raise ValueError(f"entry of format {entry['format']} for another key")
            if entry["graph"] is not None:
                entry["graph"] = _decode(entry["graph"])
            if not _valid(entry):
                raise ValueError("not a graph cache entry")
        except Exception as e:  # corrupt, truncated, written by another version: compiled afresh
            warnings.warn(
                f"vfuse: graph cache entry {path} is unreadable ({type(e).__name__}: {e}); compiling it", stacklevel=4
            )
            return None
        return entry

    def save(self, key: str, graph: bytes, gm: torch.fx.GraphModule) -> None:
        """Keep the ATen graph (`snapshot`'s bytes) traced for Dynamo's `gm`, with the guards on
        its size inputs."""
        self._write(key, {"graph": graph, "guards": _guards(example_values(gm)), "restart": []})

    def save_restart(self, key: str, floats: list[str]) -> None:
        """Remember that AOTAutograd's trace of this graph made Dynamo restart its analysis with
        these float inputs specialized (`_tensorify_python_scalars`): a later process restarts
        without tracing. Specializing a float is always correct, so a marker cannot make outputs wrong."""
        self._write(key, {"graph": None, "guards": None, "restart": sorted(floats)})

    def _write(self, key: str, fields: dict[str, Any]) -> None:
        """A cache that cannot be written is left alone (a full disk, guards torch cannot print)."""
        if not self.usable():
            return
        try:
            entry = {"format": FORMAT, "key": key, **fields}
            write_bytes_atomic(self.root / f"{key}.pkl", pickle.dumps(entry, protocol=pickle.HIGHEST_PROTOCOL))
            self.saved += 1
        except Exception as e:
            warnings.warn(f"vfuse: graph cache entry not written: {type(e).__name__}: {e}", stacklevel=3)


def _valid(entry: dict[str, Any]) -> bool:
    graph, guards, restart = entry["graph"], entry["guards"], entry["restart"]
    return (
        (graph is None or isinstance(graph, torch.fx.GraphModule))
        and (guards is None or isinstance(guards, str))
        and isinstance(restart, list)
        and all(isinstance(name, str) for name in restart)
    )


def specialized_floats() -> set[str]:
    """The float inputs Dynamo has been told to specialize when it restarts its analysis."""
    from torch._dynamo.symbolic_convert import TensorifyState

    return set(TensorifyState.force_specializations)


def _restart(floats: list[str]) -> bool:
    """Have Dynamo's restart specialize these floats as AOTAutograd's trace did; False when
    they already are (the same graph again: traced rather than restarted forever)."""
    from torch._dynamo.symbolic_convert import TensorifyState

    if all(TensorifyState.should_specialize(name) for name in floats):
        return False
    for name in floats:
        TensorifyState.specialize(name)
    return True


def _raise_restart() -> None:
    from torch._dynamo.exc import TensorifyScalarRestartAnalysis

    raise TensorifyScalarRestartAnalysis


def enabled() -> bool:
    return os.environ.get("VFUSE_GRAPH_CACHE", "1") != "0"


def snapshot(gm: torch.fx.GraphModule) -> bytes | None:
    """The ATen graph as bytes: its nodes as they are (names included) and its constants; node
    metadata is recomputed on load. None for one that cannot be pickled (it is then not cached).

    Not GraphModule's own pickle: that keeps the code and traces it again on load, which names
    nodes after their targets (`add_tensor` for `add_15`) and folds `lift_fresh_copy` of a
    constant into a new constant. Names reach the kernels' sources (buffer pointers, comments),
    and a kernel whose source differs is compiled again: the first warm process ran g++."""
    if type(gm.graph._codegen) is not torch.fx.graph.CodeGen:  # pytree-flattening codegens
        return None
    try:
        nodes = [(n.op, n.name, _encode(n.target), _encode(n.args), _encode(n.kwargs)) for n in gm.graph.nodes]
        attrs = {n.target: _attr(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr"}
        return pickle.dumps((nodes, attrs), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        return None


@dataclasses.dataclass(frozen=True)
class _Ref:
    """A node in a saved node's arguments, by name."""

    name: str


@dataclasses.dataclass(frozen=True)
class _Op:
    """An ATen (or other namespace's) operator overload, by name: they do not pickle."""

    namespace: str
    name: str
    overload: str

    def resolve(self) -> torch._ops.OpOverload:
        op = getattr(getattr(getattr(torch.ops, self.namespace), self.name), self.overload)
        if not isinstance(op, torch._ops.OpOverload):
            raise ValueError(f"{self} is no operator")
        return op


def _encode(value: Any) -> Any:
    def leaf(v: Any) -> Any:
        if isinstance(v, torch.fx.Node):
            return _Ref(v.name)
        if isinstance(v, torch._ops.OpOverload):
            return _Op(v.namespace, v._opname, v._overloadname)
        return v

    return torch.fx.node.map_aggregate(value, leaf)


def _attr(gm: torch.fx.GraphModule, target: str) -> Any:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _decode(data: bytes) -> torch.fx.GraphModule:
    """`snapshot`'s graph, node for node."""
    nodes, attrs = pickle.loads(data)
    if not isinstance(nodes, list) or not isinstance(attrs, dict):
        raise ValueError("not a graph cache entry")
    graph = torch.fx.Graph()
    made: dict[str, torch.fx.Node] = {}

    def leaf(v: Any) -> Any:
        if isinstance(v, _Ref):
            return made[v.name]  # a node defined later or not at all: a corrupt entry (KeyError)
        return v.resolve() if isinstance(v, _Op) else v

    for op, name, target, args, kwargs in nodes:
        args, kwargs = torch.fx.node.map_aggregate((args, kwargs), leaf)
        made[name] = graph.create_node(op, leaf(target), args, kwargs, name=name)
    return torch.fx.GraphModule(attrs, graph)


def example_values(gm: torch.fx.GraphModule) -> list[Any]:
    """Dynamo's fake example value of each input (symbolic sizes as SymInts)."""
    return [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]


def fake_inputs(example_inputs: Sequence[Any], dynamo: Sequence[Any]) -> list[Any] | None:
    """The backend's example inputs as AOTAutograd fakes them: each real tensor in the tracing
    context's fake mode with the symbolic sizes Dynamo gave it; None if any comes out otherwise
    than Dynamo's (`dynamo`: its example values)."""
    ctx = torch._guards.TracingContext.try_get()
    if ctx is None or ctx.fake_mode is None:
        return None
    out = []
    for x, d in zip(example_inputs, dynamo, strict=True):
        if isinstance(x, torch.Tensor):
            context = ctx.tensor_to_context.get(x)
            source = context.tensor_source if context is not None else None
            x = ctx.fake_mode.from_tensor(x, symbolic_context=context, source=source, trace=False)
            if _layout(x) != _layout(d):
                return None
        out.append(x)
    return out


def _layout(v: Any) -> tuple[str, ...]:
    return tuple(map(str, (*v.shape, *v.stride(), v.storage_offset(), v.dtype)))


def cache_key(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], context: str) -> str | None:
    """The key of Dynamo's graph `gm` for these inputs, or None when the key could not vouch
    for the traced graph (see the module's docstring). `context`: the backend's own settings."""
    values = example_values(gm)
    if len(values) != len(example_inputs) or (torch.is_grad_enabled() and _any_grad(values)):
        return None
    symbols = {v.node.expr for v in values if isinstance(v, torch.SymInt)}
    if not all(isinstance(s, sympy.Symbol) for s in symbols):
        return None
    inputs = [_describe(v, symbols) for v in values]
    calls = _calls(gm)
    if calls is None or any(d is None for d in inputs):
        return None
    state = (torch.is_grad_enabled(), torch.are_deterministic_algorithms_enabled(), torch.get_default_dtype())
    text = repr((FORMAT, torch.__version__, sys.version, _fingerprint(), context, state, inputs, calls, gm.code))
    return hashlib.sha256(text.encode()).hexdigest()


def _any_grad(values: Sequence[Any]) -> bool:
    return any(isinstance(v, torch.Tensor) and v.requires_grad for v in values)


def _describe(v: Any, symbols: set[sympy.Basic]) -> tuple[Any, ...] | None:
    """An input as the key sees it; None for one it cannot describe."""
    if isinstance(v, torch.SymInt):
        return ("size", str(v.node.expr))
    if type(v) is not FakeTensor or v.layout is not torch.strided:
        return None
    sizes = (*v.shape, *v.stride(), v.storage_offset())
    free = set().union(*(s.node.expr.free_symbols for s in sizes if isinstance(s, torch.SymInt)))
    if not free <= symbols:  # a size no size input carries: its guards would be pruned away
        return None
    return ("tensor", str(v.dtype), str(v.device), v.requires_grad, tuple(map(str, sizes)), v.dim())


def _calls(gm: torch.fx.GraphModule) -> list[str] | None:
    """What each node calls, by qualified name; None for a graph calling anything but torch,
    operator and math functions and tensor methods (their code is not in the key)."""
    names = []
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "output"):
            continue
        if n.op == "call_method" and isinstance(n.target, str):
            names.append(n.target)
            continue
        name = _qualified(n.target) if n.op == "call_function" else None
        if name is None:
            return None
        names.append(name)
    return names


def _qualified(fn: Any) -> str | None:
    if isinstance(fn, torch._ops.OpOverload | torch._ops.OpOverloadPacket):
        return f"torch.ops.{fn}"
    module = getattr(fn, "__module__", None) or ""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if name is None or "<" in name:  # lambdas and functions defined inside others
        return None
    if module in _PLAIN_MODULES or module == "torch" or module.startswith("torch."):
        return f"{module}.{name}"
    return None


@functools.cache
def _fingerprint() -> str:
    """vfuse's installed source (every file's path, size and modification time): any edit, to
    the decompositions above all, makes every key new."""
    root = Path(vfuse.__file__).parent
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        st = p.stat()
        h.update(f"{p.relative_to(root)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _shape_env(values: Sequence[Any]) -> Any:
    mode = torch._guards.detect_fake_mode(values)
    return mode.shape_env if mode is not None else None


def _sizes(values: Sequence[Any]) -> list[torch.SymInt]:
    return [v for v in values if isinstance(v, torch.SymInt)]


def _guards(values: Sequence[Any]) -> str | None:
    """The shape environment's guards over the size inputs, as torch prints them for
    `evaluate_guards_expression` (AOTAutogradCache's way)."""
    sizes, env = _sizes(values), _shape_env(values)
    if not sizes or env is None:
        return None
    return env.produce_guards_expression(placeholders=sizes, guards=env.get_pruned_guards(sizes))


def _guards_hold(guards: str | None, values: Sequence[Any]) -> bool:
    """Whether the saved guards hold at these sizes; when they do, they are added to Dynamo's
    shape environment (evaluated over the SymInts: each comparison records its guard)."""
    if guards is None:
        return True
    sizes, env = _sizes(values), _shape_env(values)
    if env is None:
        return False
    from torch.fx.experimental.symbolic_shapes import guarding_hint_or_throw

    if not env.evaluate_guards_expression(guards, [guarding_hint_or_throw(s) for s in sizes]):
        return False
    return bool(env.evaluate_guards_expression(guards, sizes))


def _ready(graph: torch.fx.GraphModule, values: Sequence[Any], ready: Callable[[Any], Any] | None) -> Any:
    """What `ready` makes of a graph whose placeholders alone have meta['val'] (the rest is
    propagated by `ensure_meta` when needed); None where it makes nothing."""
    if ready is None:
        return None
    for node, v in zip((n for n in graph.graph.nodes if n.op == "placeholder"), values, strict=True):
        node.meta["val"] = v
    made = ready(graph)
    if made is not None:
        graph.meta[_DEFERRED] = list(values)
    return made


_DEFERRED = "vfuse_meta_deferred"  # graph.meta key: the inputs to propagate over, when not yet done


def ensure_meta(graph: torch.fx.GraphModule) -> None:
    """Every node's meta['val'] set, where `load` left it to later."""
    values = graph.meta.pop(_DEFERRED, None)
    if values is not None:
        propagate(graph, values)


class _Propagate(FakeTensorProp):
    """Fake-tensor propagation that also fakes the graph's constants (AOTAutograd's lifted
    tensors are real: mixing them with fake ones fails)."""

    def get_attr(self, target: Any, args: Any, kwargs: Any) -> Any:
        value = super().get_attr(target, args, kwargs)
        return self._mode.from_tensor(value, static_shapes=True) if isinstance(value, torch.Tensor) else value


def propagate(graph: torch.fx.GraphModule, values: Sequence[Any]) -> None:
    """Set every node's meta['val'] as AOTAutograd's trace had, over its fake inputs."""
    mode = torch._guards.detect_fake_mode(values)
    if mode is None:
        mode = torch._subclasses.fake_tensor.FakeTensorMode()
    _Propagate(graph, mode).propagate_dont_convert_inputs(*values)
