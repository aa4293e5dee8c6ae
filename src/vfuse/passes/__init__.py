"""Graph -> Graph optimization passes, each a pure function in its own file."""

from __future__ import annotations

from collections.abc import Callable

from vfuse.ir import Graph
from vfuse.passes.attention import fuse_attention
from vfuse.passes.canonicalize import canonicalize
from vfuse.passes.cse import cse
from vfuse.passes.dce import dce
from vfuse.passes.fold_bn import fold_batchnorm
from vfuse.passes.grad_layout import store_grads_permuted
from vfuse.passes.stack_pieces import stack_pieces

Pass = Callable[[Graph], Graph]

# The optimization pipeline, in order. Attention matching runs after canonicalize has removed
# identity casts/expands; BN folding only fires on frozen (CONSTANT) parameters.
PIPELINE: tuple[tuple[str, Pass], ...] = (
    ("canonicalize", canonicalize),
    ("stack_pieces", stack_pieces),
    ("cse", cse),
    ("fold_batchnorm", fold_batchnorm),
    ("fuse_attention", fuse_attention),
    ("dce", dce),
    ("store_grads_permuted", store_grads_permuted),  # after dce: counts the live readers only
)


def optimize(graph: Graph) -> Graph:
    for _, p in PIPELINE:
        graph = p(graph)
    return graph


__all__ = [
    "PIPELINE",
    "canonicalize",
    "cse",
    "dce",
    "fold_batchnorm",
    "fuse_attention",
    "optimize",
    "stack_pieces",
    "store_grads_permuted",
]
