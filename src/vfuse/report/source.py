"""A kernel's generated C++ out of the whole translation unit (06_kernels.cpp).

The renderer writes every function at the top level, opened by a line starting with `static`
or `extern "C"` and closed by a `}` alone on a line. A kernel `k2_c` owns its function and the
template functions named after it (`k2_c_mm`, `k2_c_mm_one`), but not another kernel's
(`k2_c` is not part of `k2`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_START = re.compile(r'^(?:static|extern "C")\s[^\n;]*?\b(\w+)\s*\(', re.M)


def functions(source: str) -> list[tuple[str, str]]:
    """(name, text) of every top-level function, in source order."""
    out = []
    for m in _START.finditer(source):
        end = source.find("\n}\n", m.end())
        if end < 0:
            continue
        text = source[m.start() : end + 2]
        if "{" in text and ";" not in text.split("{", 1)[0]:  # a definition, not a declaration
            out.append((m.group(1), text))
    return out


def owner(function: str, kernels: Sequence[str]) -> str | None:
    """The kernel a function belongs to: the longest kernel name it is, or starts with + "_"."""
    mine = [k for k in kernels if function == k or function.startswith(k + "_")]
    return max(mine, key=len) if mine else None


# A GEMM instance several kernels share (codegen/cpp/gemm/gemm.py): its functions are named after it;
# a body kernels alike but for their buffers call (codegen/cpp/shared.py).
_SHARED = re.compile(r"\b(?:vg_gemm|vf_shared)_[0-9a-f]{20}\b")


def kernel_sources(source: str, kernels: Sequence[str]) -> dict[str, str]:
    """Each kernel's functions, helpers first (as in the source), with the shared GEMM instance
    its functions call; kernels without any are left out."""
    parts: dict[str, list[str]] = {}
    shared: dict[str, list[str]] = {}
    for name, text in functions(source):
        k = owner(name, kernels)
        if k is not None:
            parts.setdefault(k, []).append(text)
        elif (m := _SHARED.match(name)) is not None and text not in shared.get(m.group(), []):
            shared.setdefault(m.group(), []).append(text)
    for texts in parts.values():
        used = dict.fromkeys(u for t in texts for u in _SHARED.findall(t))
        texts[:0] = [t for u in used for t in shared.get(u, [])]
    return {k: "\n".join(texts) for k, texts in parts.items()}


def kernel_source(source: str, kernel: str, kernels: Sequence[str]) -> str:
    """`kernel`'s functions; "" when it has none."""
    return kernel_sources(source, kernels).get(kernel, "")
