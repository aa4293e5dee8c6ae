"""Dump folders: one per compiled graph, never overwritten, listed in an index.

With `dump_dir` (VFUSE_DUMP) every graph an entry point compiles writes its stages to
`<dump_dir>/<pid>-<serial>-<graph id>/`, where serial numbers the graphs the entry points compile in
this process (`_SERIAL`, an itertools.count: graph breaks, backward graphs and several models in one
process each get their own folder). `<dump_dir>/index.txt` gets one tab-separated line per folder:
folder, graph id, kind (forward, backward, inference, specialized, aot), local time and input types.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from vfuse.context import Context, Options

_SERIAL = itertools.count()
INDEX = "index.txt"
_HEADER = "# folder\tgraph\tkind\ttime\tinputs\n"


def graph_context(options: Options, graph_id: str, kind: str, inputs: Sequence[Any]) -> Context:
    """The Context of the next graph an entry point compiles; lists its dump folder in the index."""
    ctx = Context(options, graph_id, serial=next(_SERIAL))
    folder = ctx.dump_folder
    if folder is not None:
        _append_index(folder, ctx.graph_id, kind, inputs)
    return ctx


def _append_index(folder: Path, graph_id: str, kind: str, inputs: Sequence[Any]) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    index = folder.parent / INDEX
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    line = "\t".join((folder.name, graph_id, kind, stamp, describe_inputs(inputs))) + "\n"
    # One write per line in append mode: processes dumping into one folder do not interleave lines.
    with index.open("a", encoding="utf-8") as f:
        f.write(line if f.tell() else _HEADER + line)


def describe_inputs(inputs: Sequence[Any]) -> str:
    """`float32[8, 64], int64[8]`: each input's dtype and shape (symbolic sizes by name)."""
    return ", ".join(_describe(x) for x in inputs)


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"{str(x.dtype).removeprefix('torch.')}[{', '.join(str(d) for d in x.shape)}]"
    return str(x)
