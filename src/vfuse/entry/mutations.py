"""Input mutations kept in the graph (AOTAutograd's `keep_inference_input_mutations`, as Inductor).

An inference graph that updates its inputs (an optimizer step's parameters and state, BatchNorm's
running statistics in train mode under no_grad) then ends in `copy_(input, new value)` instead of
returning the new values for AOTAutograd's epilogue to copy in after the call. vfuse lowers
functional graphs: `lift` turns each such copy_ into one more graph output (the new value as
copy_ writes it, `aten.copy(input, value)`) paired with the input, and the compiler stores what
it safely can straight into the input's memory (`schedule/inplace.py`, `CompiledGraph.in_place`).
`Mutating` runs the compiled graph: an input written in place must be contiguous (kernels index it
row-major: a non-contiguous one is given as a contiguous copy, copied back after), the values not
written in place are copied into their inputs after the call, and the caller gets the graph's
own outputs only.

Like Inductor, this trusts Dynamo's guards that inputs do not overlap in memory unless they did
when compiling; the compile-time inputs are checked (an input overlapping another is not written
in place).
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.multiprocessing.reductions import StorageWeakRef

aten = torch.ops.aten


@dataclass(frozen=True)
class Lifted:
    """What `lift` did: the graph returns its `outputs` own outputs, then one output per mutated
    input, `inputs[j]` the position of the input output `outputs + j` is the new value of.
    `returned`: (position among the graph's original outputs, input position) of each output
    that was a copy_'s result, the updated input itself: not computed, the input is returned."""

    outputs: int
    inputs: tuple[int, ...]
    returned: tuple[tuple[int, int], ...] = ()

    def replaces(self) -> dict[int, int]:
        """Output position -> input position, for every lifted output."""
        return {self.outputs + j: i for j, i in enumerate(self.inputs)}


def lift(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, Lifted | None]:
    """`gm` with each `copy_(placeholder, value)` replaced by an output, or `gm` unchanged (None)
    when it has none or one this cannot express: a copy_ whose result is used but to be returned,
    a placeholder copied into twice or read after its copy_, other outputs than a tuple."""
    nodes = list(gm.graph.nodes)
    copies = [n for n in nodes if n.op == "call_function" and n.target is aten.copy_.default]
    out = nodes[-1]
    if not copies or out.op != "output" or not isinstance(out.args[0], list | tuple):
        return gm, None
    order = {n: i for i, n in enumerate(nodes)}
    placeholders = [n for n in nodes if n.op == "placeholder"]
    targets: list[int] = []
    for c in copies:
        dst = c.args[0]
        if not isinstance(dst, torch.fx.Node) or dst.op != "placeholder" or len(c.args) != 2 or c.kwargs:
            return gm, None
        if any(u is not out for u in c.users):
            return gm, None
        if placeholders.index(dst) in targets or any(order[u] > order[c] for u in dst.users if u is not c):
            return gm, None
        targets.append(placeholders.index(dst))
    target_of = {c.name: t for c, t in zip(copies, targets, strict=True)}
    returned = tuple(
        (k, target_of[v.name])
        for k, v in enumerate(out.args[0])
        if isinstance(v, torch.fx.Node) and v.name in target_of
    )
    graph = copy.deepcopy(gm.graph)
    by_name = {n.name: n for n in graph.nodes}
    new_out = next(n for n in graph.nodes if n.op == "output")
    own = [v for v in new_out.args[0] if not (isinstance(v, torch.fx.Node) and v.name in target_of)]
    new_out.args = (type(out.args[0])(own),)
    values = []
    for c in copies:
        old = by_name[c.name]
        with graph.inserting_before(old):
            new = graph.call_function(aten.copy.default, old.args)
        new.meta = dict(old.meta)  # copy_'s result: the input's shape, dtype and strides
        graph.erase_node(old)
        values.append(new)
    new_out.args = (type(out.args[0])([*own, *values]),)
    return torch.fx.GraphModule(gm, graph), Lifted(len(own), tuple(targets), returned)


def overlapping(example_inputs: Sequence[Any], lifted: Lifted) -> set[int]:
    """Positions of mutated inputs whose elements overlap another input's (fake tensors too:
    they share a storage where the real ones do)."""
    spans = []
    for i, t in enumerate(example_inputs):
        if isinstance(t, torch.Tensor) and t.numel():
            extent = 1 + sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride(), strict=True))
            lo = t.storage_offset() * t.element_size()
            spans.append((i, StorageWeakRef(t.untyped_storage()), lo, lo + extent * t.element_size()))
    return {
        i
        for i, ref, lo, hi in spans
        if i in lifted.inputs and any(j != i and r == ref and lo < e and b < hi for j, r, b, e in spans)
    }


class Mutating:
    """The compiled graph's callable with its input updates (boxed: one list of inputs)."""

    _boxed_call = True

    def __init__(self, run: Callable[[list], list], lifted: Lifted, in_place: Sequence[int]) -> None:
        self.run = run
        self.own = lifted.outputs
        self.returned = lifted.returned
        replaces = lifted.replaces()
        self.written = tuple(replaces[o] for o in in_place)  # input positions written in place
        rest = [o for o in replaces if o not in in_place]  # returned: copied into their inputs
        self.copies = tuple((self.own + k, replaces[o]) for k, o in enumerate(rest))
        self._take = operator.itemgetter(*self.written) if self.written else None

    def __call__(self, args: list) -> list:
        if self._take is not None:
            written = self._take(args)
            if len(self.written) == 1:
                written = (written,)
            if not all(map(torch.Tensor.is_contiguous, written)):
                return self._through_copies(args)
        targets = [args[i] for _, i in self.copies]
        returned = [(k, args[i]) for k, i in self.returned]
        outs = self.run(args)
        for (k, _), t in zip(self.copies, targets, strict=True):
            t.copy_(outs[k])
        if self.copies:
            outs = outs[: self.own]
        for k, t in returned:  # copy_ returns its destination
            outs.insert(k, t)
        return outs

    def _through_copies(self, args: list) -> list:
        """A call with a non-contiguous input to write: it runs on contiguous copies."""
        args = list(args)
        swapped = {i: args[i] for i in self.written if not args[i].is_contiguous()}
        for i, t in swapped.items():
            args[i] = t.contiguous()
        fresh = {i: args[i] for i in swapped}
        outs = self.__class__.__call__(self, args)
        for i, t in swapped.items():
            t.copy_(fresh[i])
        for k, i in self.returned:  # the caller's input, not the copy
            if i in swapped:
                outs[k] = swapped[i]
        return outs
