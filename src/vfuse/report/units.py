"""Human-readable quantities for the report: bytes, seconds, ratios, op labels and shortened name lists."""

from __future__ import annotations

from collections.abc import Sequence

from vfuse.ir import Node, Op


def fmt_bytes(n: int | float) -> str:
    """Binary units, three significant figures: 1536 -> '1.5 KiB'."""
    if abs(n) < 1024:
        return f"{int(n)} B"
    value = n / 1024
    for unit in ("KiB", "MiB"):
        if abs(value) < 1024:
            return f"{value:.3g} {unit}"
        value /= 1024
    return f"{value:.3g} GiB"


def fmt_time(seconds: float | None) -> str:
    """Seconds in the unit that keeps the number readable; None (unknown) as 'n/a'."""
    if seconds is None:
        return "n/a"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def fmt_ratio(before: float | None, after: float | None) -> str:
    """How many times smaller `after` is than `before` ('3.2x'); '' when it cannot be said."""
    if before is None or after is None or after <= 0:
        return ""
    return f"{before / after:.2f}x"


def fmt_names(names: Sequence[str], limit: int = 4) -> str:
    """'%a, %b, %c +2 more': long value lists stay one readable line."""
    shown = ", ".join(f"%{n}" for n in names[:limit])
    rest = len(names) - limit
    return f"{shown} +{rest} more" if rest > 0 else shown


def op_label(node: Node) -> str:
    """The op's name; for a torch fallback also the torch op it calls ("opaque:aten.flip")."""
    call = node.attrs.get("call") if node.op is Op.OPAQUE else None
    return f"{node.op.value}:{call}" if call is not None else node.op.value
