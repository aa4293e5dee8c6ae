"""Fuzz programs for dynamic shapes: drawn at marker sizes, run at any size of the markers.

A program is drawn as usual (graphs.py) but its base shape holds one or two marker sizes (`MARKERS`:
primes no other size is drawn as). Every input dim, index range and expression over them that
follows a marker is a symbolic size; `instantiate(program, sizes)` swaps the markers in the input
specs for other values. Steps never name a marker in their params (such a program would be a
different function per size, rejected): the views here are relative to the runtime shape
(`x.reshape(*x.shape[:i], -1)`, `x[..., 1:-1:2]`, `x.expand_as(y)`), and each drawn step is also
tried at two other sizes of the markers (a step eager only accepts at the marker sizes is dropped).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import reject
from hypothesis import strategies as st
from tests.fuzz import graphs_layout
from tests.fuzz.graphs import KINDS, SIZES, Config, Gen, Val, _probe, draw_dtype, draw_main_input, grow
from tests.fuzz.graphs_motifs import conv_norm, norm_block, permuted_softmax
from tests.fuzz.ops import V
from tests.fuzz.ops import apply as plain_apply
from tests.fuzz.program import Input, Kind, Program, Step, Sym

MARKERS = (11, 37)
# Other sizes each drawn step is tried at (small: slices go empty, indices shrink; larger).
ALTS = ((2, 3), (65, 19))


class DynKind(Sym):
    SYMVIEW = "symview"


class SV(Sym):
    """Views whose sizes come from the tensor's runtime shape (params never hold a size)."""

    MERGE_TAIL = "merge_tail"  # x.reshape(*x.shape[:i], -1)
    MERGE_HEAD = "merge_head"  # x.reshape(-1, *x.shape[j:])
    UNFLATTEN = "unflatten"  # x.unflatten(d, (-1, f))
    SLICE = "slice"  # x[(:,) * d + (start:stop:step,)], start/stop relative (negative)
    EXPAND_AS = "expand_as"  # x.expand_as(y)
    EXPAND_NEW = "expand_new"  # x.unsqueeze(d).expand(-1.., k, -1..)
    NARROW = "narrow"  # x.narrow(d, 1, x.shape[d] - 2)


def _symview(step: Step, values: list[torch.Tensor]) -> torch.Tensor:
    x, p = values[step.srcs[0]], step.params
    if step.fn is SV.MERGE_TAIL:
        return x.reshape(*x.shape[: p[0]], -1)
    if step.fn is SV.MERGE_HEAD:
        return x.reshape(-1, *x.shape[p[0] :])
    if step.fn is SV.UNFLATTEN:
        return x.unflatten(p[0], (-1, p[1]))
    if step.fn is SV.SLICE:
        d, start, stop, stride = p
        return x[(slice(None),) * d + (slice(start, stop, stride),)]
    if step.fn is SV.EXPAND_AS:
        return x.expand_as(values[step.srcs[1]])
    if step.fn is SV.EXPAND_NEW:
        d, k = p
        y = x.unsqueeze(d)
        return y.expand(*(k if i == d else -1 for i in range(y.dim())))
    return x.narrow(p[0], 1, x.shape[p[0]] - 2)


def apply(step: Step, values: list[torch.Tensor]) -> torch.Tensor:
    if step.kind is DynKind.SYMVIEW:
        return _symview(step, values)
    return plain_apply(step, values)


def _swap(n: Any, sizes: Sequence[int]) -> Any:
    """`n` with each marker (or its negation: index ranges [-n, n)) replaced by its size."""
    for m, s in zip(MARKERS, sizes):
        if n == m:
            return s
        if n == -m:
            return -s
    return n


def instantiate(program: Program, sizes: Sequence[int]) -> Program:
    """The program at other values of the markers (its steps unchanged)."""

    def spec(i: Input) -> Input:
        shape = tuple(_swap(d, sizes) for d in i.shape)
        low = _swap(i.low, sizes) if i.low is not None else None
        high = _swap(i.high, sizes) if i.high is not None else None
        return dataclasses.replace(i, shape=shape, low=low, high=high)

    return dataclasses.replace(program, inputs=tuple(spec(i) for i in program.inputs))


def marker_dims(spec: Input) -> list[int]:
    """The dims of an input whose size is a marker (what mark_dynamic marks)."""
    return [d for d, n in enumerate(spec.shape) if n in MARKERS]


@dataclass
class DynGen(Gen):
    """A Gen that also keeps probes at the ALTS sizes and keeps a step only where eager takes it
    at all of them."""

    alts: list[list[torch.Tensor]] = field(default_factory=lambda: [[] for _ in ALTS])

    def add_input(self, spec: Input, bound: float | None = None) -> int:
        index = super().add_input(spec, bound)
        for probes, sizes in zip(self.alts, ALTS):
            s = instantiate(Program((spec,), (), ()), sizes).inputs[0]
            probes.append(_probe(s))
        return index

    def add(self, step: Step, bound: float, exact: bool) -> int | None:
        if _names_marker(step.params):
            return None
        outs = []
        for probes in (self.probes, *self.alts):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    outs.append(apply(step, probes))
            except (RuntimeError, ValueError, IndexError, TypeError):
                return None
        out = outs[0]
        if not isinstance(out, torch.Tensor) or out.numel() > 8 * self.cfg.max_numel:
            return None
        if not out.is_floating_point():
            exact = True
        if not self.fits(bound, out.dtype):
            return None
        special = out.is_floating_point() and any(self.vals[i].special for i in step.srcs)
        self.steps.append(step)
        self.vals.append(Val(tuple(out.shape), out.dtype, bound, exact, special))
        self.probes.append(out)
        for probes, o in zip(self.alts, outs[1:]):
            probes.append(o)
        return len(self.vals) - 1

    def rollback(self, mark: tuple[int, int]) -> None:
        super().rollback(mark)
        for probes in self.alts:
            del probes[mark[1] :]


def _names_marker(params: Any) -> bool:
    if isinstance(params, tuple | list):
        return any(_names_marker(p) for p in params)
    return type(params) is int and abs(params) in MARKERS


def _symview_params(g: Gen, fn: SV, v: Val) -> tuple | None:
    rank = len(v.shape)
    if fn is SV.MERGE_TAIL:
        return (g.draw(st.integers(0, rank - 1)),) if rank else None
    if fn is SV.MERGE_HEAD:
        return (g.draw(st.integers(1, rank)),) if rank else None
    if fn is SV.UNFLATTEN:
        dims = [d for d, n in enumerate(v.shape) if n % 2 == 0 or n % 3 == 0]
        if not dims:
            return None
        d = g.choice(dims)
        return (d, g.choice([f for f in (2, 3, 4) if v.shape[d] % f == 0]))
    if fn is SV.SLICE:
        if not rank:
            return None
        return (
            g.draw(st.integers(0, rank - 1)),
            g.choice((0, 1, 2, -3)),
            g.choice((None, -1, -2, 3)),
            g.choice((1, 2, 3)),
        )
    if fn is SV.EXPAND_NEW:
        return (g.draw(st.integers(0, rank)), g.choice((2, 3, 5)))
    if fn is SV.NARROW:
        return (g.draw(st.integers(0, rank - 1)),) if rank else None
    return ()


def symview(g: Gen) -> int | None:
    x = g.pick(lambda v: True)
    if x is None:
        return None
    v = g.vals[x]
    fn = g.choice(list(SV))
    srcs: tuple[int, ...] = (x,)
    if fn is SV.EXPAND_AS:
        y = g.pick(lambda w: w.shape != v.shape and _expands_to(v.shape, w.shape))
        if y is None:
            return None
        srcs = (x, y)
    params = _symview_params(g, fn, v)
    if params is None:
        return None
    return g.add(Step(DynKind.SYMVIEW, fn, srcs, params), v.bound, v.exact)


def _expands_to(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    if len(a) > len(b):
        return False
    return all(x in (1, y) for x, y in zip(a[::-1], b[::-1]))


# Views whose params name dims, not sizes (the rest of V's are covered by SV's relative forms).
PLAIN_VIEWS = (V.PERMUTE, V.TRANSPOSE, V.UNSQUEEZE, V.FLATTEN, V.CONTIGUOUS, V.SQUEEZE)


def plain_view(g: Gen) -> int | None:
    x = g.pick(lambda v: True)
    if x is None:
        return None
    v = g.vals[x]
    fn = g.choice(PLAIN_VIEWS)
    params = graphs_layout._view_params(g, fn, v.shape)
    if params is None:
        return None
    return g.add(Step(Kind.VIEW, fn, (x,), params), v.bound, v.exact)


def _builders(cfg: Config) -> list[Callable[[Gen], int | None]]:
    from tests.fuzz.graphs_ops import BUILDERS

    kinds = [k for k in cfg.kinds if k in BUILDERS and k is not Kind.VIEW]
    return [BUILDERS[k] for k in kinds] + [symview] * 4 + [plain_view] * 2


def draw_dyn_base(g: Gen) -> tuple[int, ...]:
    """A rank 1-4 shape with the first marker at a drawn dim (batch, sequence, reduced or GEMM M
    dim, as the steps use it) and sometimes the second at another; other dims small."""
    rank = g.draw(st.integers(1, 4))
    dims = [g.choice(SIZES[:8]) for _ in range(rank)]
    where = g.draw(st.permutations(range(rank)))
    dims[where[0]] = MARKERS[0]
    if rank > 1 and g.flag(3):
        dims[where[1]] = MARKERS[1]
    while math.prod(dims) > g.cfg.max_numel:
        i = max((k for k in range(rank) if dims[k] not in MARKERS), key=lambda k: dims[k], default=None)
        if i is None or dims[i] == 1:
            break
        dims[i] = max(1, dims[i] // 2)
    return tuple(dims)


MOTIFS = (conv_norm, norm_block, permuted_softmax)  # reshape_reduce's reshapes name sizes


@st.composite
def dyn_programs(draw: Callable[[Any], Any], cfg: Config) -> Program:
    """A program over marker sizes, per `cfg` (programs() in graphs.py, with the views above)."""
    g = DynGen(draw, cfg)
    base = draw_dyn_base(g)
    dtype = draw_dtype(g)
    for _ in range(draw(st.integers(1, 3))):
        draw_main_input(g, base, dtype if g.flag(4) or len(g.inputs) == 0 else draw_dtype(g))
    grow(g, cfg, _builders(cfg), MOTIFS)
    dynamic = [i for i, v in enumerate(g.vals) if any(n in MARKERS for n in v.shape)]
    if not any(marker_dims(s) for s in g.inputs) or not dynamic:
        reject()
    outputs = [len(g.vals) - 1]
    for _ in range(draw(st.integers(0, 2))):
        outputs.append(draw(st.integers(0, len(g.vals) - 1)))
    seed = draw(st.integers(0, 2**31 - 1))
    return g.program(tuple(dict.fromkeys(outputs)), seed)


# Sizes the markers are run at after the first call (at MARKERS): crossing vector widths and
# thresholds; a large one is added per program (check_dynamic.large_size).
SMALL = (2, 3, 5, 7, 15, 16, 17)
MID = (31, 63, 64, 65, 127, 129, 255, 257)

DYN_KINDS = tuple(k for k in KINDS if k is not Kind.VIEW)
