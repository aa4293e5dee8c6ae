"""PyTorch's OpInfo samples through `torch.compile(backend=vfuse)`, compared with eager.

Which OpInfos: those whose aten op vfuse lowers itself, has torch decompose for it (DECOMPOSE),
or that aten decomposes on the way in (CompositeImplicitAutograd, e.g. layer_norm -> its
native op). Each (op, dtype) compiles its samples as one graph (one C++ translation unit: g++
dominates the time, and its fixed cost is paid once per unit); when that graph fails to compile
each sample is compiled alone so the failure is pinned on a sample. vfuse runs with
the user's defaults: what it cannot compile must run eagerly with a warning (counted
apart from the matches), never give a different result.
"""

from __future__ import annotations

import functools
import operator
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from tests.opinfo.records import Outcome

from vfuse.frontend.decompositions import DECOMPOSE, decomposition_table
from vfuse.frontend.lowerings import lowered_targets, lowering_for

aten = torch.ops.aten

# Ops whose result is unspecified (empty) or random: only shape and dtype are compared.
UNSPECIFIED = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "bernoulli", "uniform"}
UNSPECIFIED |= {
    "rand_like",
    "nn.functional.dropout",
    "nn.functional.alpha_dropout",
    "nn.functional.feature_alpha_dropout",
}
UNSPECIFIED |= {"nn.functional.dropout2d", "nn.functional.dropout3d", "randn_like", "normal", "cauchy", "exponential"}
UNSPECIFIED |= {"geometric", "log_normal", "multinomial", "randint_like", "nn.functional.rrelu"}


@dataclass(frozen=True)
class Result:
    op: str  # name[.variant]
    dtype: torch.dtype
    sample: int
    outcome: Outcome
    detail: str = ""


@functools.cache
def _op_db() -> tuple[Any, ...]:
    from torch.testing._internal.common_methods_invocations import op_db

    return tuple(op_db)


@functools.cache
def _handled_packets() -> frozenset[Any]:
    packets = {t.overloadpacket if isinstance(t, torch._ops.OpOverload) else t for t in lowered_targets()}
    packets |= {t.overloadpacket if isinstance(t, torch._ops.OpOverload) else t for t in DECOMPOSE}
    return frozenset(packets)


def aten_packet(info: Any) -> Any:
    """The aten op an OpInfo exercises (by its aten_name, else the last part of its name), or None."""
    for name in (info.aten_name, info.name.split(".")[-1]):
        if name and hasattr(aten, name):
            return getattr(aten, name)
    return None


def is_candidate(info: Any) -> bool:
    """Whether vfuse may lower the op: it lowers the aten op, has torch decompose it (DECOMPOSE),
    or aten decomposes it itself on the way in (CompositeImplicitAutograd; see `lowers`)."""
    packet = aten_packet(info)
    if packet is None:
        return False
    return packet in _handled_packets() or any(_is_cia(getattr(packet, name)) for name in packet.overloads())


def _is_cia(overload: Any) -> bool:
    try:
        return overload.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd)
    except RuntimeError:  # a python-only op (aten.broadcast_shapes) has no dispatcher entry
        return False


def unlowered_targets(info: Any) -> tuple[str, ...]:
    """The ops of the OpInfo's first float32 sample, as vfuse's frontend sees them, that vfuse
    does not lower ('no sample' / 'trace failed' when there is nothing to look at)."""
    return _unlowered(op_id(info))


@functools.cache
def _unlowered(name: str) -> tuple[str, ...]:
    # Cached by name: OpInfos are unhashable dataclasses.
    info = next(x for x in _op_db() if op_id(x) == name)
    packet = aten_packet(info)
    if packet in _handled_packets():
        return ()
    first = samples(info, torch.float32, 1)
    if not first:
        return ("no float32 sample",)
    case = Case.of(info, 0, first[0])
    try:
        gm = _trace(case)
    except Exception as e:
        return (f"trace failed: {type(e).__name__}",)
    calls = (n.target for n in gm.graph.nodes if n.op == "call_function" and n.target is not operator.getitem)
    return tuple(sorted({str(t) for t in calls if lowering_for(t) is None}))


def _trace(case: Case) -> torch.fx.GraphModule:
    """The functional ATen graph vfuse would get for the case (what AOTAutograd hands it)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    functional = torch.func.functionalize(case.call, remove="mutations_and_views")
    table = decomposition_table(include_cia=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make_fx(functional, decomposition_table=table, tracing_mode="fake")(*case.tensors)


def lowers(info: Any) -> bool:
    """Whether vfuse lowers the op: every op its sample becomes is in vfuse's lowering table."""
    return is_candidate(info) and not unlowered_targets(info)


def op_id(info: Any) -> str:
    return info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")


@functools.cache
def candidate_opinfos() -> tuple[Any, ...]:
    return tuple(info for info in _op_db() if is_candidate(info))


@functools.cache
def lowered_opinfos() -> tuple[Any, ...]:
    return tuple(info for info in candidate_opinfos() if lowers(info))


def low_precision_dtype(info: Any) -> torch.dtype | None:
    supported = info.supported_dtypes("cpu")
    return next((d for d in (torch.bfloat16, torch.float16) if d in supported), None)


def tolerance(info: Any, dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol): the largest override the OpInfo gives for this dtype on cpu (any test), else
    assert_close's defaults for the dtype."""
    from torch.testing._internal.common_device_type import toleranceOverride

    rtol, atol = torch.testing._comparison.default_tolerances(dtype)
    for deco in info.decorators:
        if getattr(deco, "device_type", None) not in (None, "cpu"):
            continue
        for d in getattr(deco, "decorators", ()):
            if isinstance(d, toleranceOverride) and dtype in d.d:
                atol, rtol = max(atol, d.d[dtype].atol), max(rtol, d.d[dtype].rtol)
    return atol, rtol


def samples(info: Any, dtype: torch.dtype, limit: int | None = None) -> list[Any]:
    """The OpInfo's cpu samples for `dtype` (all of them, or the first `limit`)."""
    if dtype not in info.supported_dtypes("cpu"):
        return []
    out = []
    torch.manual_seed(0)  # sample generators draw from the global RNG
    for s in info.sample_inputs("cpu", dtype, requires_grad=False):
        out.append(s)
        if limit is not None and len(out) >= limit:
            break
    return out


_TENSOR = object()  # marks where a tensor goes back into a sample's (input, args, kwargs)


@dataclass(frozen=True)
class Case:
    """One sample of one OpInfo, ready to run: `call(*tensors)`."""

    info: Any
    index: int
    tensors: tuple[torch.Tensor, ...]
    leaves: tuple[Any, ...]
    spec: Any

    @staticmethod
    def of(info: Any, index: int, sample: Any) -> Case:
        leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
        tensors = tuple(x for x in leaves if isinstance(x, torch.Tensor))
        return Case(info, index, tensors, tuple(_TENSOR if isinstance(x, torch.Tensor) else x for x in leaves), spec)

    @property
    def constants(self) -> list[Any]:
        return [x for x in self.leaves if x is not _TENSOR]

    def widened(self) -> Case:
        """The case in float64: float tensors and float16/bfloat16 dtype arguments (factories)."""
        low = (torch.float16, torch.bfloat16)
        leaves = tuple(torch.float64 if x in low else x for x in self.leaves)
        tensors = tuple(t.double() if t.is_floating_point() else t for t in self.tensors)
        return Case(self.info, self.index, tensors, leaves, self.spec)

    def call(self, *tensors: torch.Tensor) -> Any:
        it = iter(tensors)
        inp, args, kwargs = pytree.tree_unflatten([next(it) if x is _TENSOR else x for x in self.leaves], self.spec)
        return self.info.op(inp, *args, **kwargs)


def fresh_copies(cases: Sequence[Case]) -> list[Case]:
    """The cases on copies of their tensors (shared tensors stay shared): ops that update an input
    in place (native_batch_norm's running stats) must start from the same values in every run."""
    memo: dict[int, torch.Tensor] = {}

    def copy(t: torch.Tensor) -> torch.Tensor:
        return memo.setdefault(id(t), t.clone())

    return [Case(c.info, c.index, tuple(copy(t) for t in c.tensors), c.leaves, c.spec) for c in cases]


def batched(cases: Sequence[Case]) -> tuple[Callable, list[torch.Tensor]]:
    """One function running every case (tensors as arguments, everything else a constant)."""
    counts = [len(c.tensors) for c in cases]

    def fn(*tensors: torch.Tensor) -> list[Any]:
        outs, at = [], 0
        for case, n in zip(cases, counts):
            outs.append(case.call(*tensors[at : at + n]))
            at += n
        return outs

    return fn, [t for c in cases for t in c.tensors]
