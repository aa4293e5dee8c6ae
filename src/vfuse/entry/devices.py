"""Which graphs vfuse can run: its kernels read and write CPU memory only.

A tensor on another device (meta, cuda, ...) has no CPU bytes behind its data pointer, so a
graph that takes, makes or returns one must not reach a kernel: the frontends run it through
torch (or refuse it) instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
import torch.utils._pytree as pytree


def foreign_device(
    gm: torch.fx.GraphModule, extra: Mapping[int, torch.Tensor] | None = None, allowed: tuple[str, ...] = ("cpu",)
) -> str | None:
    """Where `gm` (an ATen graph with `val` metadata) touches a device whose type is not in
    `allowed` (backend="triton" runs CUDA tensors too: `devices_for`), in words naming the node
    and device; None when everything is allowed. `extra`: tensors bound to inputs by position
    (frozen parameters)."""
    placeholders = 0
    for node in gm.graph.nodes:
        values: Iterable[object] = pytree.tree_leaves(node.meta.get("val"))
        if node.op == "get_attr":
            values = [*values, getattr(gm, str(node.target), None)]
        device = _first_foreign(values, allowed)
        if device is not None:
            if node.op == "placeholder":
                return f"input {placeholders} ('{node.name}') is on {device}"
            return f"node '{node.name}' ({_op_name(node)}) is on {device}"
        placeholders += node.op == "placeholder"
    for i, t in (extra or {}).items():
        device = _first_foreign([t], allowed)
        if device is not None:
            return f"input {i} is on {device}"
    return None


def devices_for(backend: str) -> tuple[str, ...]:
    """The device types a backend's kernels read: Triton's run on CUDA tensors too."""
    return ("cpu", "cuda") if backend == "triton" else ("cpu",)


def _first_foreign(values: Iterable[object], allowed: tuple[str, ...]) -> torch.device | None:
    for v in values:
        if isinstance(v, torch.Tensor) and v.device.type not in allowed:
            return v.device
    return None


def _op_name(node: torch.fx.Node) -> str:
    if node.op == "call_function":
        return str(getattr(node.target, "__name__", node.target))
    return node.op
