"""The `vfuse` command line: explain on a factory module, bench forwarding, one-line errors."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from vfuse import cli


def tiny_report(target: str) -> Any:
    """x -> neg -> exp as one pointwise kernel: enough for the command line's plumbing."""
    from vfuse.fusion.plan import Cost, Decision, FusionPlan, Group
    from vfuse.fusion.rules import Rule
    from vfuse.ir import DType, GraphBuilder, Kind, Op, TensorType
    from vfuse.report import build_report

    b = GraphBuilder()
    x = b.add(Op.INPUT, name="x", index=0, type=TensorType((8,), DType.F32))
    y = b.add(Op.EXP, [b.add(Op.NEG, [x], name="n")], name="y")
    graph = b.build([y])
    cost = Cost(16, 64, 1e-9, 2e-9, 1e-6, 1.002e-6, 0.1, 1.0)
    group = Group(0, ("n", "y"), Kind.ELEMENTWISE, "pointwise", ("x",), ("y",), cost)
    decision = Decision(("n",), ("y",), True, Rule.ELEMENTWISE_INTO_ANY, "", 1e-6)
    return build_report(graph, FusionPlan(graph, target, (group,), (decision,)), target)


@pytest.fixture
def fake_explain(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, tuple[Any, ...], str, dict[str, Any]]]:
    """Replace capture + planning with a hand-built report, recording what explain was given."""
    calls: list[tuple[Any, tuple[Any, ...], str, dict[str, Any]]] = []

    def fake(model: Any, *inputs: Any, target: str = "cpu", **options: Any) -> Any:
        calls.append((model, inputs, target, options))
        return tiny_report(target)

    monkeypatch.setattr(importlib.import_module("vfuse.report.explain"), "explain", fake)
    return calls


def write_module(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "models.py"
    path.write_text(textwrap.dedent(body))
    return path


GOOD = """
    def double(x):
        return x * 2

    def factory():
        return double, (3,)

    def as_list():
        return double, [3]

    def not_a_pair():
        return double

    def inputs_not_tuple():
        return double, 3

    def model_not_callable():
        return 5, (3,)

    def raises():
        raise ValueError("no weights here\\nsecond line")

    NOT_CALLABLE = 1
"""


def test_explain_prints_report_and_writes_files(
    tmp_path: Path, fake_explain: list, capsys: pytest.CaptureFixture[str]
) -> None:
    mod = write_module(tmp_path, GOOD)
    html, dot = tmp_path / "out.html", tmp_path / "out.dot"
    rc = cli.main(["explain", f"{mod}:factory", "--target", "h100", "--html", str(html), "--dot", str(dot)])
    out, err = capsys.readouterr()
    assert rc == 0
    ((model, inputs, target, options),) = fake_explain
    assert (model.__name__, inputs, target, options) == ("double", (3,), "h100", {"freeze": False})
    assert "vfuse fusion report (target: h100)" in out
    assert "1 native kernel in 1 native call, 0 torch calls" in out and "2 ops -> 1 planner group" in out
    assert "\x1b" not in out  # not a terminal: plain text
    assert html.read_text().startswith("<!DOCTYPE html>")
    assert dot.read_text().count("subgraph cluster_") == 1
    assert err.splitlines() == [f"wrote {html}", f"wrote {dot}"]


def test_list_of_inputs_is_accepted(tmp_path: Path, fake_explain: list) -> None:
    mod = write_module(tmp_path, GOOD)
    assert cli.main(["explain", f"{mod}:as_list"]) == 0
    assert fake_explain[0][1:3] == ((3,), "cpu")


def test_freeze_summary_and_json(tmp_path: Path, fake_explain: list, capsys: pytest.CaptureFixture[str]) -> None:
    mod = write_module(tmp_path, GOOD)
    assert cli.main(["explain", f"{mod}:factory", "--freeze", "--summary"]) == 0
    assert fake_explain[-1][3] == {"freeze": True}
    summary = capsys.readouterr().out
    assert "decisions by rule" in summary and "decisions (producer -> consumer)" not in summary
    assert cli.main(["explain", f"{mod}:factory", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["runs"] == {"kernels": 1, "native_calls": 1, "torch_calls": 0}
    assert data["time"]["baseline"] == "vs unfused (cost model)"
    assert [k["name"] for k in data["kernels"]] == ["k0"]
    with pytest.raises(SystemExit) as exit_:
        cli.main(["explain", f"{mod}:factory", "--json", "--summary"])
    assert exit_.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("missing.py:factory", "no such file: missing.py"),
        ("{mod}", "expected SPEC as module.py:factory, got '{mod}'"),
        ("{mod}:nope", "{mod} has no attribute 'nope'"),
        ("{mod}:NOT_CALLABLE", "{mod}:NOT_CALLABLE is a int, not a callable factory"),
        ("{mod}:not_a_pair", "{mod}:not_a_pair() must return (model_or_fn, example_inputs), got a function"),
        ("{mod}:inputs_not_tuple", "{mod}:inputs_not_tuple() must return example_inputs as a tuple, got a int"),
        ("{mod}:model_not_callable", "{mod}:model_not_callable() returned a int as the model"),
        ("{mod}:raises", "{mod}:raises() raised ValueError: no weights here"),
        ("no_such_module_xyz:factory", "no such module: no_such_module_xyz"),
    ],
)
def test_usage_errors_are_one_line_exit_2(
    tmp_path: Path, fake_explain: list, capsys: pytest.CaptureFixture[str], spec: str, message: str
) -> None:
    mod = write_module(tmp_path, GOOD)
    assert cli.main(["explain", spec.format(mod=mod)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    (line,) = err.splitlines()
    assert line.startswith(f"vfuse explain: error: {message.format(mod=mod)}")
    assert fake_explain == []


def test_unknown_target(tmp_path: Path, fake_explain: list, capsys: pytest.CaptureFixture[str]) -> None:
    mod = write_module(tmp_path, GOOD)
    assert cli.main(["explain", f"{mod}:factory", "--target", "tpu9"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == "vfuse explain: error: unknown target 'tpu9'; known: cpu, a100, h100, h200"
    assert fake_explain == []


def test_module_that_fails_to_import(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mod = write_module(tmp_path, "import no_such_dependency_xyz\n")
    assert cli.main(["explain", f"{mod}:factory"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    missing = "No module named 'no_such_dependency_xyz'"
    assert line == f"vfuse explain: error: importing {mod} failed: ModuleNotFoundError: {missing}"


def test_unwritable_output_is_a_usage_error(
    tmp_path: Path, fake_explain: list, capsys: pytest.CaptureFixture[str]
) -> None:
    mod = write_module(tmp_path, GOOD)
    assert cli.main(["explain", f"{mod}:factory", "--html", str(tmp_path / "no" / "dir" / "x.html")]) == 2
    assert capsys.readouterr().err.startswith("vfuse explain: error: cannot write")


def test_bench_forwards_its_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    bench = importlib.import_module("vfuse.bench")
    seen: list[list[str]] = []
    monkeypatch.setattr(bench, "main", lambda argv: seen.append(list(argv)) or 3)
    assert cli.main(["bench", "--quick", "--help"]) == 3
    assert seen == [["--quick", "--help"]]


def test_help_documents_the_factory_contract(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["explain", "--help"])
    assert exit_.value.code == 0
    assert "(model_or_fn, example_inputs)" in capsys.readouterr().out


def test_python_dash_m_vfuse() -> None:
    bad = subprocess.run([sys.executable, "-m", "vfuse", "explain", "missing.py:f"], capture_output=True, text=True)
    assert (bad.returncode, bad.stdout, bad.stderr) == (2, "", "vfuse explain: error: no such file: missing.py\n")


def test_explain_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # In process: the real capture and planner, without paying for a second torch import.
    mod = write_module(
        tmp_path,
        """
        import torch

        def factory():
            return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU()), (torch.randn(4, 16),)
        """,
    )
    html = tmp_path / "r.html"
    assert cli.main(["explain", f"{mod}:factory", "--target", "h100", "--html", str(html)]) == 0
    out, err = capsys.readouterr()
    assert "vfuse fusion report (target: h100)" in out
    assert "Linear+GELU GEMM epilogue" in out  # the Linear and its GELU run as one GEMM kernel
    assert f"wrote {html}" in err
    assert 'class="kernel' in html.read_text()


def test_capture_failure_is_one_line_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("cannot export this model\nlong details")

    monkeypatch.setattr(importlib.import_module("vfuse.report.explain"), "explain", broken)
    mod = write_module(tmp_path, GOOD)
    assert cli.main(["explain", f"{mod}:factory"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line == "vfuse explain: failed: RuntimeError: cannot export this model (rerun with --traceback)"
    with pytest.raises(RuntimeError, match="cannot export"):
        cli.main(["explain", f"{mod}:factory", "--traceback"])


def test_terminal_gets_colour(
    tmp_path: Path, fake_explain: list, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    mod = write_module(tmp_path, GOOD)
    assert cli.main(["explain", f"{mod}:factory"]) == 0
    out = capsys.readouterr().out
    assert "vfuse fusion report" in out
    assert "\x1b[" in out  # escape codes only on a terminal (test_explain_prints_report checks the plain path)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    import vfuse

    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"vfuse {vfuse.__version__} (torch 2.13") and "Python 3." in out
    run = subprocess.run([sys.executable, "-m", "vfuse", "--version"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout == out
