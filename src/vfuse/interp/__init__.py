"""Reference executor: runs any IR graph op by op from the OpDef reference semantics."""

from vfuse.interp.executor import run, run_node

__all__ = ["run", "run_node"]
