"""A layered left-to-right layout of an IR graph for the HTML report (no Graphviz needed).

Compute nodes go in the layer after their deepest input (longest path), then every node that
is read moves right to just before its first reader so that edges stay short. Within a layer, nodes start in
graph order and a few barycenter sweeps (Sugiyama's heuristic) move each node towards the
mean position of its neighbours, which removes most edge crossings on typical model graphs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from vfuse.ir import Graph, Kind

BOX_W = 150
BOX_H = 40
GAP_X = 42
GAP_Y = 18
MARGIN = 20
SWEEPS = 4


@dataclass(frozen=True, slots=True)
class Box:
    x: float
    y: float
    w: float = BOX_W
    h: float = BOX_H

    @property
    def right(self) -> tuple[float, float]:
        return (self.x + self.w, self.y + self.h / 2)

    @property
    def left(self) -> tuple[float, float]:
        return (self.x, self.y + self.h / 2)


@dataclass(frozen=True)
class Layout:
    boxes: dict[str, Box]
    layers: tuple[tuple[str, ...], ...]
    width: float
    height: float


def layer_of(graph: Graph) -> dict[str, int]:
    """Layer index per node: longest path from the inputs, then every node that has readers is
    pulled right to just before its first reader (weight transposes, constants), so that edges
    stay short instead of spanning the whole drawing."""
    layer: dict[str, int] = {}
    for n in graph.nodes:
        if n.kind is not Kind.SOURCE:
            layer[n.name] = 1 + max((layer.get(i, 0) for i in n.inputs), default=0)
    for n in reversed(graph.nodes):
        readers = [layer[u] for u in graph.users(n.name)]
        if readers:
            layer[n.name] = min(readers) - 1
        elif n.kind is Kind.SOURCE:
            layer[n.name] = 0
    return layer


def order_layers(graph: Graph, layer: dict[str, int]) -> list[list[str]]:
    """Nodes per layer, ordered to reduce crossings by alternating down/up barycenter sweeps."""
    depth = max(layer.values(), default=-1) + 1
    layers: list[list[str]] = [[] for _ in range(depth)]
    for n in graph.nodes:
        layers[layer[n.name]].append(n.name)
    preds = {n.name: n.inputs for n in graph.nodes}
    succs = {n.name: graph.users(n.name) for n in graph.nodes}
    for sweep in range(SWEEPS):
        forward = sweep % 2 == 0
        for k in range(1, depth) if forward else range(depth - 2, -1, -1):
            layers[k] = _by_barycenter(layers[k], _centred_positions(layers), preds if forward else succs)
    return layers


def _centred_positions(layers: list[list[str]]) -> dict[str, float]:
    # Layers are drawn centred, so compare positions on that common vertical scale.
    tallest = max(len(lay) for lay in layers)
    return {name: i + (tallest - len(lay)) / 2 for lay in layers for i, name in enumerate(lay)}


def _by_barycenter(names: list[str], pos: dict[str, float], neighbours: Mapping[str, Sequence[str]]) -> list[str]:
    keyed = []
    for name in names:
        near = [pos[m] for m in neighbours[name]]
        keyed.append((sum(near) / len(near) if near else pos[name], pos[name], name))
    return [name for _, _, name in sorted(keyed)]


def layout(graph: Graph) -> Layout:
    """Boxes in pixels: x by layer, y by position in the layer, each layer centred vertically."""
    layers = order_layers(graph, layer_of(graph))
    tallest = max((len(lay) for lay in layers), default=0)
    pitch = BOX_H + GAP_Y
    boxes: dict[str, Box] = {}
    for k, lay in enumerate(layers):
        offset = (tallest - len(lay)) * pitch / 2
        for i, name in enumerate(lay):
            boxes[name] = Box(MARGIN + k * (BOX_W + GAP_X), MARGIN + offset + i * pitch)
    width = 2 * MARGIN + len(layers) * (BOX_W + GAP_X) - GAP_X
    height = 2 * MARGIN + tallest * pitch - GAP_Y
    return Layout(boxes, tuple(tuple(lay) for lay in layers), max(width, 0), max(height, 0))
