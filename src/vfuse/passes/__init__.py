"""Graph -> Graph optimization passes, each a pure function in its own file."""

from __future__ import annotations

from collections.abc import Callable

from vfuse.ir import Graph
from vfuse.passes.canonicalize import canonicalize
from vfuse.passes.cse import cse
from vfuse.passes.dce import dce

Pass = Callable[[Graph], Graph]

# The optimization pipeline, in order. Pattern rewrites (Conv-BN folding, attention) join here.
PIPELINE: tuple[tuple[str, Pass], ...] = (
    ("canonicalize", canonicalize),
    ("cse", cse),
    ("dce", dce),
)


def optimize(graph: Graph) -> Graph:
    for _, p in PIPELINE:
        graph = p(graph)
    return graph


__all__ = ["PIPELINE", "canonicalize", "cse", "dce", "optimize"]
