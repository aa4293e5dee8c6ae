"""Write a rendered Triton module to the kernel cache and load it, interpreted or jit-compiled.

Triton reads a `@jit` function's source from its file, so the module is written to
`<cache_dir>/triton/vt_<sha256>.py` (a directory only this user can write, as the C++ kernel
cache: `cachedir.py`; else a private temporary one) and imported from there. The file is read
back before each import and rewritten unless it holds exactly the source rendered now.

Functions stay plain in the source and are wrapped here: for CPU tensors with Triton's
interpreter (`InterpretedFunction`), which needs no GPU and no TRITON_INTERPRET in the
environment (the kernels call only `tl` builtins and their own helpers, never triton's
`@jit` standard library); for a GPU or an offline compile with `JITFunction`. Each load is a
fresh module object, so the two never share a function.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
from pathlib import Path
from types import ModuleType

from vfuse.cachedir import private_dir, usable_dir, write_bytes_atomic


def module_path(source: str, cache_dir: Path) -> Path:
    """The cache file holding exactly `source` (written now if missing or different)."""
    key = hashlib.sha256(source.encode()).hexdigest()[:32]
    folder = usable_dir(cache_dir / "triton") or private_dir()
    path = folder / f"vt_{key}.py"
    if _read_nofollow(path) != source.encode():
        write_bytes_atomic(path, source.encode())
    return path


def _read_nofollow(path: Path) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read()


def load_module(path: Path, interpret: bool) -> ModuleType:
    """The module at `path` with every function it defines wrapped for Triton: interpreted
    (CPU tensors) or jit (GPU tensors, offline compiles)."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    name = f"vfuse_triton_{path.stem}_{'interp' if interpret else 'jit'}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    wrap = InterpretedFunction if interpret else JITFunction
    for attr, fn in list(vars(module).items()):
        if inspect.isfunction(fn) and fn.__module__ == name:
            setattr(module, attr, wrap(fn))
    if interpret:
        _fast_reductions(module)
        if hasattr(module, "_VF_INTERPRETED"):  # bf16 by its bits, templates' bf16 dots widened
            module._VF_INTERPRETED = True
    return module


def _fast_reductions(module: ModuleType) -> None:
    """Point the sum / max / min combine functions at triton's own: the interpreter reduces those
    with numpy and any other combine function element by element in Python (~1000x slower).
    Same results: triton's max / min ignore NaN as the kernels' do (NaN is tracked separately)."""
    import triton.language as tl

    std = getattr(tl, "standard", None)
    for attr, theirs in (("_vf_add", "_sum_combine"), ("_vf_max", "_elementwise_max"), ("_vf_min", "_elementwise_min")):
        if std is not None and hasattr(std, theirs):
            setattr(module, attr, getattr(std, theirs))
