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
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Prologue:
    """One operand element as C++: `body` statements, then `value` (a float expression)."""

    body: tuple[str, ...]
    value: str
    inner: str = "c"

    def __post_init__(self) -> None:
        if self.inner not in ("r", "c"):
            raise ValueError(f"prologue inner index must be 'r' or 'c', got {self.inner!r}")


def packer_name(kernel: str, side: str) -> str:
    return f"{kernel}_pack_{side}"


def render_packer(kernel: str, side: str, width: int, pro: Prologue, params: str) -> str:
    """`NAME_pack_<side>(b, s0, k0, ns, kc, dst, <params>)`: `ns` <= width sliver entries from
    `s0` (A: rows, B: columns) by `kc` steps of K from `k0`, k-major and zero-padded to `width`
    entries, as the micro-kernel reads them (the layout of vg_pack_a / vg_pack_b_*)."""
    if side not in ("a", "b"):
        raise ValueError(f"side must be 'a' or 'b', got {side!r}")
    sliver, kdim = ("r", "c") if side == "a" else ("c", "r")
    body = "".join(f"      {s}\n" for s in pro.body)
    head = (
        f"static inline void {packer_name(kernel, side)}(long b, long s0, long k0, long ns, long kc,\n"
        f"    float* __restrict dst{params}) {{\n  (void)b;\n"
    )
    if pro.inner == kdim:
        # Contiguous along K: one sliver entry at a time, K innermost (stores stride `width`).
        loops = f"""  for (long s = 0; s < ns; ++s) {{
    [[maybe_unused]] const long {sliver} = s0 + s;
#pragma omp simd
    for (long kk = 0; kk < kc; ++kk) {{
      [[maybe_unused]] const long {kdim} = k0 + kk;
{body}      dst[kk * {width} + s] = {pro.value};
    }}
  }}
  for (long s = ns; s < {width}; ++s)
    for (long kk = 0; kk < kc; ++kk) dst[kk * {width} + s] = 0.0f;
"""
    else:
        # Contiguous along the sliver: one K step at a time, its `width` entries innermost.
        loops = f"""  for (long kk = 0; kk < kc; ++kk) {{
    [[maybe_unused]] const long {kdim} = k0 + kk;
    float* __restrict row = dst + kk * {width};
#pragma omp simd
    for (long s = 0; s < ns; ++s) {{
      [[maybe_unused]] const long {sliver} = s0 + s;
{body}      row[s] = {pro.value};
    }}
    for (long s = ns; s < {width}; ++s) row[s] = 0.0f;
  }}
"""
    return head + loops + "}\n"
