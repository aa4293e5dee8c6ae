"""Reference executor: runs any IR graph op by op from the OpDef reference semantics."""

from vfuse.interp.executor import located, run, run_node

__all__ = ["located", "run", "run_node"]
