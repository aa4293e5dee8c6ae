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
# a body kernels alike but for their buffers call (codegen/cpp/shared.py); an attention instance
# (codegen/cpp/attention/render.py), shown as its configuration (the algorithm is the fixed template's).
_SHARED = re.compile(r"\b(?:vg_gemm|vf_shared|vf_attn)_[0-9a-f]{20}\b")
_ATTENTION = re.compile(
    r"^#ifndef VF_ATTN_([0-9a-f]{20})\n#define VF_ATTN_\1\n"
    r"(// vfuse flash attention[^\n]*\n(?:#(?:undef|define) [^\n]*\n)*)",
    re.M,
)


def _attention_configs(source: str) -> dict[str, str]:
    """`vf_attn_<hash>` -> the comment and #defines that configure that instance."""
    out = {}
    for m in _ATTENTION.finditer(source):
        lines = [line for line in m.group(2).splitlines() if not line.startswith("#undef")]
        out.setdefault(f"vf_attn_{m.group(1)}", "\n".join(lines))
    return out


def kernel_sources(source: str, kernels: Sequence[str]) -> dict[str, str]:
    """Each kernel's functions, helpers first (as in the source), with the shared instances
    its functions call; kernels without any are left out."""
    parts: dict[str, list[str]] = {}
    shared: dict[str, list[str]] = {name: [text] for name, text in _attention_configs(source).items()}
    for name, text in functions(source):
        k = owner(name, kernels)
        if k is not None:
            parts.setdefault(k, []).append(text)
        elif (m := _SHARED.match(name)) is not None and text not in shared.get(m.group(), []):
            shared.setdefault(m.group(), []).append(text)
    for texts in parts.values():
        used = _called(texts, shared)
        texts[:0] = [t for u in used for t in shared.get(u, [])]
    return {k: "\n".join(texts) for k, texts in parts.items()}


def _called(texts: list[str], shared: dict[str, list[str]]) -> list[str]:
    """The shared instances `texts` call, and those these call (a shared body calling an
    attention instance), callees first."""
    found: dict[str, None] = {}
    todo = [u for t in texts for u in _SHARED.findall(t)]
    while todo:
        u = todo.pop(0)
        if u not in found:
            found[u] = None
            todo += [v for t in shared.get(u, []) for v in _SHARED.findall(t) if v != u]
    return list(found)[::-1]


def kernel_source(source: str, kernel: str, kernels: Sequence[str]) -> str:
    """`kernel`'s functions; "" when it has none."""
    return kernel_sources(source, kernels).get(kernel, "")
