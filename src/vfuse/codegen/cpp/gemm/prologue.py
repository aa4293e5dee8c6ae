"""Operand prologues: packers that compute an operand element while packing (C++ source text).

A quantized linear reads int8 activations and int8 weights and dequantizes them, e.g.
`(xq - zp) * scale` and `wq * w_scale[n]`. Storing the fp32 operands first would write (and
re-read) 4 bytes per element; instead the packer that copies an A block or a B sliver into the
micro-kernel's layout evaluates the operand there. B slivers are packed once per (jc, pc) block
and reused by every M block, so the prologue costs O(K * N) on B; an A block is packed once
per (jc, pc, ic), i.e. ceil(N / NC) times per element of A.

A prologue is C++ statements ending in a `float` expression, with these `long` names in scope:

    b = flat batch index, r = row and c = column of the operand (A: r = i, c = k; B: r = k, c = j)

plus the kernel's extra arguments (the epilogue's `args`, which the caller extends with the
buffers the prologues read; they must not be named like the packer's own locals s, kk, s0,
k0, ns, kc, dst, row). `inner` names the index the packer walks innermost: the one the
loads are contiguous along ("c" for a row-major operand, "r" for nn.Linear's N x K weight).
With `index32` (`fits_int32`: every index the prologue computes stays below 2^31) r and c are
`int`: g++ vectorizes a 32-bit division by a constant, while AVX2 has no 64-bit multiply-high, so
a strided conv's weight-gradient operand (K = (n, h, w) split by / and %) packed 4x slower.
`prefetch` holds the addresses (over the same names) of the loads contiguous along `inner`: the
block packer (`_block_loops`) asks for them a few K steps ahead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from vfuse.schedule.expr import Clamp, Div, Lin, Mod, Var


@dataclass(frozen=True, slots=True)
class Prologue:
    """One operand element as C++: `body` statements, then `value` (a float expression)."""

    body: tuple[str, ...]
    value: str
    inner: str = "c"
    index32: bool = False
    prefetch: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.inner not in ("r", "c"):
            raise ValueError(f"prologue inner index must be 'r' or 'c', got {self.inner!r}")


INT32_LIMIT = (1 << 31) - 1


def fits_int32(stmts: Iterable[object], shape: tuple[int, ...]) -> bool:
    """Whether every index expression of `stmts` (over Var(d) < shape[d]) keeps each partial sum
    within int32, whatever order C++ adds its terms in (then `int` r and c compute the same)."""
    if not all(isinstance(s, int) and s <= INT32_LIMIT for s in shape):
        return False
    sizes = dict(enumerate(shape))
    lins = [v for s in stmts if dataclasses.is_dataclass(s) for v in _fields(s) if isinstance(v, Lin)]
    return all((b := _bound(e, sizes)) is not None and b <= INT32_LIMIT for e in lins)


def _fields(s: object) -> list[object]:
    return [getattr(s, f.name) for f in dataclasses.fields(s)]  # type: ignore[arg-type]


def _bound(e: Lin, sizes: Mapping[int, int]) -> int | None:
    """An upper bound of |e| and of every partial sum of its terms (None: unknown, e.g. a
    symbolic size, a run-time index or a variable outside the operand's dims)."""
    if not isinstance(e.const, int):
        return None
    total = abs(e.const)
    for a, c in e.terms:
        b = _atom_bound(a, sizes)
        if b is None or not isinstance(c, int):
            return None
        total += abs(c) * b
    return total


def _atom_bound(a: object, sizes: Mapping[int, int]) -> int | None:
    if isinstance(a, Var):
        size = sizes.get(a.id)
        return size - 1 if isinstance(size, int) else None
    if isinstance(a, Div | Mod) and isinstance(a.divisor, int) and a.divisor:
        inner = _bound(a.arg, sizes)
        if inner is None:
            return None
        return inner // abs(a.divisor) if isinstance(a, Div) else min(inner, abs(a.divisor) - 1)
    if isinstance(a, Clamp) and isinstance(a.lo, int) and isinstance(a.hi, int):
        inner = _bound(a.arg, sizes)
        return None if inner is None else max(inner, abs(a.lo), abs(a.hi))
    return None


def packer_name(kernel: str, side: str) -> str:
    return f"{kernel}_pack_{side}"


def render_packer(kernel: str, side: str, width: int, pro: Prologue, params: str) -> str:
    """`NAME_pack_<side>(b, s0, k0, ns, kc, dst, <params>)`: `ns` <= width sliver entries from
    `s0` (A: rows, B: columns) by `kc` steps of K from `k0`, k-major and zero-padded to `width`
    entries, as the micro-kernel reads them (the layout of vg_pack_a / vg_pack_b_*). An A
    contiguous along its rows (inner "r") takes any `ns`: the block's slivers (`_block_loops`)."""
    if side not in ("a", "b"):
        raise ValueError(f"side must be 'a' or 'b', got {side!r}")
    sliver, kdim = ("r", "c") if side == "a" else ("c", "r")
    index = "int" if pro.index32 else "long"
    body = "".join(f"      {s}\n" for s in pro.body)
    head = (
        f"static inline void {packer_name(kernel, side)}(long b, long s0, long k0, long ns, long kc,\n"
        f"    float* __restrict dst{params}) {{\n  (void)b;\n"
    )
    if pro.inner == kdim:
        # Contiguous along K: one sliver entry at a time, K innermost (stores stride `width`).
        loops = f"""  for (long s = 0; s < ns; ++s) {{
    [[maybe_unused]] const {index} {sliver} = static_cast<{index}>(s0 + s);
#pragma omp simd
    for (long kk = 0; kk < kc; ++kk) {{
      [[maybe_unused]] const {index} {kdim} = static_cast<{index}>(k0 + kk);
{body}      dst[kk * {width} + s] = {pro.value};
    }}
  }}
  for (long s = ns; s < {width}; ++s)
    for (long kk = 0; kk < kc; ++kk) dst[kk * {width} + s] = 0.0f;
"""
    elif side == "a":
        loops = _block_loops(sliver, kdim, index, width, body, pro.value, pro.prefetch)
    else:
        # Contiguous along the sliver: one K step at a time, its `width` entries innermost.
        loops = f"""  for (long kk = 0; kk < kc; ++kk) {{
    [[maybe_unused]] const {index} {kdim} = static_cast<{index}>(k0 + kk);
    float* __restrict row = dst + kk * {width};
#pragma omp simd
    for (long s = 0; s < ns; ++s) {{
      [[maybe_unused]] const {index} {sliver} = static_cast<{index}>(s0 + s);
{body}      row[s] = {pro.value};
    }}
    for (long s = ns; s < {width}; ++s) row[s] = 0.0f;
  }}
"""
    return head + loops + "}\n"


# K steps ahead that the block packer prefetches: each step reads one run of the operand's row,
# a row apart (4 KB at 1024 columns), which the hardware prefetcher does not follow across pages.
PREFETCH_STEPS = 8
# Elements between prefetches along a run (one 64-byte line of fp32; narrower types ask twice).
PREFETCH_RUN = 16


def _block_prefetch(sliver: str, kdim: str, index: str, addrs: tuple[str, ...]) -> str:
    """Prefetch the run of K step kk + PREFETCH_STEPS (one address per line, and its last element),
    in a scope of its own so the prologue's address expressions read r and c there."""
    if not addrs:
        return ""
    fetch = "".join(f"        __builtin_prefetch({a}, 0, 3);\n" for a in addrs)
    return f"""    if (kk + {PREFETCH_STEPS} < kc) {{
      [[maybe_unused]] const {index} {kdim} = static_cast<{index}>(k0 + kk + {PREFETCH_STEPS});
      for (long q = 0; q < ns + {PREFETCH_RUN - 1}; q += {PREFETCH_RUN}) {{
        [[maybe_unused]] const {index} {sliver} = static_cast<{index}>(s0 + vg_min(q, ns - 1));
{fetch}      }}
    }}
"""


def _block_loops(sliver: str, kdim: str, index: str, width: int, body: str, value: str,
                 prefetch: tuple[str, ...] = ()) -> str:  # fmt: skip
    """An A operand contiguous along its rows (a weight gradient's dY^T): `ns` may cover many
    slivers (sliver q at dst + q * kc), packed one K step at a time across all of them, so each
    step reads one contiguous run of the row instead of `width` entries per sliver pass (per
    sliver, every K step touched a new line 4 KB away: the pack was ~20% of a wgrad GEMM). Each
    step's first line still stalled (half the packer's time): `prefetch` asks for later steps."""
    ahead = _block_prefetch(sliver, kdim, index, prefetch)
    return f"""  for (long kk = 0; kk < kc; ++kk) {{
{ahead}    [[maybe_unused]] const {index} {kdim} = static_cast<{index}>(k0 + kk);
    for (long q0 = 0; q0 < ns; q0 += {width}) {{
      float* __restrict row = dst + q0 * kc + kk * {width};
      if (ns - q0 >= {width}) {{
#pragma GCC unroll {width}
        for (long s = 0; s < {width}; ++s) {{
          [[maybe_unused]] const {index} {sliver} = static_cast<{index}>(s0 + q0 + s);
{body}          row[s] = {value};
        }}
        continue;
      }}
      for (long s = 0; s < ns - q0; ++s) {{
        [[maybe_unused]] const {index} {sliver} = static_cast<{index}>(s0 + q0 + s);
{body}        row[s] = {value};
      }}
      for (long s = ns - q0; s < {width}; ++s) row[s] = 0.0f;
    }}
  }}
"""
