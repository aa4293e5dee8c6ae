"""What vfuse tells a user about what it compiled: the `vfuse` log, one warning per torch fallback
op, and the weak registry behind vfuse.compiled_graphs() / last_compiled() / stats()."""

from __future__ import annotations

import gc
import logging
import os
import subprocess
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import vfuse
from vfuse.entry import observe


def f(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x) * 2 + 1


def with_cumsum(x: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(torch.relu(x), dim=1) * 2


def with_sort(x: torch.Tensor) -> torch.Tensor:
    return torch.sort(x, dim=1).values + 1


@pytest.fixture
def vfuse_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """caplog on the `vfuse` logger itself: once torch's logging has configured it, it does not
    propagate to the root logger caplog listens on (and while it does, records would come twice)."""
    logger = logging.getLogger("vfuse")
    level, propagate = logger.level, logger.propagate
    logger.addHandler(caplog.handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    caplog.handler.setLevel(logging.DEBUG)
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)
        logger.setLevel(level)
        logger.propagate = propagate


def test_each_compiled_graph_logs_one_info_line(vfuse_log: pytest.LogCaptureFixture) -> None:
    torch._dynamo.reset()
    x = torch.randn(4, 6)
    torch.testing.assert_close(torch.compile(f, backend="vfuse")(x), f(x))
    (line,) = [r.getMessage() for r in vfuse_log.records if r.levelno == logging.INFO]
    assert "graph #" in line and "in 1 native kernel, 0 torch calls" in line


def test_a_torch_fallback_is_warned_about_once_per_op(
    vfuse_log: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(observe, "_warned", set())
    torch._dynamo.reset()
    x = torch.randn(4, 6)
    for fn in (with_cumsum, with_cumsum, with_sort):
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(fn, backend="vfuse")(x), fn(x))
    warned = [r.getMessage() for r in vfuse_log.records if r.levelno == logging.WARNING]
    assert len(warned) == 2, warned
    assert "aten.cumsum.default runs through torch" in warned[0]
    assert "sort" in warned[1]


def test_artifacts_show_ir_plan_and_generated_code(vfuse_log: pytest.LogCaptureFixture) -> None:
    torch._dynamo.reset()
    vfuse.set_logs(None, output_code=True)
    try:
        torch.compile(f, backend="vfuse")(torch.randn(4, 6))
    finally:
        torch._logging.set_logs()
    (code,) = [r.getMessage() for r in vfuse_log.records if "vfuse_output_code" in r.getMessage()]
    assert 'extern "C"' in code
    assert not any(r.levelno == logging.INFO for r in vfuse_log.records)  # level None: no INFO lines


def test_torch_logs_environment_variable_shows_vfuse(tmp_path: Path) -> None:
    code = (
        "import torch\n"
        "torch.compile(lambda x: torch.relu(x) * 2, backend='vfuse')(torch.randn(4, 5))\n"
    )  # fmt: skip
    env = {**os.environ, "TORCH_LOGS": "+vfuse", "VFUSE_CACHE_DIR": str(tmp_path)}
    for _ in range(2):  # the second process looks the graph up in the graph cache first: still graph #0
        err = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300).stderr
        assert "vfuse: inference graph #0 (graph0) compiled in" in err
        assert "[__vfuse_plan]" in err and "[__vfuse_output_code]" in err


def test_string_backend_graphs_are_reachable_and_weak() -> None:
    torch._dynamo.reset()
    x = torch.randn(4, 6)
    compiled = torch.compile(with_cumsum, backend="vfuse")
    compiled(x)
    graph = vfuse.last_compiled()
    assert graph is not None and graph in vfuse.compiled_graphs()
    assert graph.stats.fallbacks == {"aten.cumsum.default": 1}
    stats = vfuse.stats()
    assert stats.fallbacks.get("aten.cumsum.default", 0) >= 1 and stats.kernels >= graph.stats.kernels
    ref = weakref.ref(graph)
    del compiled, graph
    torch._dynamo.reset()
    gc.collect()
    assert ref() is None  # the registry alone does not keep a graph alive


def test_stats_read_as_text() -> None:
    torch._dynamo.reset()
    backend = vfuse.backend()
    torch.compile(with_cumsum, backend=backend)(torch.randn(4, 6))
    text = str(observe.CompileStats.of(backend.compiled, eager_graphs=len(backend.eager_fallbacks)))
    kernels = backend.compiled[0].stats.kernels
    assert text.startswith("1 graph compiled in ") and f"{kernels} native kernels, 1 torch call per run" in text
    assert "not compiled, run through torch: aten.cumsum.default" in text and "Counter" not in text
