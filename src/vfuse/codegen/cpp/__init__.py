"""The C++ backend: op tables, prelude, renderer and the cached compiler driver."""

from vfuse.codegen.cpp.render import render
from vfuse.codegen.cpp.rules import CPP_RULES, REDUCE_RULES
from vfuse.codegen.cpp.toolchain import CompileError, CompilerNotFound, find_toolchain, load_library

__all__ = ["CPP_RULES", "REDUCE_RULES", "CompileError", "CompilerNotFound", "find_toolchain", "load_library", "render"]
