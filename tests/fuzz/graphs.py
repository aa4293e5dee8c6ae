"""Hypothesis strategies for fuzz programs: `programs(config)` draws a Program.

A `Gen` grows the program one step at a time. Every step is tried on zero-filled CPU tensors of
the real shapes and dtypes first (so only programs eager accepts are drawn), and every value
carries two facts the generator keeps:

- `bound`: a rough bound on |value|, so exp, products and casts to float16 are drawn only where
  they cannot overflow (an overflow that depends on a rounding error is noise, not a bug);
- `exact`: whether eager and vfuse must compute the value bit for bit (inputs, views, abs, max,
  integer arithmetic, casts and comparisons of exact values). Discontinuous ops (comparisons,
  floor, argmax, float->int casts) only read exact values, so their results are compared exactly.

The op builders are in `graphs_ops.py`; this module holds the machinery, inputs and shapes.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import strategies as st
from tests.fuzz.ops import apply
from tests.fuzz.program import Input, Kind, Layout, Program, Step, Values

FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INTS = (torch.int32, torch.int64, torch.int8, torch.uint8)
# The first entries are what hypothesis shrinks towards.
SIZES = (2, 3, 1, 5, 4, 7, 8, 13, 16, 17, 31, 32, 64, 0)
# Larger than a 1 MiB L2 as float32 rows (and prime): rows that stream from memory.
LARGE = 262147
# Bounds past these would risk an overflow (to inf) that depends on rounding.
LIMIT = {torch.float16: 2e3, torch.bfloat16: 1e5, torch.float32: 1e6, torch.float64: 1e6}
INT_LIMIT = 1e8  # int32/int64 values stay far from overflow (signed overflow is UB in C++)


# Step kinds drawn, with repeats as weights: views, reductions and norms (what fusion has to get
# right across) more often than the rest.
KINDS = (
    *(Kind.VIEW, Kind.REDUCE) * 3,
    *(Kind.BINARY, Kind.NORM) * 2,
    *(k for k in Kind if k not in (Kind.INPUT, Kind.VIEW, Kind.REDUCE, Kind.BINARY, Kind.NORM)),
)


@dataclass(frozen=True)
class Config:
    """What the drawn programs may contain."""

    dtypes: tuple[torch.dtype, ...] = (torch.float32,) * 4 + FLOATS[1:] + INTS + (torch.bool,)
    kinds: tuple[Kind, ...] = KINDS
    min_steps: int = 3
    max_steps: int = 8
    max_numel: int = 4096
    large: bool = True  # occasionally one dim of LARGE elements
    grad: bool = False  # backward programs: float32/float64 only, no casts
    negative_indices: bool = True  # x[idx] with idx in [-n, n)
    motifs: int = 3  # of every 10 steps, about this many are motifs (graphs_motifs.py)


class TooLarge(Exception):
    """A builder asked for an input too large to test with; the step is dropped."""


@dataclass
class Val:
    shape: tuple[int, ...]
    dtype: torch.dtype
    bound: float
    exact: bool
    special: bool = False  # may hold NaN or inf (from an input with Values.SPECIAL)

    @property
    def is_float(self) -> bool:
        return self.dtype.is_floating_point

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass
class Gen:
    """The program drawn so far: inputs, steps, and for each value its facts and a probe tensor."""

    draw: Callable[[Any], Any]
    cfg: Config
    inputs: list[Input] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    vals: list[Val] = field(default_factory=list)
    probes: list[torch.Tensor] = field(default_factory=list)

    # -- drawing helpers --------------------------------------------------------------------
    def pick(self, pred: Callable[[Val], bool]) -> int | None:
        """An earlier value satisfying `pred`, preferring recent ones (shrinks towards the last)."""
        found = [i for i, v in enumerate(self.vals) if pred(v)]
        if not found:
            return None
        return found[-1 - self.draw(st.integers(0, len(found) - 1))]

    def choice(self, options: Sequence[Any]) -> Any:
        return self.draw(st.sampled_from(list(options)))

    def flag(self, one_in: int = 2) -> bool:
        return self.draw(st.integers(0, one_in - 1)) == 0

    def fits(self, bound: float, dtype: torch.dtype) -> bool:
        if dtype.is_floating_point:
            return bound <= LIMIT[dtype]
        return dtype in (torch.int8, torch.uint8, torch.bool) or bound <= INT_LIMIT

    # -- adding values ----------------------------------------------------------------------
    def add_input(self, spec: Input, bound: float | None = None) -> int:
        if math.prod(spec.shape) > 4 * LARGE:
            raise TooLarge(f"input of shape {spec.shape}")
        index = len(self.inputs)
        self.inputs.append(spec)
        if bound is None:
            bound = _input_bound(spec)
        self.steps.append(Step(Kind.INPUT, params=(index,)))
        self.vals.append(Val(spec.shape, spec.dtype, bound, True, spec.values is Values.SPECIAL))
        self.probes.append(_probe(spec))
        return len(self.vals) - 1

    def fresh(self, shape: tuple[int, ...], dtype: torch.dtype, **kw: Any) -> int:
        """A new graph input (a weight, an index) for the step being built."""
        return self.add_input(Input(tuple(shape), dtype, **kw))

    def add(self, step: Step, bound: float, exact: bool) -> int | None:
        """Append `step` if eager accepts it on probes; returns its value index, or None."""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = apply(step, self.probes)
        except (RuntimeError, ValueError, IndexError, TypeError):
            return None
        if not isinstance(out, torch.Tensor) or out.numel() > 8 * self.cfg.max_numel + 2 * LARGE:
            return None
        if not out.is_floating_point():
            exact = True  # integer and bool results are exact when their operands were (the builders check)
        if not self.fits(bound, out.dtype):
            return None
        special = out.is_floating_point() and any(self.vals[i].special for i in step.srcs)
        self.steps.append(step)
        self.vals.append(Val(tuple(out.shape), out.dtype, bound, exact, special))
        self.probes.append(out)
        return len(self.vals) - 1

    def mark(self) -> tuple[int, int]:
        return len(self.inputs), len(self.steps)

    def rollback(self, mark: tuple[int, int]) -> None:
        """Forget what a builder added (fresh inputs) when its step was not accepted."""
        n_in, n_steps = mark
        del self.inputs[n_in:], self.steps[n_steps:], self.vals[n_steps:], self.probes[n_steps:]

    # -- shapes -----------------------------------------------------------------------------
    def size(self) -> int:
        return self.choice(SIZES)

    def shape(self, rank: int) -> tuple[int, ...]:
        dims = [self.size() for _ in range(rank)]
        while math.prod(dims) > self.cfg.max_numel:
            i = max(range(rank), key=lambda k: dims[k])
            dims[i] = max(1, dims[i] // 2)
        return tuple(dims)

    def program(self, outputs: tuple[int, ...], seed: int) -> Program:
        return Program(tuple(self.inputs), tuple(self.steps), outputs, seed)


def _input_bound(spec: Input) -> float:
    if spec.dtype == torch.bool:
        return 1.0
    if spec.dtype.is_floating_point:
        return 4.5
    low = spec.low if spec.low is not None else -20
    high = spec.high if spec.high is not None else 21
    return float(max(abs(low), abs(high)))


def _probe(spec: Input) -> torch.Tensor:
    """Zeros of the input's shape and dtype: valid indices, nonzero-free divisors are guarded."""
    return torch.zeros(spec.shape, dtype=spec.dtype)


def int_range(dtype: torch.dtype) -> tuple[int, int]:
    """The [low, high) an integer input of `dtype` draws from: small for wide types (no overflow),
    the full range for 8-bit types (wrap-around is defined there)."""
    if dtype == torch.int8:
        return -128, 128
    if dtype == torch.uint8:
        return 0, 256
    return -20, 21


def draw_main_input(g: Gen, base: tuple[int, ...], dtype: torch.dtype) -> int:
    """A graph input whose shape broadcasts with `base` (some dims 1, fewer leading dims), in a
    drawn layout, sometimes the very tensor of an earlier input (aliasing)."""
    same = [i for i, s in enumerate(g.inputs) if s.alias is None and s.dtype == dtype and s.shape == base]
    if same and g.flag(4):
        j = g.choice(same)
        return g.add_input(Input(base, dtype, g.inputs[j].layout, alias=j), bound=g.vals[_input_value(g, j)].bound)
    rank = len(base)
    drop = g.draw(st.integers(0, rank)) if g.flag(3) else 0
    shape = tuple(1 if g.flag(5) else d for d in base[drop:])
    layout = g.choice(list(Layout)) if g.flag(3) else Layout.CONTIGUOUS
    values = Values.SPECIAL if dtype.is_floating_point and not g.cfg.grad and g.flag(12) else Values.NORMAL
    low, high = int_range(dtype) if not dtype.is_floating_point and dtype != torch.bool else (None, None)
    return g.add_input(Input(shape, dtype, layout, low=low, high=high, values=values))


def weight(g: Gen, shape: tuple[int, ...], dtype: torch.dtype, values: Values = Values.NORMAL) -> int:
    """A fresh parameter-like input, sometimes stored transposed."""
    layout = Layout.TRANSPOSED if len(shape) >= 2 and g.flag(4) else Layout.CONTIGUOUS
    return g.fresh(shape, dtype, layout=layout, values=values)


def index_input(g: Gen, shape: tuple[int, ...], low: int, high: int) -> int:
    """A fresh integer index input with values in [low, high)."""
    return g.fresh(shape, torch.int32 if g.flag(5) else torch.int64, low=low, high=high)


def small_shape(g: Gen, rank: int) -> tuple[int, ...]:
    return tuple(g.choice(SIZES[:8]) for _ in range(rank))


def _input_value(g: Gen, input_index: int) -> int:
    return next(i for i, s in enumerate(g.steps) if s.kind is Kind.INPUT and s.params[0] == input_index)


def draw_base(g: Gen) -> tuple[int, ...]:
    rank = g.draw(st.integers(1, 4)) if not g.flag(20) else 0
    if g.cfg.large and rank and g.flag(25):
        dims = [1 if g.flag() else 2 for _ in range(min(rank, 2))]
        dims[g.draw(st.integers(0, len(dims) - 1))] = LARGE
        return tuple(dims)
    return g.shape(rank)


def draw_dtype(g: Gen) -> torch.dtype:
    return g.choice(g.cfg.dtypes)


def broadcastable(a: Sequence[int], b: Sequence[int]) -> bool:
    try:
        torch.broadcast_shapes(tuple(a), tuple(b))
    except RuntimeError:
        return False
    return True


def grow(g: Any, cfg: Any, builders: list[Any], motifs: Sequence[Any]) -> None:
    """Append between cfg.min_steps and cfg.max_steps steps: `motifs` or `builders` (an equal-weight
    list: repeats are weights), each rolled back when it draws nothing buildable."""
    wanted, tries = g.draw(st.integers(cfg.min_steps, cfg.max_steps)), 0
    while len(g.steps) - len(g.inputs) < wanted and tries < 3 * wanted:
        tries += 1
        build = g.choice(motifs) if g.draw(st.integers(0, 9)) < cfg.motifs else g.choice(builders)
        mark = g.mark()
        try:
            built = build(g)
        except TooLarge:
            built = None
        if built is None:
            g.rollback(mark)


@st.composite
def programs(draw: Callable[[Any], Any], cfg: Config = Config()) -> Program:
    """A random program per `cfg`: 1-3 main inputs, up to cfg.max_steps ops, 1-3 outputs."""
    from tests.fuzz.graphs_motifs import MOTIFS
    from tests.fuzz.graphs_ops import BUILDERS

    g = Gen(draw, cfg)
    base = draw_base(g)
    dtype = draw_dtype(g)
    for _ in range(draw(st.integers(1, 3))):
        draw_main_input(g, base, dtype if g.flag(4) or len(g.inputs) == 0 else draw_dtype(g))
    kinds = [k for k in cfg.kinds if k in BUILDERS]  # repeats kept: they are weights
    grow(g, cfg, [BUILDERS[k] for k in kinds], MOTIFS)
    outputs = [len(g.vals) - 1]
    for _ in range(draw(st.integers(0, 2))):
        outputs.append(draw(st.integers(0, len(g.vals) - 1)))
    seed = draw(st.integers(0, 2**31 - 1))
    return g.program(tuple(dict.fromkeys(outputs)), seed)
