"""Streamed passes (`Pass.streamed`): stores written around the caches.

A plain store to a line that is not cached first reads the line (read-for-ownership), so
`out = a + b` moves four bytes per three it needs. Lines of an output larger than the LLC
are evicted before anyone reads them, so caching them buys nothing. Here the SIMD loop runs
in chunks of CHUNK elements: the vectorized body writes each output into an L1 chunk buffer,
then `vf_stream` (prelude) copies the chunk out with non-temporal stores. g++ has no pragma
that makes its vectorizer emit those, hence the buffer. The schedule decides which kernels
stream (`schedule.nest.with_streaming`); each thread fences its stores before the barrier.
Over symbolic sizes the schedule may leave the choice to each call (`Kernel.stream_gate`): the
kernel computes STREAM_FLAG once from the call's sizes, and its chunk loop stores into the chunk
buffers that `vf_stream` copies out, or else straight into the outputs: one loop for both.
"""

from __future__ import annotations

from vfuse.codegen.cpp.rules import COMPUTE_TYPE, STORAGE_TYPE, STORE_CONVERT
from vfuse.codegen.cpp.writer import KernelWriter, pointer
from vfuse.schedule import expr
from vfuse.schedule.kernel import Loop, Pass, Store

CHUNK = 1024  # elements per chunk: at most 8 KiB per output, so the buffers stay in L1
STREAM_FLAG = "vf_streamed"  # a gated kernel's per-call choice (symbols are vf_s0, ...: no clash)


def _outputs(w: KernelWriter, stores: list[Store], vec: Loop, at: str = "vb") -> list[str]:
    """Where each store's chunk starts in its output (`&out[index at vb]`)."""
    return [f"&{pointer(s.buf)}[{expr.render(s.index, {**w.names, vec.var: at})}]" for s in stores]


def _copy_out(w: KernelWriter, stores: list[Store], vec: Loop) -> None:
    """Each chunk buffer to its output around the caches (in a gated kernel, when the call's
    flag says so: otherwise the loop stored into the output itself)."""
    gated = w.k.stream_gate is not None
    if gated:
        w.open(f"if ({STREAM_FLAG}) {{")
    for j, out in enumerate(_outputs(w, stores, vec)):
        w.w(f"vf_stream({out}, sb{j}, (size_t)(ve - vb) * sizeof(sb{j}[0]));")
    if gated:
        w.close()


def serial_copy(w: KernelWriter, at: int) -> None:
    """Where the kernel's threads are chosen per call (`Kernel.thread_gate`), the parallel loop or
    region written since `at` (from its `omp parallel` pragma) also as a serial copy for `nt == 1`,
    without its OpenMP pragmas: entering a region of one thread costs libgomp ~0.4 us, more than a
    short row's loop (tiny_graph's 11 pass loops: 5.6 -> 1.8 us per call)."""
    if w.k.thread_gate is None:
        return
    region = w.lines[at:]
    assert region[0].lstrip().startswith("#pragma omp parallel"), region[0]
    serial = [line for line in region if not line.lstrip().startswith(("#pragma omp parallel", "#pragma omp for"))]
    del w.lines[at:]
    w.open("if (nt > 1) {")
    w.lines += ["  " + line for line in region]
    w.close()
    w.open("else {")
    w.lines += ["  " + line for line in serial]
    w.close()


def render_streamed(w: KernelWriter, p: Pass) -> None:
    """The SIMD nest of `p` (the kernel's inner loops, the last one SIMD) with its stores
    streamed chunk by chunk. A row kernel (outer loops) fences once per thread after its
    rows (`rows.py`), a pointwise kernel here."""
    *rest, vec = w.k.inner
    par = [lp for lp in rest if lp.parallel and not p.serial]
    threaded = bool(par) or (vec.parallel and not p.serial)
    row = bool(w.k.outer)
    at = w.mark()
    if threaded:
        w.w("#pragma omp parallel num_threads(nt)")
        w.open("{")
        # par loops, or else the chunk loop, are split between threads; no barrier before the fence.
        collapse = f" collapse({len(par)})" if len(par) > 1 else ""
        w.w(f"#pragma omp for schedule(static) nowait{collapse}")
    for lp in rest:
        w.open_loop(lp)
    stores = [s for s in p.body if isinstance(s, Store)]
    if p.stream_lanes:
        w.open(f"if ({_aligned(w, stores, vec, p.stream_lanes)}) {{")
        _from_registers(w, p, vec, stores)
        w.close()
        w.open("else {")
    _chunk(w, p, vec, stores)
    _copy_out(w, stores, vec)
    w.close(1 + len(rest) + bool(p.stream_lanes))
    if not row:
        w.w("vf_stream_fence();")
    if threaded:
        w.close()
        serial_copy(w, at)


# The non-temporal store of one register of fp32 lanes, by the lanes the schedule chose; elsewhere
# (another architecture) a plain store: the same values, cached.
_NT_STORE = {
    8: ("__AVX__", "_mm256_stream_ps({0}, _mm256_load_ps({1}));"),
    4: ("__SSE__", "_mm_stream_ps({0}, _mm_load_ps({1}));"),
}


def _aligned(w: KernelWriter, stores: list[Store], vec: Loop, lanes: int) -> str:
    """The condition for the register path: every output's row starts on a store's alignment (its
    offsets step by `lanes`), and, in a gated kernel, the call streams."""
    starts = [f"(uintptr_t){out}" for out in _outputs(w, stores, vec, "0")]
    cond = f"(({' | '.join(starts)}) & {4 * lanes - 1}) == 0"
    return f"{STREAM_FLAG} && {cond}" if w.k.stream_gate is not None else cond


def _from_registers(w: KernelWriter, p: Pass, vec: Loop, stores: list[Store]) -> None:
    """The SIMD loop in steps of `p.stream_lanes`, each output's step stored with a non-temporal
    store: g++ vectorizes each step into one register and forwards the buffer's value into it, so
    nothing goes through L1 (`strategy.STREAM_LANES`)."""
    n = p.stream_lanes
    w.open(f"for (int64_t vb = 0; vb < {vec.size}; vb += {n}) {{")
    w.w(f"const int64_t ve = vb + {n};")
    for j in range(len(stores)):
        w.w(f"alignas({4 * n}) float sb{j}[{n}];")
    _body(w, p, vec, stores, "sb")
    for line in nt_stores(list(zip(_outputs(w, stores, vec), [f"sb{j}" for j in range(len(stores))])), n):
        w.w(line)
    w.close()


def nt_stores(pairs: list[tuple[str, str]], lanes: int) -> list[str]:
    """Lines storing each (output address, aligned buffer of `lanes` floats) pair with one
    non-temporal store (a plain copy where the architecture has none)."""
    guard, store = _NT_STORE[lanes]
    return [
        f"#if defined({guard})",
        *(store.format(out, buf) for out, buf in pairs),
        "#else",
        *(f"std::memcpy({out}, {buf}, sizeof({buf}));" for out, buf in pairs),
        "#endif",
    ]


def _body(w: KernelWriter, p: Pass, vec: Loop, stores: list[Store], dst: str) -> None:
    """The vectorized loop from `vb` to `ve`, each store into `dst`<j>[i - vb]."""
    w.w("#pragma omp simd")
    w.open_loop(vec, "vb", "ve")
    for v in p.reloaded:  # row kernels: values an earlier pass kept in a row buffer
        w.w(f"const {COMPUTE_TYPE[w.dtypes[v]]} {v} = rb_{v}[{w.idx(w.k.row_index)}];")
    for s in p.body:
        if isinstance(s, Store):
            conv = STORE_CONVERT.get(s.dtype, "{0}").format(s.arg)
            w.w(f"{dst}{stores.index(s)}[{w.names[vec.var]} - vb] = {conv};")
        else:
            w.stmt(s)
    w.close()


def _chunk(w: KernelWriter, p: Pass, vec: Loop, stores: list[Store]) -> None:
    """Open the chunk loop and write its vectorized body into the chunk buffers (left open)."""
    w.open(f"for (int64_t vb = 0; vb < {vec.size}; vb += {CHUNK}) {{")
    w.w(f"const int64_t ve = vb + {CHUNK} < {vec.size} ? vb + {CHUNK} : {vec.size};")
    for j, s in enumerate(stores):
        w.w(f"alignas(64) {STORAGE_TYPE[s.dtype]} sb{j}[{CHUNK}];")
    if w.k.stream_gate is not None:
        # Per call: into the chunk buffer to be streamed, or straight into the output. A plain
        # copy of the buffer instead cost 7-17 % of softmax's time in L2 and LLC (Zen 3).
        for j, (s, out) in enumerate(zip(stores, _outputs(w, stores, vec), strict=True)):
            w.w(f"{STORAGE_TYPE[s.dtype]}* const sd{j} = {STREAM_FLAG} ? sb{j} : {out};")
    _body(w, p, vec, stores, "sd" if w.k.stream_gate is not None else "sb")
