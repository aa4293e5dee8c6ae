"""Split one rendered translation unit into several that g++ compiles in parallel.

g++ compiles one file on one core; a model's program (a few hundred KB of C++, 2-8 s of -O3)
then keeps the other cores idle while the user waits. `render` marks where each kernel's text
starts (`PART` + the kernel's name: its template instance and its function, in source order)
and where the segment entries start (`PART` + `ENTRIES`); everything before the first mark
(prelude, size defines) goes into every unit. Kernels are dealt to units by size, counting
what a unit already has (`_deal`); a kernel
function becomes hidden-visibility instead of static (the entries, in one unit, call it from
another) and the entries' unit declares every kernel. Static helpers that kernels share are
include-guarded in each part that needs them, so each unit defines its own copies: a GEMM
instance that several kernels call (named by its text's hash) is compiled once per unit that
holds one of them, so kernels are dealt to where their guarded blocks are already while that
unit stays near an even share (BERT's 333 KB as two units: 2.5-3.4 -> 1.8-2.2 s of g++ CPU in
all, one unit's 1.8-2.4).

`split` returns None when the text is not marked as expected (an older renderer, a part
without its kernel function); the toolchain then compiles the whole text as one unit, and also
does so when a split build fails, so a split can cost time but never a wrong library.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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
    parts = {k: _blocks("".join(t or "" for n, t in zip(names, texts, strict=False) if n == k)) for k in kernels}
    unit_of, load = _deal(parts, min(units, len(kernels)))
    declarations = "\n".join(f"{HIDDEN}{k}{SIGNATURE};" for k in kernels)
    used = sorted(set(unit_of.values()))
    last = min(used, key=load.__getitem__)
    out = []
    for u in used:
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


# A unit may hold this much over an even share of the bytes (guarded blocks counted once) when
# that saves compiling a block again; past it, a byte compiled twice weighs SHARED_WEIGHT of a
# byte on the longest unit (the wall time on idle cores).
SLACK, SHARED_WEIGHT = 1.15, 0.5
_GUARD = re.compile(r"^#ifndef (\w+)\n#define \1\n", re.M)
_DIRECTIVE = re.compile(r"^#\s*(if|ifdef|ifndef|endif)\b", re.M)


@dataclass(frozen=True)
class Part:
    """A kernel's text as the bytes only it has (`own`) and its include-guarded blocks (name -> bytes)."""

    own: int
    blocks: dict[str, int]

    def cost(self, present: set[str]) -> int:
        """Bytes a unit that already has the blocks `present` compiles for this kernel."""
        return self.own + sum(n for b, n in self.blocks.items() if b not in present)


def _blocks(text: str) -> Part:
    """`text` with its outermost `#ifndef X / #define X ... #endif` blocks found."""
    blocks: dict[str, int] = {}
    at = 0
    while (m := _GUARD.search(text, at)) is not None:
        depth, end = 0, len(text)
        for d in _DIRECTIVE.finditer(text, m.start()):
            depth += -1 if d.group(1) == "endif" else 1
            if depth == 0:  # the block ends with its #endif's line
                end = text.find("\n", d.end()) + 1 or len(text)
                break
        blocks[m.group(1)] = blocks.get(m.group(1), 0) + end - m.start()
        at = end
    return Part(len(text) - sum(blocks.values()), blocks)


def _deal(parts: dict[str, Part], units: int) -> tuple[dict[str, int], list[int]]:
    """(kernel -> unit, each unit's bytes). The largest first, each to the unit where it adds
    least (guarded blocks there already are not compiled again) among those it keeps within
    SLACK of an even share; else where the longest unit's bytes plus SHARED_WEIGHT x the bytes
    it adds grow least. Ties to the least loaded."""
    blocks: dict[str, int] = {}
    for p in parts.values():
        blocks.update(p.blocks)
    cap = SLACK * (sum(p.own for p in parts.values()) + sum(blocks.values())) / units
    load, present = [0] * units, [set[str]() for _ in range(units)]
    unit_of = {}
    for k in sorted(parts, key=lambda k: -parts[k].cost(set())):
        cost = [parts[k].cost(present[u]) for u in range(units)]
        longest = max(load)
        fits = [u for u in range(units) if load[u] + cost[u] <= cap]
        u = min(
            fits or range(units),
            key=lambda u: (cost[u] if fits else max(longest, load[u] + cost[u]) + SHARED_WEIGHT * cost[u], load[u]),
        )
        unit_of[k] = u
        load[u] += cost[u]
        present[u] |= parts[k].blocks.keys()
    return unit_of, load
