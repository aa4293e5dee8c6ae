"""Render a SCATTER_ADD `ContractionKernel` (ir/defs/scatter.py) as a static C++ function.

out (B, R, W) starts as zeros (or a copy of init); each term n of plane b then adds values[b, n]
into row index[b, n], in ascending n, so every element sums its terms in the source's order
whatever the walk (`ScatterWalk`, the schedule's choice): SERIAL, PLANES (planes split between
threads) or ROW_RANGES (thread t owns rows [R t / T, R (t + 1) / T) of every plane and reads all
indices). Sizes are the function's arguments, so one build serves every size of a graph with
symbolic sizes. Each index is compared with R as it is read (free next to the scattered add); a bad
one is skipped and, after the loops, `vf_check_rows` records the first bad index in row-major
order (the fault the reference raises), so a clean call makes no extra pass over the indices.
"""

from __future__ import annotations

from vfuse.codegen.cpp.faults import FAULT_VAR, c_string, fault_offset
from vfuse.codegen.cpp.rules import STORAGE_TYPE
from vfuse.codegen.cpp.writer import pointer
from vfuse.schedule.kernel import ContractionKernel, Program, ScatterWalk


def _term(k: ContractionKernel, w: object, lo_hi: bool) -> list[str]:
    """The loop over plane b's terms: check, skip, own-range test, the row's add."""
    skip = k.attrs["skip"]
    lines = [
        "for (int64_t n = 0; n < N; ++n) {",
        "  const int64_t r = (int64_t)ix[n] < 0 ? (int64_t)ix[n] + R : (int64_t)ix[n];"
        if k.attrs["wrap"]
        else "  const int64_t r = (int64_t)ix[n];",
        "  if ((uint64_t)r >= (uint64_t)R) { bad = 1; continue; }",
    ]
    if lo_hi:
        lines.append("  if (r < lo || r >= hi) continue;")
    if skip is not None:
        lines.append(f"  if (r == {int(skip)}) continue;")
    if isinstance(w, int) and w == 1:
        lines.append("  o[r] += vv[n];")
    else:
        lines += [
            "  T* d = o + r * W; const T* s = vv + n * W;",
            "  #pragma omp simd",
            "  for (int64_t j = 0; j < W; ++j) d[j] += s[j];",
        ]
    return [*lines, "}"]


def _start(k: ContractionKernel, first: str, count: str) -> str:
    """Rows [first, first + count) of plane b's output set to zero or to init's."""
    if len(k.operands) == 3:
        return f"std::memcpy(o + ({first}) * W, in + b * R * W + ({first}) * W, ({count}) * W * sizeof(T));"
    return f"std::memset((void*)(o + ({first}) * W), 0, ({count}) * W * sizeof(T));"


def _body(k: ContractionKernel, w: object) -> list[str]:
    plane = ["T* o = out + b * R * W;", "const I* ix = idx + b * N;", "const T* vv = v + b * N * W;"]
    if k.scatter is ScatterWalk.ROW_RANGES:
        head = ["#pragma omp parallel for num_threads(nt) schedule(static, 1) reduction(|: bad)",
                "for (int t = 0; t < nt; ++t) {",
                "  const int64_t lo = R * t / nt, hi = R * (t + 1) / nt;",
                "  for (int64_t b = 0; b < B; ++b) {"]  # fmt: skip
        inner = [*plane, _start(k, "lo", "hi - lo"), *_term(k, w, True)]
        return [*head, *(f"    {line}" for line in inner), "  }", "}"]
    pragma = ["#pragma omp parallel for num_threads(nt) schedule(static) reduction(|: bad)"]
    head = (pragma if k.scatter is ScatterWalk.PLANES else []) + ["for (int64_t b = 0; b < B; ++b) {"]
    inner = [*plane, _start(k, "0", "R"), *_term(k, w, False)]
    return [*head, *(f"  {line}" for line in inner), "}"]


def render_scatter(k: ContractionKernel, program: Program) -> tuple[str, str]:
    """(the template function, its call from the kernel wrapper)."""
    (b, n, w), rows = k.shapes[0], k.out_shape[1]
    vt, it = STORAGE_TYPE[program.buffers[k.out].type.dtype], STORAGE_TYPE[program.buffers[k.operands[1]].type.dtype]
    name = f"{k.name}_scatter"
    sig = (
        f"static void {name}(const {vt}* __restrict v, const {it}* __restrict idx, const {vt}* __restrict in, "
        f"{vt}* __restrict out, vf_fault* {FAULT_VAR}, const int64_t B, const int64_t N, const int64_t R, "
        "const int64_t W, int nt) {"
    )
    consts = [f"using T = {vt}; using I = {it};", "(void)in; (void)nt; (void)W; int bad = 0;"]
    lo = "-R" if k.attrs["wrap"] else "0"
    check = f"if (bad) vf_check_rows(idx, B * N, {lo}, R, {FAULT_VAR}, {c_string(k.node)});"
    source = "\n".join([sig, *(f"  {line}" for line in (*consts, *_body(k, w), check)), "}"])
    init = pointer(k.operands[2]) if len(k.operands) == 3 else "nullptr"
    fault = f"(vf_fault*)(arena + {fault_offset(program)})"
    # Sizes are arguments: a symbolic one (`vf_s0`, ir/sym.py) reads the wrapper's seeds array.
    sizes = ", ".join(f"(int64_t)({d})" for d in (b, n, rows, w))
    ptrs = f"{pointer(k.operands[0])}, {pointer(k.operands[1])}, {init}, {pointer(k.out)}"
    call = f"{name}({ptrs}, {fault}, {sizes}, nt);"
    return source, call
