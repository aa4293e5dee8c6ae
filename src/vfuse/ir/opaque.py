"""How an OPAQUE node calls torch: the op plus its argument structure with tensor slots."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.utils._pytree as pytree


@dataclass(frozen=True, slots=True)
class ArgSlot:
    """Placeholder in an OpaqueCall's arguments for the node's i-th input tensor."""

    index: int


@dataclass(frozen=True, eq=False, slots=True)
class OpaqueCall:
    """`target(*args, **kwargs)` with ArgSlot(i) standing for the node's i-th input.

    Compared by identity: the arguments may hold unhashable values (lists, devices).
    """

    target: Any
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...] = ()

    @property
    def name(self) -> str:
        return (
            str(getattr(self.target, "__name__", self.target))
            if not hasattr(self.target, "_schema")
            else str(self.target)
        )

    def run(self, inputs: list[Any]) -> Any:
        def fill(x: Any) -> Any:
            return inputs[x.index] if isinstance(x, ArgSlot) else x

        args, kwargs = pytree.tree_map(fill, (list(self.args), dict(self.kwargs)))
        return self.target(*args, **kwargs)

    def __str__(self) -> str:
        return self.name
