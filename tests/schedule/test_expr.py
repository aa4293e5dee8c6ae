"""Index expressions: reshapes fold back to linear forms, loops merge only when contiguous."""

from __future__ import annotations

import math

from vfuse.schedule import expr
from vfuse.schedule.expr import Div, Lin, Mod, Var

VI, VJ = Var(0), Var(1)
SIZES = {0: 6, 1: 8}


def coords() -> tuple[Lin, Lin]:
    return Lin.var(VI), Lin.var(VJ)


def test_reshape_split_and_merge_fold_to_linear() -> None:
    flat = expr.row_major(coords(), (6, 8))
    assert flat == Lin.var(VI) * 8 + Lin.var(VJ)
    # (6, 8) -> (3, 2, 8): the inner coordinate stays linear, the split one is i // 2, i % 2
    a, b, c = expr.unflatten(flat, (3, 2, 8), SIZES)
    assert c == Lin.var(VJ)
    assert a == Lin(0, ((Div(Lin.var(VI), 2), 1),)) and b == Lin(0, ((Mod(Lin.var(VI), 2), 1),))
    # (6, 8) -> (48,) -> (6, 8) is the identity
    assert expr.unflatten(expr.row_major(expr.unflatten(flat, (48,), SIZES), (48,)), (6, 8), SIZES) == coords()


def test_non_contiguous_reshape_keeps_div_mod() -> None:
    flat = expr.row_major(coords(), (6, 8))
    a, b = expr.unflatten(flat, (4, 12), SIZES)
    assert any(isinstance(t, Div) for t, _ in a.terms) and any(isinstance(t, Mod) for t, _ in b.terms)
    for i in range(6):
        for j in range(8):
            env = {0: i, 1: j}
            assert (_eval(a, env), _eval(b, env)) == divmod(i * 8 + j, 12)


def _eval(e: Lin, env: dict[int, int]) -> int:
    total = e.const
    for atom, c in e.terms:
        if isinstance(atom, Var):
            v = env[atom.id]
        elif isinstance(atom, Div):
            v = _eval(atom.arg, env) // atom.divisor
        elif isinstance(atom, Mod):
            v = _eval(atom.arg, env) % atom.divisor
        else:
            v = min(max(_eval(atom.arg, env), atom.lo), atom.hi)
        total += c * v
    return total


def test_clamp_disappears_when_in_range() -> None:
    assert expr.clamp(Lin.var(VJ), 0, 7, SIZES) == Lin.var(VJ)
    assert expr.clamp(Lin.var(VJ) - 2, 0, 5, SIZES) != Lin.var(VJ) - 2


def test_merge_needs_matching_strides() -> None:
    contiguous = Lin.var(VI) * 8 + Lin.var(VJ)
    transposed = Lin.var(VJ) * 6 + Lin.var(VI)
    assert expr.can_merge(VI, VJ, 8, [contiguous])
    assert not expr.can_merge(VI, VJ, 8, [contiguous, transposed])
    assert expr.merge(contiguous, VI, VJ) == Lin.var(VJ)


def test_render() -> None:
    e = Lin.var(VI) * 8 + Lin.var(VJ) + 3
    assert expr.render(e, {0: "i0", 1: "i1"}) == "8 * i0 + i1 + 3"


def test_split_then_merged_reshape_is_linear_again() -> None:
    # GroupNorm reads [2, 16, 14, 14] as [2, 4, 4, 196]: the view's loops (g, c, k) address
    # the source at 784 g + 196 c + 14 (k // 14) + k % 14, which is 784 g + 196 c + k.
    g, c, k = Var(0), Var(1), Var(2)
    sizes = {0: 8, 1: 4, 2: 196}
    flat = expr.row_major((Lin.var(g), Lin.var(c), Lin.var(k)), (8, 4, 196))
    src = expr.unflatten(flat, (2, 16, 14, 14), sizes)
    assert expr.row_major(src, (2, 16, 14, 14)) == flat
    assert expr.can_merge(c, k, 196, [expr.row_major(src, (2, 16, 14, 14))])


def test_floordiv_keeps_a_possibly_negative_remainder_whole() -> None:
    # (14 i - j) // 14 is not i + (-j) // 14 in C++, whose division truncates toward zero.
    e = expr.floordiv(Lin.var(VI) * 14 - Lin.var(VJ), 14, SIZES)
    assert e == Lin(0, ((Div(Lin.var(VI) * 14 - Lin.var(VJ), 14), 1),))


def test_reshape_chains_match_python_arithmetic() -> None:
    # Every coordinate of a view of a view equals divmod arithmetic on the flat index, for
    # splits, merges and regroupings of dims (primes, ones, non-divisible sizes).
    chains = [((8, 4, 196), (2, 16, 14, 14)), ((6, 35), (3, 2, 5, 7)), ((12, 10), (8, 15)), ((5, 1, 9), (3, 15))]
    for view, src in chains:
        vs = [Var(i) for i in range(len(view))]
        sizes = {i: n for i, n in enumerate(view)}
        flat = expr.row_major(tuple(Lin.var(v) for v in vs), view)
        coords = expr.unflatten(flat, src, sizes)
        offset = expr.row_major(coords, src)
        for n in range(math.prod(view)):
            env, rest = {}, n
            for i in reversed(range(len(view))):
                env[i], rest = rest % view[i], rest // view[i]
            assert _eval(offset, env) == n, (view, src, env)
            assert [_eval(c, env) for c in coords] == list(_unravel(n, src)), (view, src, env)


def _unravel(n: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for size in reversed(shape):
        n, r = divmod(n, size)
        out.append(r)
    return tuple(reversed(out))
