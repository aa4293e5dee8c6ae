"""All shape arithmetic of the IR lives here.

Shapes are tuples of sizes: ints, or `SymSize` expressions over a dynamic graph's symbols
(ir/sym.py), which compute like ints; a rule that compares sizes proves the answer or guards it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from vfuse.ir.sym import SymSize

Shape = tuple[int, ...]


class ShapeError(ValueError):
    """A shape rule was violated; the message names the shapes involved."""


def check_shape(shape: Shape) -> None:
    if not isinstance(shape, tuple) or not all(isinstance(d, int | SymSize) and d >= 0 for d in shape):
        raise ShapeError(f"a shape must be a tuple of non-negative ints, got {shape!r}")


def numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


def normalize_dim(dim: int, rank: int) -> int:
    """Map a possibly negative dim into [0, rank); rank 0 accepts dim 0 and -1 like torch."""
    bound = max(rank, 1)
    if not -bound <= dim < bound:
        raise ShapeError(f"dim {dim} out of range for rank {rank}")
    return dim % bound


def normalize_dims(dims: Sequence[int] | None, rank: int) -> tuple[int, ...]:
    """Sorted, de-duplicated non-negative dims; None or () means all dims (torch's convention).
    A 0-d tensor has no axes: its dim 0 / -1 (which torch accepts) reduces over nothing."""
    if dims is None or len(dims) == 0:
        return tuple(range(rank))
    axes = {normalize_dim(d, rank) for d in dims}
    return tuple(sorted(axes)) if rank else ()


def broadcast(*shapes_: Shape) -> Shape:
    """Numpy/torch broadcasting of any number of shapes."""
    rank = max((len(s) for s in shapes_), default=0)
    out: list[int] = []
    for i in range(rank):
        size = 1
        for d in (s[len(s) - rank + i] for s in shapes_ if len(s) - rank + i >= 0):
            if d == 1 or d == size:  # compared, not hashed: a symbolic size proves or guards it
                continue
            if size != 1:
                raise ShapeError(f"shapes {list(shapes_)} do not broadcast (dim {i}: {size} vs {d})")
            size = d
        out.append(size)
    return tuple(out)


def reduce(shape: Shape, dims: tuple[int, ...], keepdim: bool) -> Shape:
    if keepdim:
        return tuple(1 if i in dims else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in dims)


def resolve_reshape(src: Shape, target: Sequence[int]) -> Shape:
    """Resolve one -1 in a reshape target and check the element count is unchanged."""
    target = list(target)
    if target.count(-1) > 1:
        raise ShapeError(f"reshape target {tuple(target)} has more than one -1")
    known = numel([d for d in target if d != -1])
    if -1 in target:
        if known == 0 or numel(src) % known:
            raise ShapeError(f"cannot reshape {src} to {tuple(target)}")
        target[target.index(-1)] = numel(src) // known
    if numel(target) != numel(src):
        raise ShapeError(f"cannot reshape {src} ({numel(src)} elements) to {tuple(target)}")
    return tuple(target)


def permute(shape: Shape, perm: Sequence[int]) -> Shape:
    if sorted(perm) != list(range(len(shape))):
        raise ShapeError(f"{tuple(perm)} is not a permutation of the dims of {shape}")
    return tuple(shape[p] for p in perm)


def expand(shape: Shape, target: Sequence[int]) -> Shape:
    """torch.expand: -1 keeps a size; size-1 dims (and new leading dims) may grow."""
    lead = len(target) - len(shape)
    if lead < 0:
        raise ShapeError(f"cannot expand {shape} to fewer dims {tuple(target)}")
    out = []
    for i, t in enumerate(target):
        s = shape[i - lead] if i >= lead else None
        if t == -1:
            if s is None:
                raise ShapeError(f"-1 not allowed for new leading dim in expand to {tuple(target)}")
            t = s
        if s is not None and s != t and s != 1:
            raise ShapeError(f"cannot expand {shape} to {tuple(target)}")
        out.append(t)
    return tuple(out)


def slice_len(size: int, start: int, end: int, step: int) -> int:
    """Length of range(start, end, step) after clamping start/end into [0, size] like torch."""
    if step <= 0:
        raise ShapeError(f"slice step must be positive, got {step}")
    start, end = (min(max(v + size if v < 0 else v, 0), size) for v in (start, end))
    return max(0, (end - start + step - 1) // step)


def clamp_slice(size: int, start: int, end: int) -> tuple[int, int]:
    start, end = (min(max(v + size if v < 0 else v, 0), size) for v in (start, end))
    return start, max(start, end)


def cat(shapes_: Sequence[Shape], dim: int) -> Shape:
    first = shapes_[0]
    for s in shapes_[1:]:
        if len(s) != len(first) or any(a != b for i, (a, b) in enumerate(zip(s, first)) if i != dim):
            raise ShapeError(f"cannot concatenate {list(shapes_)} along dim {dim}")
    return first[:dim] + (sum(s[dim] for s in shapes_),) + first[dim + 1 :]


def matmul(a: Shape, b: Shape) -> Shape:
    """Batched matmul of rank >= 2 operands with broadcast batch dims."""
    if len(a) < 2 or len(b) < 2:
        raise ShapeError(f"matmul operands need rank >= 2, got {a} and {b}")
    if a[-1] != b[-2]:
        raise ShapeError(f"matmul inner dims differ: {a} @ {b}")
    return broadcast(a[:-2], b[:-2]) + (a[-2], b[-1])


def conv_out(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    out = (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1
    if out < 0:
        raise ShapeError(f"convolution window larger than padded input ({size}+2*{padding})")
    return out


def conv2d(x: Shape, w: Shape, stride: Shape, padding: Shape, dilation: Shape, groups: int) -> Shape:
    if len(x) != 4 or len(w) != 4:
        raise ShapeError(f"conv2d expects NCHW input and OIHW weight, got {x} and {w}")
    if x[1] != w[1] * groups or w[0] % groups:
        raise ShapeError(f"conv2d channels mismatch: input {x}, weight {w}, groups {groups}")
    h = conv_out(x[2], w[2], stride[0], padding[0], dilation[0])
    wd = conv_out(x[3], w[3], stride[1], padding[1], dilation[1])
    # torch's convention (eager, meta and fake alike): no input channels, no output channels.
    return (x[0], 0 if isinstance(x[1], int) and x[1] == 0 else w[0], h, wd)
