"""Kernels that differ only in their buffers' addresses compiled once.

A model's layers repeat: GPT-2's LayerNorms are five kernels whose text differs only in the
pointers they declare first (which arena offset, which input), and each cost g++ ~0.35 s of -O3
(11 KB each over symbolic sizes). `share_bodies` finds the plain kernel functions whose text is
the same once those pointers are renamed by position, and gives each such group one body,
`vf_shared_<hash>(bufs, arena, seeds, nt, pointers...)`, include-guarded (the units of
`units.py` deal its kernels to where it is already, as a shared GEMM instance); each kernel keeps
its name and signature and calls it with its own pointers, computed as it computed them. The
body is `noinline`, or g++ would compile it again inside every caller.

Only text in exactly the form `function.kernel_function` writes is touched: one `static void kN`
head, comments and attribute lines before it, the pointers' lines (`writer.pointer_line`) first
in it, no preprocessor lines but `#pragma` and tests of the compiler's own macros (`#if
defined(__AVX__)`), no pointer named inside a string literal; anything else, and any kernel
whose body is its own, is left exactly as it was. Renaming a local pointer to a parameter of the
same type and `__restrict` changes nothing the body computes.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from vfuse.codegen.cpp.function import SIGNATURE

PREFIX = "vf_shared_"
PARAM = "vf_q"  # the pointers' names in a shared body: vf_q0, vf_q1, ...
_POINTER = re.compile(r"^  ((?:const )?[\w:]+\* __restrict )(p_\w+) = (\((?:const )?[\w:]+\*\).+);$")
_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')
_ARGS = SIGNATURE[1:-1]  # "void* const* bufs, char* arena, const int64_t* seeds, int nt"


@dataclass(frozen=True)
class _Kernel:
    """A kernel function taken apart: what precedes its head (`doc`: comments, `attrs`:
    attribute lines), its pointers (declared type, name, initializer) in the order the rest
    first names them, and the rest (`body`, the closing brace included) with the pointers
    renamed `vf_q<i>` in that order."""

    name: str
    doc: tuple[str, ...]
    attrs: tuple[str, ...]
    pointers: tuple[tuple[str, str, str], ...]
    body: str

    def key(self) -> str:
        types = "\n".join(t for t, _, _ in self.pointers)
        return hashlib.sha256("\0".join(("\n".join(self.attrs), types, self.body)).encode()).hexdigest()[:20]


def share_bodies(kernels: list[tuple[str, str]]) -> list[str]:
    """The texts of `kernels` ((name, function text), in order), those of every group of two or
    more with the same body calling one shared body instead."""
    parsed = [_parse(name, text) for name, text in kernels]
    count: dict[str, int] = {}
    for p in parsed:
        if p is not None:
            count[p.key()] = count.get(p.key(), 0) + 1
    return [
        _calling(p) if p is not None and count[p.key()] > 1 else text
        for p, (_, text) in zip(parsed, kernels, strict=True)
    ]


def _parse(name: str, text: str) -> _Kernel | None:
    lines = text.split("\n")
    head = f"static void {name}{SIGNATURE} {{"
    if lines.count(head) != 1 or lines[-1] != "}" or PARAM in text or PREFIX in text:
        return None
    at = lines.index(head)
    before = lines[:at]
    if not all(line.startswith(("//", "__attribute__")) for line in before):
        return None
    pointers = []
    i = at + 1
    while i < len(lines) and (m := _POINTER.match(lines[i])) is not None:
        pointers.append((m.group(1), m.group(2), m.group(3)))
        i += 1
    rest = lines[i:]
    if not pointers or not all(_context_free(line) for line in rest if line.lstrip().startswith("#")):
        return None
    body = "\n".join(rest)
    names = [n for _, n, _ in pointers]
    if len(set(names)) != len(names) or any(n in s for s in _STRING.findall(body) for n in names):
        return None
    # Numbered in the order the body first names them: the declarations follow the values'
    # names, which differ from layer to layer (`p_mul` before `p_x0`, `p_matmul` before `p_mul_1`).
    word = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
    order = list(dict.fromkeys([m.group(1) for m in word.finditer(body)] + names))
    pointers = sorted(pointers, key=lambda p: order.index(p[1]))
    renamed = word.sub(lambda m: f"{PARAM}{order.index(m.group(1))}", body)
    doc = tuple(line for line in before if line.startswith("//"))
    attrs = tuple(line for line in before if not line.startswith("//"))
    return _Kernel(name, doc, attrs, tuple(pointers), renamed)


def _context_free(directive: str) -> bool:
    """Whether a preprocessor line means the same wherever in the unit it stands: a pragma, or a
    conditional on the compiler's own macros (`#if defined(__AVX__)`); never #define or #include."""
    words = directive.strip().lstrip("#").split(None, 1)
    if not words or words[0] in ("pragma", "else", "endif"):
        return bool(words)
    names = re.findall(r"[A-Za-z_]\w*", words[1] if len(words) > 1 else "")
    return words[0] in ("if", "elif") and bool(names) and all(n == "defined" or n.startswith("__") for n in names)


def _calling(k: _Kernel) -> str:
    """The guarded shared body, then kernel `k` calling it with its own pointers."""
    key = k.key()
    fn = f"{PREFIX}{key}"
    guard = f"VF_SHARED_{key.upper()}"
    params = ", ".join(f"{t}{PARAM}{i}" for i, (t, _, _) in enumerate(k.pointers))
    args = ", ".join(init for _, _, init in k.pointers)
    return "\n".join(
        [
            f"#ifndef {guard}",
            f"#define {guard}",
            *k.attrs,
            "__attribute__((noinline))",  # a line of its own: report/source.py finds `static void` heads
            f"static void {fn}({_ARGS}, {params}) {{",
            k.body,
            f"#endif  // {guard}",
            *k.doc,
            f"static void {k.name}{SIGNATURE} {{",
            f"  {fn}(bufs, arena, seeds, nt, {args});",
            "}",
        ]
    )
