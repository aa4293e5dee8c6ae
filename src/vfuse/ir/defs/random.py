"""Random ops. Randomness is counter-based (see `rng.py`): RNG_SEED draws one seed per call
from torch's generator (so `torch.manual_seed` governs vfuse too), and each RAND node maps
(seed, stream, element index) to a uniform float, so fused kernels can draw numbers in any
order on any number of threads and still produce the same tensor. Dropout lowers to
RAND -> GE -> WHERE/MUL and fuses like any other pointwise chain.
"""

from __future__ import annotations

import torch

from vfuse.ir.defs import rules
from vfuse.ir.defs.rng import uniform
from vfuse.ir.ops import Attrs, Kind, Op, OpDef, register
from vfuse.ir.types import DType, TensorType, Type

SEED_HIGH = 2**62


def _draw_seed(attrs: Attrs) -> torch.Tensor:
    return torch.randint(0, SEED_HIGH, (), dtype=torch.int64)


register(
    OpDef(
        Op.RNG_SEED,
        Kind.SOURCE,
        0,
        lambda ins, attrs: TensorType((), DType.I64),
        _draw_seed,
        rules.no_flops,
        bytes=rules.no_bytes,
        doc="a fresh i64 seed per call, drawn from torch's default generator",
        pure=False,
    )
)


def _rand_infer(ins: tuple[TensorType, ...], attrs: Attrs) -> Type:
    (seed,) = ins
    if seed.shape != () or seed.dtype is not DType.I64:
        raise rules.TypeRuleError(f"rand seed must be an i64 scalar, got {seed}")
    return TensorType(attrs["shape"], DType.F32)


register(
    OpDef(
        Op.RAND,
        Kind.ELEMENTWISE,
        1,
        _rand_infer,
        lambda seed, attrs: uniform(seed, attrs["stream"], TensorType(attrs["shape"], DType.F32).numel).reshape(
            attrs["shape"]
        ),
        rules.per_element(12),
        attrs=("shape", "stream"),
        bytes=rules.output_bytes,
        doc="uniform f32 in [0, 1) of `shape`; `stream` tells apart several RAND nodes of one graph",
        pure=False,
    )
)
