"""Where each IR node came from in the user's model: module path, module class, source line.

torch.export records on every FX node the stack of modules running when it was traced
(`nn_module_stack`) and the user's source line (`stack_trace`). IR nodes name the FX node they
were lowered from (`Node.origin`), so a table keyed by FX node name labels kernels with
`layers.0.attn.norm` rather than IR names, without carrying anything through the IR. Nodes a
pass creates have no origin and take their nearest neighbour's module.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from vfuse.ir import Graph, Kind


@dataclass(frozen=True, slots=True)
class Source:
    """module: the innermost module's qualified path ("layers.0.attn.norm"; "" at the top level);
    cls: its class name ("LayerNorm"); line: the user's source line ("model.py:27 y = attn(q, k, v)")."""

    module: str
    cls: str
    line: str = ""

    @property
    def label(self) -> str:
        """The module path, or the class name for the top-level module."""
        return self.module or self.cls


_TRACE = re.compile(r'File "([^"]+)", line (\d+), in \w+\n\s*(.*)')


def fx_sources(
    fx_nodes: Iterable[Any], parameters: Mapping[str, str] | None = None, root: Any = None
) -> dict[str, Source]:
    """Source of each FX node by name. `parameters` maps a placeholder that export lifted from a
    parameter or buffer to its target ("ln1.weight"); `root` (the nn.Module) gives their classes."""
    out: dict[str, Source] = {}
    for n in fx_nodes:
        stack = n.meta.get("nn_module_stack") or {}
        if stack:
            path, cls = list(stack.values())[-1]
            out[n.name] = Source(str(path), _class_name(cls), _user_line(n.meta.get("stack_trace") or ""))
        elif parameters and n.name in parameters:
            owner = parameters[n.name].rpartition(".")[0]
            out[n.name] = Source(owner, _owner_class(root, owner))
    return out


def _class_name(cls: Any) -> str:
    return (cls.__name__ if isinstance(cls, type) else str(cls)).rpartition(".")[2]


def _owner_class(root: Any, path: str) -> str:
    try:
        return type(root.get_submodule(path)).__name__ if root is not None else ""
    except AttributeError:
        return ""


def _user_line(trace: str) -> str:
    """The innermost frame of a stack trace as `file.py:27 code`."""
    frames = _TRACE.findall(trace)
    if not frames:
        return ""
    path, line, code = frames[-1]
    return f"{path.rpartition('/')[2]}:{line} {code.strip()}"


def node_sources(graph: Graph, fx: Mapping[str, Source]) -> dict[str, Source]:
    """Source of each IR node: its FX origin's; a node without one (made by a pass) takes its
    first input's, else its first user's."""
    out = {n.name: fx[n.origin] for n in graph.nodes if n.origin in fx}
    for n in graph.nodes:
        if n.name not in out:
            found = next((out[i] for i in n.inputs if i in out and graph[i].kind is not Kind.SOURCE), None)
            if found is not None:
                out[n.name] = found
    for n in reversed(graph.nodes):
        if n.name not in out:
            found = next((out[u] for u in graph.users(n.name) if u in out), None)
            if found is not None:
                out[n.name] = found
    return out


def exported_sources(program: Any, root: Any = None) -> dict[str, Source]:
    """`fx_sources` of a torch.export ExportedProgram; `root` is the exported nn.Module (or a function)."""
    lifted = {s.arg.name: s.target for s in program.graph_signature.input_specs if getattr(s, "target", None)}
    module = root if hasattr(root, "get_submodule") else None
    return fx_sources(program.graph_module.graph.nodes, lifted, module)
