"""`vfuse bench`: eager vs Inductor vs vfuse on memory-bound CPU workloads (see docs/benchmarks.md)."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark harness with these arguments (see `vfuse bench --help`)."""
    # Imported on call: `python -m vfuse.bench.compile_times` imports this package first, and
    # must not find its own module already imported through the command module.
    from vfuse.bench.command import main as run

    return run(argv)


__all__ = ["main"]
