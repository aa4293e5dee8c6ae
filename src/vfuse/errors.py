"""Errors vfuse raises to users. Each message names what it is about (input, node, op, file)."""

from __future__ import annotations


class VfuseError(Exception):
    """Base class of every error vfuse raises on purpose."""


class VfuseInputError(VfuseError, TypeError):
    """A compiled callable got an input of another shape, dtype or device than it was built for."""


class VfuseOptionError(VfuseError, ValueError, TypeError):
    """An option vfuse does not know, or a value it does not accept: the message names the option,
    the value and what is accepted. Both a ValueError and a TypeError (a wrong type is either)."""


class VfuseCompileError(VfuseError, RuntimeError):
    """Compiling a graph failed (raised in strict mode; otherwise vfuse warns and runs eagerly)."""


class VfuseCodegenError(VfuseCompileError):
    """vfuse generated native code it could not build (a vfuse bug, not the user's): raised
    with raise_codegen_errors (the test suite), else the graph falls back with a warning."""


class VfuseIndexError(VfuseError, IndexError, RuntimeError):
    """A gather read an index out of range. Eager torch raises IndexError (or RuntimeError for
    index_select on other dims than 0): this is both, so either handler catches it."""


class VfuseZeroDivisionError(VfuseError, ZeroDivisionError, RuntimeError):
    """Integer division or remainder by zero. Eager torch raises RuntimeError('ZeroDivisionError'):
    this is a ZeroDivisionError and a RuntimeError, so either handler catches it."""
