"""Registers every op definition; importing this package fills `vfuse.ir.ops`' registry."""

from vfuse.ir.defs import contraction, layout, pointwise, random, reduce, source

__all__ = ["contraction", "layout", "pointwise", "random", "reduce", "source"]
