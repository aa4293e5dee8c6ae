"""The output pool: a fresh tensor every call, storage reused only when nothing can reach it.

Each test does to an output what a caller may do (transpose it in place, resize it, make it
require grad, keep only its storage or a view) and checks that the next call's output has
the graph's shape, strides and values and that nothing the caller kept was overwritten.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import pytest
import torch
from tests.codegen.native_helpers import executor, inputs, scalar

from vfuse.ir import DType, GraphBuilder, Op
from vfuse.runtime.native import NativeExecutor
from vfuse.runtime.pool import OutputPool

SHAPE = (5, 7)  # not square: a transpose changes the shape


def _graph() -> object:
    b = GraphBuilder()
    (x,) = inputs(b, (SHAPE, DType.F32))
    return b.build([b.add(Op.ADD, [b.add(Op.MUL, [x, scalar(b, 2.0)]), scalar(b, 1.0)])])


@pytest.fixture(scope="module")
def run() -> Callable[[torch.Tensor], torch.Tensor]:
    ex = executor(_graph())  # type: ignore[arg-type]
    assert ex.call_plan is not None  # the lean path, where the pool matters most
    return lambda x: ex([x])[0]


@pytest.fixture(scope="module")
def static_ex() -> NativeExecutor:
    return executor(_graph(), static_outputs=True)  # type: ignore[arg-type]


def _expect(out: torch.Tensor, x: torch.Tensor) -> None:
    assert out.shape == SHAPE and out.stride() == (SHAPE[1], 1) and out.storage_offset() == 0
    assert not out.requires_grad and out.grad_fn is None and not out.is_inference()
    torch.testing.assert_close(out, x * 2 + 1)


def test_in_place_transpose_does_not_leak(run: Callable) -> None:
    x = torch.randn(SHAPE)
    run(x).t_()
    _expect(run(x), x)


def test_resize_does_not_shrink_the_next_output(run: Callable) -> None:
    x = torch.randn(SHAPE)
    run(x).resize_(2)
    _expect(run(x), x)
    run(x).resize_(1000)  # grows the storage: a new buffer, the pool must notice
    _expect(run(x), x)


def test_requires_grad_does_not_leak(run: Callable) -> None:
    x = torch.randn(SHAPE)
    run(x).requires_grad_()
    _expect(run(x), x)


def test_kept_storage_object_is_not_overwritten(run: Callable) -> None:
    x = torch.randn(SHAPE)
    storage = run(x).untyped_storage()
    kept = torch.empty(0).set_(storage, 0, SHAPE).clone()
    _expect(run(-x), -x)
    assert torch.equal(torch.empty(0).set_(storage, 0, SHAPE), kept)


def test_kept_view_is_not_overwritten(run: Callable) -> None:
    x = torch.randn(SHAPE)
    view = run(x)[1:, ::2]
    kept = view.clone()
    _expect(run(-x), -x)
    assert torch.equal(view, kept)


def test_storage_emptied_by_the_caller_is_not_reused(run: Callable) -> None:
    x = torch.randn(SHAPE)
    run(x).untyped_storage().resize_(0)
    _expect(run(x), x)


def test_each_call_returns_a_new_object_on_recycled_storage(run: Callable) -> None:
    x = torch.randn(SHAPE)
    out = run(x)
    ref, ptr = weakref.ref(out), out.data_ptr()
    del out
    assert ref() is None  # the pool did not keep the object it handed out
    again = run(x)
    assert again.data_ptr() == ptr  # but it did recycle the storage
    _expect(again, x)


def test_rebinding_in_a_loop_alternates_two_buffers(run: Callable) -> None:
    x = torch.randn(SHAPE)
    out = run(x)
    ptrs = set()
    for k in range(6):
        out = run(x + k)  # the previous output is still held while this call runs
        ptrs.add(out.data_ptr())
        _expect(out, x + k)
    assert len(ptrs) == 2


def test_outputs_made_in_inference_mode_serve_autograd_later(run: Callable) -> None:
    x = torch.randn(SHAPE)
    with torch.inference_mode():
        run(x)
    out = run(x)
    _expect(out, x)
    w = torch.ones(SHAPE, requires_grad=True)
    (w * out).sum().backward()  # an inference tensor could not be saved for backward
    torch.testing.assert_close(w.grad, x * 2 + 1)


def test_static_outputs_share_storage_but_not_metadata(static_ex: NativeExecutor) -> None:
    x = torch.randn(SHAPE)
    first = static_ex([x])[0]
    first.t_()
    first.requires_grad_()
    second = static_ex([x])[0]
    _expect(second, x)
    assert second.data_ptr() == first.data_ptr()  # documented: the next call overwrites
    second.resize_(2)
    _expect(static_ex([x])[0], x)


def test_pool_keys_and_dtypes_are_independent() -> None:
    pool = OutputPool()
    a = pool.get("a", (3,), torch.float32)
    b = pool.get("b", (0, 4), torch.int64)
    assert a.shape == (3,) and a.dtype == torch.float32 and b.shape == (0, 4) and b.dtype == torch.int64
    ptr = a.data_ptr()
    del a
    again = pool.get("a", (3,), torch.float32)
    assert again.data_ptr() == ptr and pool.get("b", (0, 4), torch.int64).shape == (0, 4)


def test_through_torch_compile_outputs_do_not_leak() -> None:
    torch._dynamo.reset()
    c = torch.compile(lambda x: torch.sigmoid(x) * 3, backend="vfuse")
    x = torch.randn(SHAPE)
    with torch.no_grad():
        c(x).t_()
        c(x).resize_(3)
        out = c(x)
    assert out.shape == SHAPE and out.stride() == (SHAPE[1], 1)
    torch.testing.assert_close(out, torch.sigmoid(x) * 3)
    storage = out.untyped_storage()
    kept = out.clone()
    del out
    with torch.no_grad():
        torch.testing.assert_close(c(-x), torch.sigmoid(-x) * 3)
    assert torch.equal(torch.empty(0).set_(storage, 0, SHAPE), kept)


def test_a_larger_buffer_serves_smaller_shapes_until_someone_holds_it() -> None:
    """A symbolic program's sizes share one pool: a smaller shape is a view of the buffer of a
    larger one, counted in the idle check (an output of one shape held blocks the others)."""
    pool = OutputPool()
    big = pool.get("y", (6, 5), torch.float32)
    ptr = big.data_ptr()
    del big
    small = pool.get("y", (3, 5), torch.float32)
    assert small.data_ptr() == ptr and small.shape == (3, 5) and small.stride() == (5, 1)
    assert small._base is None and small.storage_offset() == 0
    small.fill_(7.0)
    other = pool.get("y", (6, 5), torch.float32)  # `small` is held: the other buffer
    assert other.data_ptr() != ptr and other.shape == (6, 5)
    third = pool.get("y", (2, 5), torch.float32)  # both held: a new buffer, the oldest dropped
    assert third.data_ptr() not in (ptr, other.data_ptr())
    assert torch.equal(small, torch.full((3, 5), 7.0))  # nothing handed out was reused
    del small, other, third
    shapes = [pool.get("y", s, torch.float32).shape for s in ((1, 5), (2, 5), (6, 5), (2, 5), (0, 5))]
    assert shapes == [(1, 5), (2, 5), (6, 5), (2, 5), (0, 5)]
    wider = pool.get("y", (7, 5), torch.float32)  # more than any buffer holds: a new one
    assert wider.shape == (7, 5) and wider.untyped_storage().nbytes() == 7 * 5 * 4
    assert pool.get("y", (2, 5), torch.int32).dtype == torch.int32  # another dtype: not a view


def test_storage_moved_through_a_smaller_shape_is_not_reused() -> None:
    pool = OutputPool()
    ptr = pool.get("y", (8,), torch.float32).data_ptr()
    out = pool.get("y", (3,), torch.float32)
    assert out.data_ptr() == ptr
    out.resize_(1000)  # grows the shared storage: its bytes moved
    moved = out.data_ptr()
    del out
    again = pool.get("y", (3,), torch.float32)
    assert again.shape == (3,) and again.data_ptr() not in (ptr, moved)
