"""Inference graphs handed to Dynamo without AOTAutograd's runtime wrappers.

AOTAutograd wraps every compiled forward in runtime code that replays input mutations,
regenerates outputs that alias inputs, deduplicates inputs and toggles grad mode. For an
inference graph that mutates nothing, returns no alias and takes exactly Dynamo's inputs,
all of that does nothing but costs about a microsecond a call, which is measurable on small
graphs. `VfuseBackend` then returns the compiled forward to Dynamo directly.

Only for graphs AOTAutograd compiles for inference: grad mode off, or on with no input that
requires grad. Dynamo guards on grad mode and on each input's requires_grad, so the graph is
only ever called that way; AOTAutograd's inference wrapper would merely have turned grad mode
off around it, and with no input requiring grad nothing the graph computes (kernels, torch
steps) records autograd history either way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._functorch._aot_autograd.schemas import OutputType, SubclassCreationMeta

_PLAIN = (torch.Tensor, torch.nn.Parameter)  # tensor subclasses need AOTAutograd's wrappers
_SIZES = (torch.SymInt, int)  # size arguments of a graph with symbolic sizes (ints when called)


def may_skip_wrappers(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    """What can be told before AOTAutograd runs: inference, plain tensor inputs, no
    parameters AOTAutograd would prepend, no autocast for it to turn off."""
    inference = not torch.is_grad_enabled() or not any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs
    )
    return (
        inference
        and not torch._C._is_any_autocast_enabled()
        and all(type(x) in _PLAIN or type(x) in _SIZES for x in example_inputs)
        and next(iter(gm.parameters()), None) is None
        and next(iter(gm.buffers()), None) is None
    )


def wrappers_are_identity(fw_inputs: int, dynamo_inputs: int) -> bool:
    """Called from the inference compiler: whether AOTAutograd's metadata for this forward
    says its runtime wrappers would pass inputs and outputs through unchanged."""
    ctx = torch._guards.TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None)
    if meta is None or fw_inputs != dynamo_inputs:  # deduplicated or extra (token, RNG) inputs
        return False
    subclass = [*meta.subclass_inp_meta, *meta.subclass_fw_graph_out_meta]
    return (
        not any(i.mutates_data or i.mutates_metadata or i.mutates_storage_metadata for i in meta.input_info)
        and all(o.output_type is OutputType.non_alias for o in meta.output_info)
        and meta.num_intermediate_bases == 0
        and not meta.tokens
        and not any(isinstance(m, SubclassCreationMeta) for m in subclass)
    )


def unboxed(boxed: Callable[[list], Any]) -> Callable[..., Any]:
    """Dynamo calls a compiled graph with positional arguments; ours take one list. Where the
    boxed callable says what it calls (`run_list`: capture._calling_convention's), that is
    called directly: one frame less per call."""
    run = getattr(boxed, "run_list", boxed)

    def call(*args: Any) -> Any:
        return run(args)

    call.boxed = boxed  # type: ignore[attr-defined]  # what it holds (the compiled graph) lives as long as Dynamo holds this
    return call
