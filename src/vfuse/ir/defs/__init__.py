"""Registers every op definition; importing this package fills `vfuse.ir.ops`' registry."""

from vfuse.ir.defs import attention_grad, contraction, layout, pointwise, random, reduce, scatter, source

__all__ = ["attention_grad", "contraction", "layout", "pointwise", "random", "reduce", "scatter", "source"]
