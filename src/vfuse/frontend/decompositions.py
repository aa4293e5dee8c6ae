"""Which aten ops torch decomposes before vfuse sees the graph.

The table is handed to aot_autograd(decompositions=...) and to torch.export's
run_decompositions. It decomposes composite ops whose pieces vfuse lowers well (elu, hardswish,
lerp, group_norm, losses, the backward ops of activations and norms, ...) and leaves whole what
vfuse lowers itself: either because the IR keeps it as one op (GELU, SILU, SDPA, CONV2D,
MATMUL, EMBEDDING) or because vfuse's own decomposition is better for fusion or exactness
(layer_norm, batch_norm, softmax, var, mean, logsumexp, addmm, triu/tril, where/clamp/masked_fill).
See README.md in this folder.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch._decomp import get_decompositions

aten = torch.ops.aten

# Composite ops torch should break up: each becomes pointwise/reduction/layout ops vfuse lowers.
DECOMPOSE: tuple[Any, ...] = (
    # activations and pointwise composites
    aten.elu, aten.celu, aten.selu, aten.softplus, aten.mish, aten.hardsigmoid, aten.hardswish,
    aten.hardshrink, aten.softshrink, aten.logit, aten.xlogy, aten.logaddexp, aten.logaddexp2, aten.frac,
    aten.deg2rad, aten.rad2deg, aten.nan_to_num, aten.glu, aten.log_sigmoid_forward, aten.isneginf,
    aten.isposinf, aten.addcmul, aten.addcdiv, aten.round.decimals, aten.sinc,
    aten.prelu, aten._prelu_kernel,
    # norms and losses built from reductions
    aten.native_group_norm, aten.linalg_vector_norm, aten.norm, aten.mse_loss, aten.smooth_l1_loss,
    aten.huber_loss, aten.binary_cross_entropy,
    # layout and factory composites
    aten.stack, aten.repeat, aten.new_zeros, aten.new_ones, aten.new_full, aten.new_empty, aten.linspace,
    aten.logspace,
    # backward ops of what vfuse lowers (training graphs), all pointwise or row reductions
    aten.gelu_backward, aten.silu_backward, aten.sigmoid_backward, aten.tanh_backward, aten.threshold_backward,
    aten.hardtanh_backward, aten.leaky_relu_backward, aten.elu_backward, aten.softplus_backward,
    aten.hardswish_backward, aten.hardsigmoid_backward, aten.mish_backward, aten._softmax_backward_data,
    aten._log_softmax_backward_data, aten.native_layer_norm_backward, aten.native_batch_norm_backward,
    aten.native_dropout_backward, aten.binary_cross_entropy_backward, aten.mse_loss_backward,
    aten.smooth_l1_loss_backward, aten.huber_loss_backward, aten.logit_backward, aten.log_sigmoid_backward,
    aten.glu_backward, aten._prelu_kernel_backward, aten.native_group_norm_backward,
)  # fmt: skip


def decomposition_table(include_cia: bool = True) -> dict[Any, Any]:
    """{OpOverload: decomposition} for every op in DECOMPOSE that torch can decompose, plus
    (include_cia) every CompositeImplicitAutograd op (see `_composite_implicit`).

    Only torch.export needs the CIA part: under aot_autograd and make_fx those ops decompose
    in the dispatcher before tracing sees them, and collecting them costs 40-90 ms on a
    process's first compile (464 op lookups), most of a warm compile's budget.
    """
    table = dict(_listed())
    if include_cia:
        table.update(_composite_implicit())
        table.update(_listed())  # the listed decompositions win over the CIA ones, as before
    return table


@functools.cache
def _listed() -> dict[Any, Any]:
    # Cached: a pure function of torch's registry, asked for on every compile.
    return get_decompositions(list(DECOMPOSE))


@functools.cache
def _composite_implicit() -> dict[Any, Any]:
    """Decompositions of aten's CompositeImplicitAutograd ops (linear, layer_norm, conv2d, ...).

    aot_autograd always decomposes these, but torch.export's run_decompositions keeps every
    such op its table does not name; listing them makes both paths give vfuse the same ops.
    torch's helpers for this are private, so without them export may leave some to OPAQUE.
    """
    try:
        from torch._export.utils import _collect_all_valid_cia_ops_for_aten_namespace, _get_decomp_for_cia
        from torch.export.decomp_utils import PRESERVED_ATEN_CIA_OPS
    except ImportError:
        return {}
    ops = _collect_all_valid_cia_ops_for_aten_namespace()
    return {op: _get_decomp_for_cia(op) for op in ops if op not in PRESERVED_ATEN_CIA_OPS}
