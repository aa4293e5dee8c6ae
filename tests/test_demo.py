"""`make demo`: the result first (speed against eager, what runs, bytes), then the short report,
then where to read more; stats as text; the files it points to exist."""

from __future__ import annotations

from pathlib import Path

import pytest

from vfuse.demo.__main__ import main


def test_demo_leads_with_the_result(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--no-inductor", "--reps", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    order = [
        out.index(s) for s in ("── result ──", "vs eager", "what runs:", "DRAM traffic", "fusion report", "read more")
    ]
    assert order == sorted(order), out
    assert "-> OK" in out and "native kernel" in out and "Counter(" not in out
    assert (tmp_path / "report.html").is_file() and (tmp_path / "index.txt").is_file()
    assert str(tmp_path / "report.html") in out


def test_demo_model_factory_works_with_the_command_line() -> None:
    from vfuse.cli import call_factory, load_factory

    model, inputs = call_factory(load_factory("vfuse.demo.model:factory"), "vfuse.demo.model:factory")
    assert model(*inputs).shape == inputs[0].shape
