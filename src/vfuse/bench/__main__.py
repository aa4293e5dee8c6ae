"""`python -m vfuse.bench ...` runs the benchmark harness."""

from vfuse.bench.command import main

if __name__ == "__main__":
    raise SystemExit(main())
