"""One generated function that admits a compiled graph's inputs, as Inductor's guards do.

`CompiledGraph.check_inputs` used to walk its expected inputs in a Python loop (a generator per
shape with symbolic sizes, the sizes read three times per call on the `vfuse.compile` path):
~0.5 us per input, ~2 us with symbolic sizes. The guard is the same tests written out once per
graph as straight-line code: per tensor input its type, dtype, device and fixed dims, the sizes
of a symbolic program read once, every symbolic dim compared with its expression at those sizes,
and one device for all inputs where CUDA tensors are taken. It returns the call's key (the sizes
read; `()` without symbols) or None; on None the caller runs the full checks, which raise naming
the input (the guard may be stricter than the checks, never more lenient: on a false None they
pass and the call goes on).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from vfuse.ir.sym import is_sym, python

Guard = Callable[[Sequence[object]], "tuple[Any, ...] | None"]
Check = tuple[int, tuple[Any, ...], torch.dtype]  # input position, shape (fixed or SymSize dims), dtype


def input_guard(
    checks: Sequence[Check],
    arity: int,
    cuda: bool,
    sizes: Sequence[tuple[str, int, int]] = (),
) -> Guard:
    """`guard(inputs) -> key | None`. `checks`: (input position, shape, dtype) per tensor input,
    symbolic dims as `SymSize`; `sizes`: (symbol name, input position, dim: -1 for a size argument)
    in the key's order (`SymbolicExecutor.bindings`)."""
    scope: dict[str, Any] = {"Tensor": torch.Tensor, "int": int}
    lines = [f"if len(_a) != {arity}: return None"]
    for k, (index, shape, dtype) in enumerate(checks):
        scope[f"_d{k}"] = dtype
        device = f"(_t{k}.is_cpu or _t{k}.is_cuda)" if cuda else f"_t{k}.is_cpu"
        lines.append(f"_t{k} = _a[{index}]")
        lines.append(f"if not (isinstance(_t{k}, Tensor) and _t{k}.dtype is _d{k} and {device}): return None")
        if not any(is_sym(d) for d in shape):
            lines.append(f"if _t{k}.shape != {tuple(int(d) for d in shape)!r}: return None")
            continue
        fixed = [f"_z{k}[{d}] != {int(s)}" for d, s in enumerate(shape) if not is_sym(s)]
        lines.append(f"_z{k} = _t{k}.shape")
        lines.append(f"if {' or '.join([f'len(_z{k}) != {len(shape)}', *fixed])}: return None")
    if cuda and len(checks) > 1:
        same = " == ".join(f"_t{k}.get_device()" for k in range(len(checks)))
        lines.append(f"if not ({same}): return None")
    lines += _sizes(checks, sizes)
    src = "def guard(_a):\n" + "".join(f"    {line}\n" for line in lines)
    exec(compile(src, "<vfuse input guard>", "exec"), scope)
    return scope["guard"]


def _sizes(checks: Sequence[Check], sizes: Sequence[tuple[str, int, int]]) -> list[str]:
    """Read the symbols (a size argument must be an int), compare every symbolic dim with its
    expression at them (kernels trust them: a shorter tensor would be read past its end), and
    return them as the key."""
    if not sizes:
        return ["return ()"]
    lines = []
    for name, index, dim in sizes:
        if dim >= 0:
            lines.append(f"{name} = _a[{index}].shape[{dim}]")
        else:
            lines.append(f"{name} = _a[{index}]")
            lines.append(f"if type({name}) is not int: return None")
    dims = [(k, d, s) for k, (_, shape, _) in enumerate(checks) for d, s in enumerate(shape) if is_sym(s)]
    conds = [f"_z{k}[{d}] != ({python(s.expr)})" for k, d, s in dims]
    if conds:
        lines.append(f"if {' or '.join(conds)}: return None")
    lines.append(f"return ({''.join(f'{name}, ' for name, _, _ in sizes)})")
    return lines
