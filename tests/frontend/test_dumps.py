"""VFUSE_DUMP keeps every graph's stages: one folder per compiled graph (graph breaks, backward
graphs, several models, vfuse.compile), and an index listing them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import vfuse
from vfuse.entry.dumps import INDEX


def broken(x: torch.Tensor) -> torch.Tensor:
    y = torch.relu(x) * 2
    torch._dynamo.graph_break()
    return torch.sigmoid(y) + 1


def index_rows(dump: Path) -> list[list[str]]:
    lines = (dump / INDEX).read_text().splitlines()
    assert lines[0] == "# folder\tgraph\tkind\ttime\tinputs"
    return [line.split("\t") for line in lines[1:]]


def test_graph_breaks_and_two_models_keep_every_dump(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VFUSE_DUMP", str(tmp_path))
    torch._dynamo.reset()
    x = torch.randn(3, 5)
    torch.testing.assert_close(torch.compile(broken, backend="vfuse")(x), broken(x))  # two graphs
    with torch.no_grad():
        for width in (5, 7):  # two models, one backend object each
            model = torch.nn.Sequential(torch.nn.Linear(width, 4), torch.nn.ReLU())
            torch.compile(model, backend=vfuse.backend())(torch.randn(2, width))
    rows = index_rows(tmp_path)
    folders = [row[0] for row in rows]
    assert len(rows) == 4 and len(set(folders)) == 4
    assert all(folder.startswith(f"{os.getpid()}-") for folder in folders)
    assert [row[1] for row in rows] == ["graph0"] * 4  # a backend's own ids repeat; folders do not
    assert [row[2] for row in rows] == ["inference"] * 4  # nothing requires grad
    assert rows[0][4] == "float32[3, 5]" and rows[3][4] == "float32[4, 7], float32[4], float32[2, 7]"
    for folder in folders:
        assert (tmp_path / folder / "01_fx.txt").is_file() and (tmp_path / folder / "04_plan.txt").is_file()
    assert "relu" in (tmp_path / folders[0] / "02_ir.txt").read_text()
    assert "sigmoid" in (tmp_path / folders[1] / "02_ir.txt").read_text()


def test_backward_and_aot_graphs_get_folders_too(tmp_path: Path) -> None:
    torch._dynamo.reset()
    x = torch.randn(4, 3, requires_grad=True)
    torch.compile(lambda t: (torch.tanh(t) * 3).sum(), backend=vfuse.backend(dump_dir=tmp_path))(x).backward()
    vfuse.compile(lambda t: t * 2, [torch.randn(6)], dump_dir=str(tmp_path))
    rows = index_rows(tmp_path)
    assert [(row[1], row[2]) for row in rows] == [("graph0", "forward"), ("graph1", "backward"), ("aot0", "aot")]
    assert all((tmp_path / row[0] / "03_optimized.txt").is_file() for row in rows)
