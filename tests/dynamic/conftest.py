"""Fixtures shared by the dynamic-shape tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import vfuse.compiler as compiler
from vfuse.schedule.kernel import Program


@pytest.fixture
def rendered(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[Program, str]]]:
    """Lists each (Program, C++ source) the compiler renders, between two Dynamo resets."""
    out: list[tuple[Program, str]] = []
    real = compiler.render

    def render(program: Program, ctx: object) -> str:
        source = real(program, ctx)  # type: ignore[arg-type]
        out.append((program, source))
        return source

    monkeypatch.setattr(compiler, "render", render)
    torch._dynamo.reset()
    yield out
    torch._dynamo.reset()
