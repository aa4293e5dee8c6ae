"""Ops that aot_autograd decomposes before vfuse sees them but other producers (torch.export
with another table, hand-written graphs) may pass whole: lowered from one-op FX graphs."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.fx
import torch.nn.functional as F
import torch.utils._pytree as pytree
from tests.frontend.lowering_helpers import assert_matches, fallbacks
from torch._subclasses.fake_tensor import FakeTensorMode

from vfuse.context import Context
from vfuse.frontend.lower import lower
from vfuse.interp import run
from vfuse.ir import verify

aten = torch.ops.aten


def one_op_graph(target: Any, args: tuple, kwargs: dict | None = None) -> tuple[torch.fx.GraphModule, list]:
    """FX graph calling target once (tensor args as placeholders), meta['val'] from FakeTensorMode."""
    g, inputs = torch.fx.Graph(), []

    def placeholder(t: torch.Tensor) -> torch.fx.Node:
        p = g.placeholder(f"in{len(inputs)}")
        p.meta["val"] = t
        inputs.append(t)
        return p

    fx_args, fx_kwargs = pytree.tree_map_only(torch.Tensor, placeholder, (args, kwargs or {}))
    node = g.call_function(target, fx_args, fx_kwargs)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = pytree.tree_map_only(torch.Tensor, mode.from_tensor, (args, kwargs or {}))
        node.meta["val"] = target(*fake[0], **fake[1])
    if isinstance(node.meta["val"], torch.Tensor):
        g.output((node,))
    else:  # only the first result is read, the way models read attention's output
        first = g.call_function(operator.getitem, (node, 0))
        first.meta["val"] = node.meta["val"][0]
        g.output((first,))
    return torch.fx.GraphModule(torch.nn.Module(), g), inputs


def _t(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


Q, K, V = _t(2, 4, 6, 8, seed=1), _t(2, 4, 6, 8, seed=2), _t(2, 4, 6, 8, seed=3)
MASK = _t(6, 6, seed=4)
DIRECT: list[tuple[str, Any, tuple, dict, Callable]] = [
    ("sdpa", aten.scaled_dot_product_attention.default, (Q, K, V), {"is_causal": True},
     lambda: F.scaled_dot_product_attention(Q, K, V, is_causal=True)),
    ("sdpa_gqa", aten.scaled_dot_product_attention.default, (Q, K[:, :2], V[:, :2]), {"enable_gqa": True},
     lambda: F.scaled_dot_product_attention(Q, K[:, :2], V[:, :2], enable_gqa=True)),
    ("efficient", aten._scaled_dot_product_efficient_attention.default, (Q, K, V, MASK, False), {"scale": 0.5},
     lambda: F.scaled_dot_product_attention(Q, K, V, attn_mask=MASK, scale=0.5)),
    ("linear", aten.linear.default, (_t(2, 3, 4), _t(5, 4), _t(5)), {}, None),
    ("matmul", aten.matmul.default, (_t(3, 4), _t(2, 4, 5)), {}, None),
    ("softmax_int", aten.softmax.int, (_t(3, 4), 1), {}, None),
    ("log_softmax_int", aten.log_softmax.int, (_t(3, 4), 0, torch.float64), {}, None),
    ("rms_norm", aten.rms_norm.default, (_t(3, 4), [4], _t(4), 1e-6), {}, None),
    ("flatten", aten.flatten.using_ints, (_t(2, 3, 4), 1), {}, None),
    ("reshape", aten.reshape.default, (_t(2, 3, 4), [4, -1]), {}, None),
    ("clip", aten.clip.default, (_t(3, 4), -0.5, 0.5), {}, None),
    ("true_divide", aten.true_divide.Tensor, (_t(3, 4), _t(4) + 3), {}, None),
    ("addbmm", aten.addbmm.default, (_t(3, 5), _t(2, 3, 4), _t(2, 4, 5)), {"beta": 0.5}, None),
    ("batch_norm_eval", aten.native_batch_norm.default,
     (_t(4, 3, 2), _t(3), _t(3), _t(3), _t(3).abs() + 1, False, 0.1, 1e-5), {}, None),
    ("batch_norm_train_no_stats", aten.native_batch_norm.default,
     (_t(4, 3, 2), _t(3), _t(3), None, None, True, 0.1, 1e-5), {}, None),
    ("select_copy", aten.select_copy.int, (_t(3, 4), 1, -1), {}, None),
    ("slice_backward", aten.slice_backward.default, (_t(2, 3, 4), [2, 7, 4], 1, 2, 5, 1), {}, None),
    ("slice_backward_clamped", aten.slice_backward.default, (_t(2, 3), [2, 5], -1, -3, 2**62, 1), {}, None),
    ("select_backward", aten.select_backward.default, (_t(2, 4), [2, 3, 4], 1, -2), {}, None),
    ("unsqueeze_copy", aten.unsqueeze_copy.default, (_t(3, 4), 0), {}, None),
]  # fmt: skip


@pytest.mark.parametrize(("name", "target", "args", "kwargs", "reference"), DIRECT, ids=[d[0] for d in DIRECT])
def test_direct_lowering(name: str, target: Any, args: tuple, kwargs: dict, reference: Callable | None) -> None:
    gm, inputs = one_op_graph(target, args, kwargs)
    graph = verify(lower(gm, Context()))
    assert not fallbacks(graph), fallbacks(graph)
    want = reference() if reference is not None else target(*args, **kwargs)
    want = want[0] if isinstance(want, tuple) and name.startswith("batch_norm") else want
    assert_matches(run(graph, inputs), want, rtol=1e-5, atol=1e-5)


def test_native_batch_norm_training_with_running_stats_runs_through_torch() -> None:
    """It updates the running stats in place, which only torch running the op can do."""
    x, rm, rv = _t(4, 3), torch.zeros(3), torch.ones(3)
    gm, inputs = one_op_graph(aten.native_batch_norm.default, (x, None, None, rm, rv, True, 0.1, 1e-5))
    graph = verify(lower(gm, Context()))
    assert fallbacks(graph)["aten.native_batch_norm.default"] == 1
    run(graph, inputs)
    assert not torch.equal(inputs[1], torch.zeros(3))  # the running mean was updated
