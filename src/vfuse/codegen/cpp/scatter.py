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
    """The loop over plane b's terms (m = n * taps + t reads value n): skip, check, own-range test,
    the row's add."""
    skip, taps = k.attrs["skip"], int(k.attrs["taps"])
    read = "(int64_t)ix[m]"
    lines = [
        f"const int64_t r = {read} < 0 ? {read} + R : {read};" if k.attrs["wrap"] else f"const int64_t r = {read};"
    ]
    if skip is not None:
        lines.append(f"if (r == {int(skip)}) continue;")
    lines.append("if ((uint64_t)r >= (uint64_t)R) { bad = 1; continue; }")
    if lo_hi:
        lines.append("if (r < lo || r >= hi) continue;")
    if isinstance(w, int) and w == 1:
        lines.append("o[r] += vv[n];")
    else:
        lines += [
            "T* d = o + r * W; const T* s = vv + n * W;",
            "#pragma omp simd",
            "for (int64_t j = 0; j < W; ++j) d[j] += s[j];",
        ]
    if taps == 1:
        return ["for (int64_t n = 0; n < N; ++n) {", "  const int64_t m = n;", *(f"  {x}" for x in lines), "}"]
    head = ["for (int64_t n = 0; n < N; ++n) {", f"  for (int64_t t = 0; t < {taps}; ++t) {{"]
    return [*head, f"    const int64_t m = n * {taps} + t;", *(f"    {x}" for x in lines), "  }", "}"]


def _start(k: ContractionKernel, first: str, count: str) -> str:
    """Rows [first, first + count) of plane b's output set to zero or to init's."""
    if len(k.operands) == 3:
        return f"std::memcpy(o + ({first}) * W, in + b * R * W + ({first}) * W, ({count}) * W * sizeof(T));"
    return f"std::memset((void*)(o + ({first}) * W), 0, ({count}) * W * sizeof(T));"


def _body(k: ContractionKernel, w: object) -> list[str]:
    at = "0" if _shared(k) else f"b * N * {int(k.attrs['taps'])}"
    plane = ["T* o = out + b * R * W;", f"const I* ix = idx + {at};", "const T* vv = v + b * N * W;"]
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


def _shared(k: ContractionKernel) -> bool:
    """One index row serves every plane (index (1, N * taps), values (B, N, W))."""
    rows, planes = k.shapes[1][0], k.shapes[0][0]
    return isinstance(rows, int) and rows == 1 and not (isinstance(planes, int) and planes == 1)


def _first_bad(k: ContractionKernel) -> str:
    """After the loops, when some index was bad: record the first in row-major order (skipped
    values are not bad), as the reference raises it."""
    lo, skip = "-R" if k.attrs["wrap"] else "0", k.attrs["skip"]
    count = f"{'' if _shared(k) else 'B * '}N * {int(k.attrs['taps'])}"
    test = f"(int64_t)idx[i] < {lo} || (int64_t)idx[i] >= R"
    if skip is not None:
        test = f"(int64_t)idx[i] != {int(skip)} && ({test})"
    found = f"{{ vf_raise({FAULT_VAR}, VF_INDEX, {c_string(k.node)}, (int64_t)idx[i], R); break; }}"
    return f"if (bad) for (int64_t i = 0; i < {count}; ++i) if ({test}) {found}"


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
    check = _first_bad(k)
    source = "\n".join([sig, *(f"  {line}" for line in (*consts, *_body(k, w), check)), "}"])
    init = pointer(k.operands[2]) if len(k.operands) == 3 else "nullptr"
    fault = f"(vf_fault*)(arena + {fault_offset(program)})"
    # Sizes are arguments: a symbolic one (`vf_s0`, ir/sym.py) reads the wrapper's seeds array.
    sizes = ", ".join(f"(int64_t)({d})" for d in (b, n, rows, w))
    ptrs = f"{pointer(k.operands[0])}, {pointer(k.operands[1])}, {init}, {pointer(k.out)}"
    call = f"{name}({ptrs}, {fault}, {sizes}, nt);"
    return source, call
