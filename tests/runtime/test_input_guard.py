"""A compiled graph's input guard (runtime/inputguard.py): one generated function admits exactly
the inputs the full checks admit, returns the sizes of a symbolic program read once, and leaves
every refusal to the checks, which name the input and what was wrong."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.export import Dim
from torch.fx.experimental.proxy_tensor import make_fx

import vfuse
import vfuse.compiler as compiler
from vfuse.context import Context, Options
from vfuse.errors import VfuseInputError
from vfuse.frontend.symbols import sym_env
from vfuse.runtime.inputguard import input_guard


def add_mul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x + y) * 2


def shared(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.relu(x - y) + y.sum(-1, keepdim=True)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (
            (torch.randn(3, 4), torch.ones(3, 4, dtype=torch.int32)),
            r"input 1 \(\w+\) was compiled for torch.float32\[3, 4\].*int32",
        ),
        ((torch.randn(3, 4), torch.randn(3, 5)), r"input 1 \(\w+\) was compiled for .*\[3, 4\].*\[3, 5\]"),
        ((torch.randn(3, 4), torch.randn(12)), r"input 1 \(\w+\) .*received tensor float32\[12\]"),
        ((torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 4)), r"input 0 \(\w+\) .*float64"),
        ((torch.randn(3, 4), torch.randn(3, 4, device="meta")), r"input 1 \(\w+\) .* on cpu, received .* on meta"),
        ((torch.randn(3, 4), 2.0), r"input 1 \(\w+\) .*received float"),
    ],
)
def test_every_refusal_is_named_and_the_guard_refuses_it_too(bad: tuple[Any, ...], message: str) -> None:
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    c = vfuse.compile(add_mul, (x, y))
    assert c.compiled.guard((x, y)) == ()
    assert c.compiled.guard(bad) is None
    with pytest.raises(VfuseInputError, match=message):
        c(*bad)
    with pytest.raises(VfuseInputError, match=message):
        c.compiled(*bad)
    torch.testing.assert_close(c(x, y), add_mul(x, y))


def test_wrong_arity_is_refused_on_both_paths() -> None:
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    c = vfuse.compile(add_mul, (x, y))
    assert c.compiled.guard((x,)) is None and c.compiled.guard((x, y, y)) is None
    with pytest.raises(VfuseInputError, match="expected 2 inputs, got 1"):
        c.compiled(x)
    with pytest.raises(VfuseInputError, match="structure"):
        c(x)


def test_views_are_admitted_and_read_in_their_own_layout() -> None:
    """Strides are not guarded: the executor makes a non-contiguous input contiguous first."""
    c = vfuse.compile(add_mul, (torch.randn(3, 4), torch.randn(3, 4)))
    base = torch.randn(4, 3)
    strided = torch.randn(3, 8)[:, ::2]
    offset = torch.randn(5, 4)[2:]
    for x, y in ((base.t(), strided), (offset, base.t()), (strided, offset)):
        assert c.compiled.guard((x, y)) == ()
        torch.testing.assert_close(c(x, y), add_mul(x, y))


def test_symbolic_sizes_are_read_once_and_every_dim_is_compared() -> None:
    n = Dim("n", min=1)
    x, y = torch.randn(6, 5), torch.randn(6, 5)
    c = vfuse.compile(shared, (x, y), dynamic_shapes={"x": {0: n}, "y": {0: n}})
    executor = c.compiled.executor
    reads: list[int] = []
    real = executor.read
    executor.read = lambda a: reads.append(1) or real(a)
    for rows in (6, 1, 13, 6, 1):
        x, y = torch.randn(rows, 5), torch.randn(rows, 5)
        assert c.compiled.guard((x, y)) == (rows,)
        torch.testing.assert_close(c(x, y), shared(x, y))
    assert reads == []  # the guard read the sizes: neither the variant choice nor the executor again
    disagree = (torch.randn(7, 5), torch.randn(3, 5))
    assert c.compiled.guard(disagree) is None
    with pytest.raises(VfuseInputError, match=r"input 1 .* size 3 at dim 0"):
        c(*disagree)
    wrong_fixed = (torch.randn(7, 5), torch.randn(7, 4))
    assert c.compiled.guard(wrong_fixed) is None
    with pytest.raises(VfuseInputError, match=r"input 1 \(\w+\) was compiled for torch.float32\[.*, 5\]"):
        c(*wrong_fixed)
    with pytest.raises(VfuseInputError, match=r"input 0 \(\w+\) .*received tensor float32\[7\]"):
        c(torch.randn(7), torch.randn(7, 5))


def test_symbolic_dims_given_by_expressions_are_compared_at_the_sizes_read() -> None:
    """`y.flatten(0).view_as(y)` makes Dynamo's symbolic trace relate y's dims to x's: a direct
    call whose second input is shorter is refused by the guard and named by the checks."""

    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + torch.cat([y, y], 0)[: y.shape[0] * 2 : 2]

    gm = make_fx(f, tracing_mode="symbolic")(torch.randn(8, 6), torch.randn(8, 6))
    cg = compiler.compile_fx(gm, Context(Options(raise_codegen_errors=True)), symbols=sym_env(gm))
    for n, m in ((8, 6), (13, 1), (1, 29)):
        x, y = torch.randn(n, m), torch.randn(n, m)
        assert cg.guard((x, y)) is not None
        torch.testing.assert_close(cg(x, y)[0], f(x, y))
    assert cg.guard((torch.randn(9, 6), torch.randn(8, 6))) is None
    with pytest.raises(VfuseInputError, match=r"size [89] at dim 0"):
        cg(torch.randn(9, 6), torch.randn(8, 6))


def test_size_arguments_must_be_ints() -> None:
    """Dynamo passes a graph's symbolic sizes as ints: anything else is left to the full checks."""
    torch._dynamo.reset()
    backend = vfuse.backend(strict=True)

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * x.shape[0]

    g = torch.compile(f, backend=backend, dynamic=True)
    with torch.no_grad():
        for n in (5, 11):
            x = torch.randn(n, 3)
            torch.testing.assert_close(g(x), f(x))
    cg = backend.compiled[-1]
    x = torch.randn(11, 3)
    (index, shape, _), bindings = cg._checks[0], cg.executor.bindings
    at = {str(size.expr): x.shape[d] for d, size in enumerate(shape)}  # symbol -> its size in x
    args: list[Any] = [None] * cg._arity
    args[index] = x
    for b in bindings:
        args[b.index] = at[b.name] if b.dim < 0 else args[b.index]
    assert any(b.dim < 0 for b in bindings)
    assert cg.guard(tuple(args)) == tuple(at[b.name] for b in bindings)
    torch.testing.assert_close(cg(*args)[0], f(x))
    size_arg = next(b.index for b in bindings if b.dim < 0)
    args[size_arg] = torch.tensor(args[size_arg])
    assert cg.guard(tuple(args)) is None
    args[size_arg] = 4  # an int, but not x's size: the guard compares the dims with it
    assert cg.guard(tuple(args)) is None
    with pytest.raises(VfuseInputError, match="at dim"):
        cg(*args)


def test_a_guard_for_cuda_executors_still_refuses_meta_and_reads_one_device() -> None:
    """Triton executors take CPU or CUDA tensors, all on one device (no GPU here: CPU and meta)."""
    guard = input_guard([(0, (2,), torch.float32), (1, (2,), torch.float32)], 2, cuda=True)
    a, b = torch.randn(2), torch.randn(2)
    assert guard((a, b)) == ()
    assert guard((a, torch.randn(2, device="meta"))) is None
    assert guard((a, b.double())) is None
    assert guard((a,)) is None
