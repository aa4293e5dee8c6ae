"""`make demo` / `python -m vfuse.demo`: compile a built-in transformer block and show every stage.

Prints the captured ATen graph, the lowered IR, the check against eager, the fusion report,
and the time of eager, Inductor and vfuse measured in this run (interleaved, same threads).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
from rich.console import Console
from rich.rule import Rule
from rich.table import Table

import vfuse
from vfuse.demo.model import example


def _stage_text(dump: Path, name: str) -> str:
    return (dump / "graph0" / name).read_text()


def _timings(model: torch.nn.Module, x: torch.Tensor, contenders: dict, reps: int) -> Table:
    from vfuse.bench.timing import TimingConfig, measure

    stats = measure({k: (lambda f=f: f(x)) for k, f in contenders.items()}, TimingConfig(3, reps, 0.02))
    table = Table(title=f"median of {reps} interleaved rounds, {torch.get_num_threads()} threads")
    for col in ("contender", "median ms", "vs eager"):
        table.add_column(col, justify="right" if col != "contender" else "left")
    base = stats["eager"].median_s
    for name, s in stats.items():
        table.add_row(name, f"{s.median_s * 1e3:.3f}", f"{base / s.median_s:.2f}x")
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vfuse.demo", description=__doc__)
    parser.add_argument("--no-inductor", action="store_true", help="skip Inductor (its compile takes a while)")
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args(argv)
    console = Console(width=120)
    model, x = example()
    console.print(Rule("vfuse demo: GPT-2-style block, x = float32" + str(list(x.shape)) + ", inference"))
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        backend = vfuse.backend(dump_dir=Path(tmp), strict=True)
        compiled = torch.compile(model, backend=backend)
        got, expected = compiled(x), model(x)
        console.print(Rule("1. captured ATen graph (torch.compile -> Dynamo -> AOTAutograd)"))
        console.print(_stage_text(Path(tmp), "01_fx.txt"), markup=False, highlight=False)
        console.print(Rule("2. vfuse IR after lowering and optimization"))
        console.print(_stage_text(Path(tmp), "03_optimized.txt"), markup=False, highlight=False)
    err = (got - expected).abs().max().item()
    ok = torch.allclose(got, expected, rtol=1e-4, atol=1e-5)
    console.print(Rule("3. check against eager"))
    console.print(f"max |vfuse - eager| = {err:.2e}  ->  {'OK' if ok else 'MISMATCH'}")
    console.print(f"stats: {backend.stats}")
    console.print(Rule("4. fusion report"))
    console.print(str(vfuse.explain(model, x)), markup=False, highlight=False)
    console.print(Rule("5. speed"))
    contenders = {"eager": model, "vfuse": compiled}
    if not args.no_inductor:
        contenders["inductor"] = torch.compile(model)
    with torch.no_grad():
        console.print(_timings(model, x, contenders, args.reps))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
