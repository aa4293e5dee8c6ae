"""The state of one lowering: the IR nodes emitted so far, the FX->IR value map, and helpers.

Each FX node is lowered as a transaction (`begin` / `commit` / `rollback`): if its lowering
fails halfway, the nodes it emitted are dropped before the OPAQUE fallback is emitted, so a
failed attempt leaves nothing behind. One Emitter serves one `lower()` call; nothing is global.
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree

from vfuse.context import Context
from vfuse.frontend.errors import Fallback, LoweringError
from vfuse.frontend.symbols import ScalarOps, SymScalar, shape, to_size
from vfuse.ir import Attrs, DType, Graph, GraphBuilder, Node, Op, TensorType, Type, opdef
from vfuse.ir.sym import SymEnv, is_sym
from vfuse.targets import Target, get_target

Lowered = str | tuple[str | None, ...]
"""What a lowering returns: one IR value, or one per tuple element (None: not produced)."""


@dataclass(frozen=True, slots=True)
class OpaqueTuple:
    """An OPAQUE node with several results; `items` maps FX getitem indices to TupleType items."""

    name: str
    items: dict[int, int]


Scalar = bool | int | float
# Element types a symbolic size converts to exactly as torch.full does (fp16/bf16 would round).
SIZED_SCALARS = (DType.F32, DType.F64, DType.I32, DType.I64)


def python_scalar(v: Any, dtype: DType) -> Scalar:
    """`v` converted the way torch converts a fill value to `dtype` (int truncates toward zero)."""
    if isinstance(v, torch.SymInt | torch.SymFloat | torch.SymBool):
        raise LoweringError(None, f"symbolic scalar {v} (shapes must be specialized before lowering)")
    if isinstance(v, SymScalar):  # only an operand (`Emitter.scalar`) computes one at run time
        raise LoweringError(None, f"symbolic scalar {v} as a fill value is not supported")
    if is_sym(v) and dtype in SIZED_SCALARS:
        return v  # a size as a value (a mean's count): read at run time like every size
    if not isinstance(v, bool | int | float):
        raise Fallback(f"scalar {v!r} of type {type(v).__name__}")
    if dtype is DType.BOOL:
        return bool(v)
    return int(v) if dtype.is_int else float(v)


def bind(node: torch.fx.Node) -> dict[str, Any]:
    """The node's arguments by schema name, defaults filled in (aten ops only)."""
    schema = node.target._schema  # type: ignore[union-attr]
    out: dict[str, Any] = {}
    positional = iter(node.args)
    for arg in schema.arguments:
        if not arg.kwarg_only and (v := next(positional, _MISSING)) is not _MISSING:
            out[arg.name] = v
        elif arg.name in node.kwargs:
            out[arg.name] = node.kwargs[arg.name]
        else:
            out[arg.name] = arg.default_value if arg.has_default_value() else None
    return out


_MISSING = object()


@dataclass
class Emitter:
    """Emits type-checked IR nodes for the FX graph `gm` under `ctx`."""

    gm: torch.fx.GraphModule
    ctx: Context
    nodes: list[Node] = field(default_factory=list)
    types: dict[str, Type] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)
    current: torch.fx.Node | None = None
    symbols: SymEnv | None = None  # the graph's symbolic sizes (frontend/symbols.py), if any
    # The machine the compilation plans for: the compiler's (`compiler.target_of`), resolved
    # once; a lowering without one (tests, the report) resolves it on first use (`hardware`).
    target: Target | None = None
    _reserved: set[str] = field(default_factory=set)
    _seed: str | None = None
    _streams: int = 0
    _mark: int = 0
    _counts: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # FX names are reserved so an intermediate never takes the name of a later FX value.
        self._reserved = {n.name for n in self.gm.graph.nodes}

    def hardware(self) -> Target:
        """The target the compilation plans for (its figures price lowering choices)."""
        if self.target is None:
            o = self.ctx.options
            self.target = get_target(o.target, o.cache_dir, isa=o.isa)
        return self.target

    # -- transactions -------------------------------------------------------------------
    def begin(self, node: torch.fx.Node) -> None:
        self.current, self._mark = node, len(self.nodes)

    def rollback(self) -> None:
        for n in self.nodes[self._mark :]:
            del self.types[n.name]
        del self.nodes[self._mark :]
        if self._seed is not None and self._seed not in self.types:
            self._seed = None

    def commit(self, node: torch.fx.Node, result: Any) -> None:
        """Bind the FX node to `result`, naming fresh IR values after the FX values they define."""
        if isinstance(result, str):
            result = self._rename(result, node.name)
        elif isinstance(result, tuple):
            renamed: dict[str, str] = {}  # one value may sit at several positions
            for i, r in enumerate(result):
                if r is not None and r not in renamed:
                    renamed[r] = self._rename(r, _getitem_name(node, i))
            result = tuple(renamed[r] if r is not None else None for r in result)
        elif isinstance(result, OpaqueTuple):
            result = OpaqueTuple(self._rename(result.name, node.name), result.items)
        self.env[node.name] = result

    def _rename(self, value: str, want: str | None) -> str:
        fresh = {n.name for n in self.nodes[self._mark :]}
        if want is None or value not in fresh or want in self.types:
            return value
        for i in range(self._mark, len(self.nodes)):
            n = self.nodes[i]
            if n.name == value or value in n.inputs:
                name = want if n.name == value else n.name
                self.nodes[i] = dataclasses.replace(
                    n, name=name, inputs=tuple(want if x == value else x for x in n.inputs)
                )
        self.types[want] = self.types.pop(value)
        return want

    # -- reading FX values ----------------------------------------------------------------
    def value(self, arg: Any) -> str:
        """The IR value of an FX tensor argument."""
        if not isinstance(arg, torch.fx.Node):
            raise Fallback(f"expected a tensor argument, got {arg!r}")
        v = self.env[arg.name]
        if not isinstance(v, str):
            raise Fallback(f"argument '{arg.name}' is not a single tensor")
        return v

    def ttype(self, name: str) -> TensorType:
        t = self.types[name]
        if not isinstance(t, TensorType):
            raise Fallback(f"%{name} is a tuple")
        return t

    def out_val(self, index: int | None = None) -> torch.Tensor:
        """The FakeTensor the current FX node produces (element `index` of a tuple result)."""
        assert self.current is not None
        v = self.current.meta["val"]
        if index is not None:
            v = v[index]
        if not isinstance(v, torch.Tensor):
            raise Fallback(f"result is not a tensor: {v!r}")
        return v

    def out_type(self, index: int | None = None) -> TensorType:
        return tensor_type_of(self.out_val(index), self.current, self.symbols)

    def size(self, v: Any) -> Any:
        """A size read from a FakeTensor (a SymInt) as an IR size (int or SymSize)."""
        return to_size(self.symbols, v)

    def out_dtype(self, index: int | None = None) -> DType:
        return DType.from_torch(self.out_val(index).dtype)

    def shape_of(self, arg: Any) -> tuple[int, ...]:
        return self.ttype(self.value(arg)).shape

    # -- emitting -------------------------------------------------------------------------
    def emit(self, op: Op, inputs: tuple[str, ...] | list[str] = (), **attrs: Any) -> str:
        if any(isinstance(v, SymScalar) for v in attrs.values()) or (op is Op.OPAQUE and _sym_call(attrs["call"])):
            # Attributes are fixed per program, and torch would get the placeholder: never a value.
            raise LoweringError(self.current, f"a symbolic scalar as an attribute of {op.value}")
        a = Attrs.of(**attrs)
        out = opdef(op).infer(tuple(self.types[i] for i in inputs), a)  # type: ignore[arg-type]
        origin = self.current.name if self.current is not None else ""
        node = Node(self._fresh(op.value), op, tuple(inputs), a, out, origin)
        self.nodes.append(node)
        self.types[node.name] = out
        return node.name

    def _fresh(self, base: str) -> str:
        # Counting per base keeps naming linear in graph size (thousands of `full`s are common).
        name, k = base, self._counts.get(base, 0)
        if k:
            name = f"{base}_{k}"
        while name in self.types or name in self._reserved:
            k += 1
            name = f"{base}_{k}"
        self._counts[base] = k
        return name

    def cast(self, x: str, dtype: DType) -> str:
        return x if self.ttype(x).dtype is dtype else self.emit(Op.CAST, (x,), dtype=dtype)

    def scalar(self, v: Any, dtype: DType) -> str:
        """A python scalar as a shape-() FULL node of `dtype`; a float computed from the sizes
        (SymScalar) as f64 arithmetic over them, cast to `dtype` as eager casts the double."""
        if isinstance(v, SymScalar):
            return self.cast(v.walk(_EmitScalar(self)), dtype)
        return self.emit(Op.FULL, value=python_scalar(v, dtype), shape=(), dtype=dtype)

    def operand(self, arg: Any, dtype: DType) -> str:
        """An FX tensor or python scalar argument as an IR value of `dtype`."""
        if isinstance(arg, torch.fx.Node):
            return self.cast(self.value(arg), dtype)
        return self.scalar(arg, dtype)

    def add_input(self, index: int, type_: TensorType, name: str) -> str:
        node = Node(name, Op.INPUT, (), Attrs.of(index=index, type=type_), type_, name)
        self.nodes.append(node)
        self.types[name] = type_
        return name

    def add_named(self, op: Op, name: str, **attrs: Any) -> str:
        """A source node (CONSTANT) named after its FX node."""
        out = opdef(op).infer((), Attrs.of(**attrs))
        node = Node(name, op, (), Attrs.of(**attrs), out, name)
        self.nodes.append(node)
        self.types[name] = out
        return name

    def seed(self) -> str:
        """The graph's one RNG_SEED value (every RAND reads it with its own stream)."""
        if self._seed is None:
            self._seed = self.emit(Op.RNG_SEED)
        return self._seed

    def stream(self) -> int:
        self._streams += 1
        return self._streams - 1

    def build(self, outputs: list[str]) -> Graph:
        b = GraphBuilder()
        for n in self.nodes:
            b.add_node(n)
        return b.build(outputs)


class _EmitScalar(ScalarOps):
    """A SymScalar's value as f64 IR nodes: FULLs of its sizes (read at run time, as every
    size: `vf_s0`) combined as Python combined the doubles."""

    _BINARY = {"add": Op.ADD, "mul": Op.MUL, "div": Op.DIV, "pow": Op.POW}

    def __init__(self, em: Emitter) -> None:
        self.em = em

    def number(self, v: float) -> str:
        return self.em.emit(Op.FULL, value=v, shape=(), dtype=DType.F64)

    def size(self, e: Any) -> str:
        assert self.em.symbols is not None
        return self.em.emit(Op.FULL, value=self.em.symbols.size(e), shape=(), dtype=DType.F64)

    def binary(self, op: str, a: str, b: str) -> str:
        return self.em.emit(self._BINARY[op], (a, b))

    def unary(self, fn: str, a: str) -> str:
        return self.em.emit(Op(fn), (a,))


def _sym_call(call: Any) -> bool:
    leaves = pytree.tree_leaves((getattr(call, "args", ()), getattr(call, "kwargs", ())))
    return any(isinstance(v, SymScalar) for v in leaves)


def _getitem_name(node: torch.fx.Node, index: int) -> str | None:
    """The name of the one FX `getitem(node, index)` user, which names that tuple element."""
    names = [u.name for u in node.users if u.target is operator.getitem and u.args[1] == index]
    return names[0] if len(names) == 1 else None


def tensor_type_of(v: Any, node: torch.fx.Node | None, symbols: SymEnv | None = None) -> TensorType:
    """The IR type of an FX value, or a LoweringError the whole graph cannot get past."""
    if not isinstance(v, torch.Tensor):
        raise LoweringError(node, f"value is not a tensor: {v!r}")
    if not DType.supports(v.dtype):
        raise LoweringError(node, f"dtype {v.dtype} has no vfuse IR type")
    if any(not isinstance(d, int) for d in v.shape):
        try:
            return TensorType(shape(symbols, v), DType.from_torch(v.dtype))
        except LoweringError as e:
            raise LoweringError(node, e.reason) from None
    return TensorType.of(v)
