"""render_gemm: C[b] = epilogue(A[b] @ B[b]) as one self-contained C++17 function.

Generated signature:
    <linkage> void <name>(const float* A, const float* B, float* C, <epilogue args>, int nthreads)

A is row-major M x K (row stride lda), B is row-major K x N (ldb) or, with trans_b, N x K (ldb)
as nn.Linear stores its weight; C is row-major M x N (ldc). Batch dims broadcast through zero
strides. All sizes are baked in as constants (shapes are static in vfuse today), so GCC
specializes the loops. nthreads <= 0 means omp_get_max_threads().
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from vfuse.codegen.cpp.gemm.blocking import Blocking, choose_blocking
from vfuse.codegen.cpp.gemm.driver import Driver, render_driver
from vfuse.codegen.cpp.gemm.epilogue import Epilogue
from vfuse.codegen.cpp.gemm.microkernel import PACKERS, render_microkernel
from vfuse.codegen.cpp.gemm.prelude import render_prelude

# This machine's caches (per-core L1d/L2, shared L3): the default when no Target is given.
DEFAULT_CACHES = (48 << 10, 1 << 20, 32 << 20)


def check_kernel_name(name: str) -> None:
    """Kernel names become C function names in the generated translation unit."""
    if not (name.isidentifier() and name.isascii()):
        raise ValueError(f"kernel name {name!r} is not a C identifier")


@dataclass(frozen=True, slots=True)
class GemmSpec:
    """Shapes and element strides of one (batched) fp32 GEMM.

    batch: batch dims (possibly empty); a/b/c_batch_strides: one element stride per batch dim,
    0 where that operand broadcasts. lda/ldb/ldc default to the dense row length.
    caches: (l1, l2, l3) bytes for blocking; blocking overrides the choice entirely.
    """

    name: str
    m: int
    n: int
    k: int
    trans_b: bool = False
    batch: tuple[int, ...] = ()
    a_batch_strides: tuple[int, ...] = ()
    b_batch_strides: tuple[int, ...] = ()
    c_batch_strides: tuple[int, ...] = ()
    lda: int | None = None
    ldb: int | None = None
    ldc: int | None = None
    linkage: str = 'extern "C"'
    caches: tuple[int, int, int] = DEFAULT_CACHES
    blocking: Blocking | None = field(default=None)

    def __post_init__(self) -> None:
        check_kernel_name(self.name)
        if min(self.m, self.n, self.k) < 1:
            raise ValueError(f"{self.name}: empty GEMM {self.m}x{self.k} @ {self.k}x{self.n}")
        strides = (self.a_batch_strides, self.b_batch_strides, self.c_batch_strides)
        if any(len(s) != len(self.batch) for s in strides):
            raise ValueError(f"{self.name}: need one batch stride per batch dim {self.batch}")

    @classmethod
    def from_shapes(
        cls, name: str, a_shape: tuple[int, ...], b_shape: tuple[int, ...], trans_b: bool = False, **kw: object
    ) -> GemmSpec:
        """The spec for torch.matmul(a, b) (or a @ b.mT with trans_b) on contiguous tensors.

        Batch dims broadcast as in torch: missing or size-1 dims of an operand get stride 0.
        """
        m, k = a_shape[-2:]
        n = b_shape[-2] if trans_b else b_shape[-1]
        if (b_shape[-1] if trans_b else b_shape[-2]) != k:
            raise ValueError(f"{name}: inner dims differ: {a_shape} @ {b_shape} (trans_b={trans_b})")
        rank = max(len(a_shape), len(b_shape)) - 2
        a_b, b_b = (1,) * (rank + 2 - len(a_shape)) + a_shape[:-2], (1,) * (rank + 2 - len(b_shape)) + b_shape[:-2]
        batch = tuple(max(x, y) for x, y in zip(a_b, b_b, strict=True))
        if any(d not in (1, b) for dims in (a_b, b_b) for d, b in zip(dims, batch, strict=True)):
            raise ValueError(f"{name}: batch dims do not broadcast: {a_shape} @ {b_shape}")
        return cls(
            name, m, n, k, trans_b, batch, _strides(a_b, m * k), _strides(b_b, k * n), _strides(batch, m * n), **kw
        )

    @property
    def lead(self) -> tuple[int, int, int]:
        ldb_dense = self.k if self.trans_b else self.n
        return (self.lda or self.k, self.ldb or ldb_dense, self.ldc or self.n)

    def tiles(self) -> Blocking:
        return self.blocking or choose_blocking(self.m, self.n, self.k, *self.caches)


def _strides(dims: tuple[int, ...], inner: int) -> tuple[int, ...]:
    """Contiguous element strides of batch dims over `inner`-element matrices; 0 for size-1 dims."""
    out, step = [], inner
    for d in reversed(dims):
        out.append(step if d != 1 else 0)
        step *= d
    return tuple(reversed(out))


def batch_setup(spec: GemmSpec) -> str:
    """Decompose the flat batch index into per-operand offsets (innermost dim varies fastest)."""
    lines = ["  long rem = bi, ao = 0, bo = 0, co = 0;\n"]
    dims = zip(spec.batch, spec.a_batch_strides, spec.b_batch_strides, spec.c_batch_strides, strict=True)
    for size, sa, sb, sc in reversed(list(dims)):
        offsets = f"ao += x * {sa}; bo += x * {sb}; co += x * {sc};"
        lines.append(f"  {{ const long x = rem % {size}; rem /= {size}; {offsets} }}\n")
    lines.append("  (void)rem;\n  const float* __restrict a_b = A + ao;\n")
    lines.append("  const float* __restrict b_b = B + bo;\n  float* __restrict c_b = C + co;\n")
    return "".join(lines)


def render_gemm(spec: GemmSpec, epilogue: Epilogue) -> str:
    """The kernel's C++ source: guarded prelude, micro-kernel and packers, then the function."""
    lda, ldb, ldc = spec.lead
    blk = spec.tiles()
    if spec.trans_b:
        pack = f"vg_pack_b_cols<{blk.nr}>(b_b + j * {ldb} + pc, {ldb}, kc, nr, bps);"
    else:
        pack = f"vg_pack_b_rows<{blk.nr}>(b_b + pc * {ldb} + j, {ldb}, kc, nr, bps);"
    driver = Driver(
        name=spec.name,
        linkage=spec.linkage,
        params="const float* __restrict A, const float* __restrict B, float* __restrict C",
        args="A, B, C",
        batch=math.prod(spec.batch),
        m=spec.m,
        n=spec.n,
        k=spec.k,
        lda=lda,
        ldc=ldc,
        batch_setup=batch_setup(spec),
        pack_b=pack,
        row_names="    [[maybe_unused]] const long b = bi;\n",
    )
    header = f"// vfuse gemm {spec.name}: {spec.m}x{spec.k} @ {spec.k}x{spec.n}, epilogue {epilogue.name}, {blk}\n"
    return (
        render_prelude() + PACKERS + render_microkernel(blk.mr, blk.nr) + header + render_driver(driver, blk, epilogue)
    )
