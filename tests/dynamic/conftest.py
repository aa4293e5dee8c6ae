"""Fixtures shared by the dynamic-shape tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import vfuse.compiler as compiler
from vfuse.schedule.kernel import Program


@pytest.fixture
def rendered(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[Program, str]]]:
    """Lists each (Program, C++ source) the compiler renders, between two Dynamo resets; the
    graph cache is off (a program an earlier test kept would be loaded, not rendered)."""
    out: list[tuple[Program, str]] = []
    real = compiler.render

    def render(program: Program, ctx: object) -> str:
        source = real(program, ctx)  # type: ignore[arg-type]
        out.append((program, source))
        return source

    monkeypatch.setattr(compiler, "render", render)
    monkeypatch.setenv("VFUSE_GRAPH_CACHE", "0")
    torch._dynamo.reset()
    yield out
    torch._dynamo.reset()
