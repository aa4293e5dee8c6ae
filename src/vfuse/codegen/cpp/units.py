"""Split one rendered translation unit into several that g++ compiles in parallel.

g++ compiles one file on one core; a model's program (a few hundred KB of C++, 2-8 s of -O3)
then keeps the other cores idle while the user waits. `render` marks where each kernel's text
starts (`PART` + the kernel's name: its template instance and its function, in source order)
and where the segment entries start (`PART` + `ENTRIES`); everything before the first mark
(prelude, size defines) goes into every unit. Kernels are dealt to units by size; a kernel
function becomes hidden-visibility instead of static (the entries, in one unit, call it from
another) and the entries' unit declares every kernel. Static helpers that kernels share are
include-guarded in each part that needs them, so each unit defines its own copies.

`split` returns None when the text is not marked as expected (an older renderer, a part
without its kernel function); the toolchain then compiles the whole text as one unit, and also
does so when a split build fails, so a split can cost time but never a wrong library.
"""

from __future__ import annotations

import re

from vfuse.codegen.cpp.function import SIGNATURE

PART = "//@vfuse-part "
ENTRIES = "@entries"
HIDDEN = '__attribute__((visibility("hidden"))) void '
_MARK = re.compile(r"^//@vfuse-part (\S+)\n", re.M)


def split(source: str, units: int) -> list[str] | None:
    """`source` as `units` translation units (fewer when it has fewer kernels), or None."""
    pieces = _MARK.split(source)
    head, names, texts = pieces[0], pieces[1::2], pieces[2::2]
    if units < 2 or names.count(ENTRIES) != 1 or names[-1] != ENTRIES:
        return None
    kernels = list(dict.fromkeys(names[:-1]))
    if len(kernels) < 2:
        return None
    texts = [_exported(name, text) for name, text in zip(names[:-1], texts[:-1], strict=True)]
    if any(t is None for t in texts):
        return None
    if sum(text.count(HIDDEN) for text in texts if text) != len(kernels):
        return None  # a kernel function missing, or defined twice: not ours to guess
    size = {k: sum(len(t or "") for n, t in zip(names, texts, strict=False) if n == k) for k in kernels}
    unit_of = _deal(size, min(units, len(kernels)))
    declarations = "\n".join(f"{HIDDEN}{k}{SIGNATURE};" for k in kernels)
    last = min(range(max(unit_of.values()) + 1), key=lambda u: sum(size[k] for k in kernels if unit_of[k] == u))
    out = []
    for u in range(max(unit_of.values()) + 1):
        body = [t or "" for n, t in zip(names, texts, strict=False) if n in unit_of and unit_of[n] == u]
        if u == last:
            body += [declarations, pieces[-1]]
        out.append(head + "".join(body))
    return out


def _exported(name: str, text: str) -> str | None:
    """The part with kernel `name`'s function hidden instead of static (once at most)."""
    static = f"static void {name}{SIGNATURE}"
    if text.count(static) > 1:
        return None
    return text.replace(static, f"{HIDDEN}{name}{SIGNATURE}")


def _deal(size: dict[str, int], units: int) -> dict[str, int]:
    """Kernel -> unit: the largest first, each to the unit with the least text so far."""
    load = [0] * units
    unit_of = {}
    for k in sorted(size, key=lambda k: -size[k]):
        u = load.index(min(load))
        unit_of[k] = u
        load[u] += size[k]
    return unit_of
