"""Dynamo's restart for specialized floats, asked for before AOTAutograd traces rather than after.

With symbolic sizes Dynamo passes a module's Python floats (a LayerNorm's eps, a dropout's p) as
0-dim tensor inputs read with `.item()` (SymFloats). AOTAutograd's `tensorify_python_scalars`
pass, run on the ATen graph it has just traced, turns those feeding arithmetic into tensors; the
other backed float symbols it marks to be specialized (`TensorifyState`) and raises
`TensorifyScalarRestartAnalysis`, and Dynamo traces the frame again, the floats now constants.
hf_bert and hf_gpt2 under dynamic=True pay that on every cold compile: AOTAutograd's whole first
trace (~1 s of CPU) is thrown away.

The pass can only turn into tensors the float symbols that reach an arithmetic ATen op of its
graph, and which ones do is mostly readable from Dynamo's graph already: a float read from a
module (`.item()` of its 0-dim placeholder) whose every use is an argument that ends as a
`double` of an ATen op vfuse keeps whole (a LayerNorm's eps, an inference dropout's p, an
embedding's norm_type without max_norm, SDPA's scale: `_OPAQUE`) is specialized by the pass,
as is a float symbol no node of the graph holds any more (specialized while Dynamo traced).
`specialize_now` marks those symbols and restarts Dynamo's analysis before AOTAutograd traces
(the restart AOTAutograd would have asked for after its trace); symbols used otherwise (GPT-2's
`sqrt(2 / math.pi)`, which the pass does make a tensor) are left to the pass. Specializing a
float is always correct (Dynamo guards on its value), so a wrong guess could cost a retrace (a
symbol marked here that the pass would have made a tensor is a constant instead; one missed is
found by the pass, which restarts once more), never a wrong output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch
import torch.nn.functional as F
from torch._dynamo.exc import TensorifyScalarRestartAnalysis
from torch._dynamo.symbolic_convert import TensorifyState
from torch._dynamo.utils import _is_tensorify_enabled
from torch.utils._sympy.symbol import SymT, symbol_is_type


def certain(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> list[str]:
    """The float symbols AOTAutograd's tensorify pass will specialize (restarting Dynamo's
    analysis) as far as Dynamo's graph tells; [] where none or the pass is off."""
    if not _is_tensorify_enabled() or any(isinstance(x, torch.SymFloat) for x in example_inputs):
        return []
    shape_env = getattr(torch._guards.detect_fake_mode(example_inputs), "shape_env", None)
    if shape_env is None:
        return []
    pending = {
        str(k)
        for k, v in shape_env.backed_var_to_val.items()
        if symbol_is_type(k, SymT.FLOAT)
        and isinstance(v, sympy.core.numbers.Float)
        and not TensorifyState.should_specialize(str(k))
    }
    undecided: set[str] = set()  # symbols the pass may turn into tensors
    for node in gm.graph.nodes:
        value = node.meta.get("example_value")
        if _floating(value) and not _specialized_by_pass(node):
            undecided |= _float_symbols(value)
    return sorted(pending - undecided)


def _floating(value: Any) -> bool:
    if isinstance(value, torch.SymFloat):
        return True
    return isinstance(value, list | tuple) and any(_floating(v) for v in value)


def _float_symbols(value: Any) -> set[str]:
    if isinstance(value, list | tuple):
        return {s for v in value for s in _float_symbols(v)}
    if isinstance(value, torch.SymFloat):
        return {str(s) for s in value.node.expr.free_symbols if symbol_is_type(s, SymT.FLOAT)}
    return set()


# Functions whose float argument at (position, keyword) reaches a `double` argument of an ATen op
# the pass cannot make a tensor, or no op at all, when the call's other arguments are as given.
_OPAQUE: dict[Any, tuple[int, str, dict[tuple[int, str], Any]]] = {
    F.layer_norm: (4, "eps", {}),
    F.dropout: (1, "p", {(2, "training"): False}),  # training: the mask's scale is arithmetic
    F.embedding: (4, "norm_type", {(3, "max_norm"): None}),  # read only with max_norm
    torch._C._nn.scaled_dot_product_attention: (6, "scale", {}),
}


def _specialized_by_pass(node: torch.fx.Node) -> bool:
    """`node` is `.item()` of a 0-dim float placeholder, used only where the pass cannot make it a tensor."""
    if node.op != "call_method" or node.target != "item" or not node.users:
        return False
    if not (len(node.args) == 1 and isinstance(node.args[0], torch.fx.Node) and node.args[0].op == "placeholder"):
        return False
    return all(_opaque_use(user, node) for user in node.users)


def _opaque_use(user: torch.fx.Node, node: torch.fx.Node) -> bool:
    rule = _OPAQUE.get(user.target) if user.op == "call_function" else None
    if rule is None:
        return False
    index, name, required = rule
    uses = [a for a in (*user.args, *user.kwargs.values()) if a is node]
    if len(uses) != 1 or _argument(user, index, name, node) is not node:
        return False  # also passed elsewhere (another argument)
    return all(_argument(user, i, n, _MISSING) == v for (i, n), v in required.items())


_MISSING = object()


def _argument(call: torch.fx.Node, index: int, name: str, default: Any) -> Any:
    if index < len(call.args):
        return call.args[index]
    return call.kwargs.get(name, default)


def specialize_now(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> None:
    """Mark the floats and restart Dynamo's analysis as the tensorify pass would after
    AOTAutograd's trace (`certain`); nothing where no float would be specialized."""
    floats = certain(gm, example_inputs)
    if not floats:
        return
    for name in floats:
        TensorifyState.specialize(name)
    raise TensorifyScalarRestartAnalysis
