"""Build generated kernels into shared libraries once per session, cached by source hash."""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

FLAGS = ("-std=c++17", "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")

Builder = Callable[..., ctypes.CDLL]


def _compile(src: str, flags: tuple[str, ...], cache: Path) -> ctypes.CDLL:
    key = hashlib.sha256((src + "\0" + " ".join(flags)).encode()).hexdigest()[:16]
    lib = cache / f"k_{key}.so"
    if not lib.exists():
        cpp = cache / f"k_{key}.cpp"
        cpp.write_text(src)
        tmp = cache / f"k_{key}.so.tmp"
        proc = subprocess.run(["g++", *flags, str(cpp), "-o", str(tmp)], capture_output=True, text=True)
        if proc.returncode:
            raise AssertionError(f"g++ failed on {cpp}:\n{proc.stderr[-4000:]}")
        tmp.replace(lib)  # atomic: a half-written library is never loaded
    return ctypes.CDLL(str(lib))


@pytest.fixture(scope="session")
def build(tmp_path_factory: pytest.TempPathFactory) -> Builder:
    """build(source, extra_flags=()) -> CDLL; identical sources compile once per session."""
    if shutil.which("g++") is None:
        pytest.skip("g++ not available")
    cache = tmp_path_factory.mktemp("gemm_build")

    def _build(src: str, extra: tuple[str, ...] = ()) -> ctypes.CDLL:
        return _compile(src, FLAGS + tuple(extra), cache)

    return _build


def ptr(x: torch.Tensor | float) -> ctypes.c_void_p | ctypes.c_float:
    """A kernel argument: tensors by data pointer, Python floats as C float."""
    if isinstance(x, torch.Tensor):
        return ctypes.c_void_p(x.data_ptr())
    return ctypes.c_float(x)


@pytest.fixture(scope="session")
def call() -> Callable[..., None]:
    """call(lib, name, *tensors_or_floats, nthreads=2) runs one generated kernel."""

    def _call(lib: ctypes.CDLL, name: str, *args: torch.Tensor | float, nthreads: int = 2) -> None:
        getattr(lib, name)(*(ptr(a) for a in args), ctypes.c_int(nthreads))

    return _call
