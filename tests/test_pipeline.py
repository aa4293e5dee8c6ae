"""compile_fx's stages: each dumps its printed form, and verify mode checks the IR after every pass."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vfuse import compiler
from vfuse.context import Context, Options
from vfuse.entry.trace import trace_aten
from vfuse.ir import Graph, GraphBuilder, IRError, Op


def _gm() -> torch.fx.GraphModule:
    return trace_aten(lambda x: torch.relu(x * 2).sum(-1), [torch.randn(4, 8)])


def test_every_stage_dumps(tmp_path: Path) -> None:
    ctx = Context(Options(dump_dir=tmp_path), graph_id="g")
    compiled = compiler.compile_fx(_gm(), ctx)
    x = torch.randn(4, 8)
    torch.testing.assert_close(compiled(x)[0], torch.relu(x * 2).sum(-1))
    stages = sorted(p.name for p in (tmp_path / "g").iterdir())
    assert stages == [
        "01_fx.txt", "02_ir.txt", "03_optimized.txt", "04_plan.txt", "05_program.txt", "06_kernels.cpp",
    ]  # fmt: skip
    assert "kernel" in (tmp_path / "g" / "05_program.txt").read_text()


def _drops_an_input(graph: Graph) -> Graph:
    """A broken pass: it renumbers the graph's only input to -1, no argument position."""
    b = GraphBuilder()
    (x,) = graph.inputs
    y = b.add(Op.INPUT, name=x.name, index=-1, type=x.type)
    return b.build([b.add(Op.NEG, [y])])


def test_verify_mode_names_the_pass_that_broke_the_ir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiler, "PIPELINE", (*compiler.PIPELINE, ("broken", _drops_an_input)))
    with pytest.raises(IRError, match="after pass broken: input indices"):
        compiler.compile_fx(_gm(), Context(Options(verify=True, backend="interp")))
    # Without verify mode the same pass goes unnoticed until later stages.
    compiler.compile_fx(_gm(), Context(Options(verify=False, backend="interp")))
