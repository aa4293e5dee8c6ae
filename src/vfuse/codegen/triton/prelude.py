"""Helper functions at the top of every generated Triton module.

Only `tl` builtins: libdevice is unusable (triton #8825), `tl.sum`/`tl.max`/`tl.zeros` and the
rest of triton's standard library are `@jit` functions the interpreter cannot call unless
TRITON_INTERPRET was set before triton was imported, and the interpreter has no `tl.tanh`.
Triton's unary minus is 0 - x (+0 for x = +0), so floats are negated as x * -1.0.
Each `_vf_*` function is wrapped by the loader (`module.py`) as the kernels are: interpreted
or jit-compiled. bf16 conversions are integer ops on the bits in the interpreter (its own
conversions truncate) and native `cvt` on a GPU (`_VF_INTERPRETED`, a constant the compiler
folds: the integer rounding was ~7 ALU ops per element, and a load's widening followed by a
rounding cancels only when both are conversions). Transcendentals without a builtin are fp32
approximations (tanh: Cephes; erf: Eigen's rational; atan: Cephes); the renderer refuses them
for fp64.

The RNG is vfuse's counter-based generator (`ir/defs/rng.py`, `vf_rand` in the C++ prelude):
the same seed, stream and element index give the same bits on every backend.
"""

from __future__ import annotations

INT64_MAX = 2**63 - 1

PRELUDE = '''
import triton.language as tl


def _vf_add(a, b):
    return a + b


def _vf_mul(a, b):
    return a * b


def _vf_max(a, b):
    return tl.maximum(a, b)


def _vf_min(a, b):
    return tl.minimum(a, b)


def _vf_max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


def _vf_min_nan(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


def _vf_flag(ptr, bad):
    """Record a fault (slot value 0) when any element of `bad` is set."""
    big = tl.full([], 9223372036854775807, tl.int64)
    tl.atomic_min(ptr, tl.reduce(tl.where(bad, tl.full([], 0, tl.int64), big), None, _vf_min))


def _vf_first(ptr, bad, pos):
    """Record the smallest position `pos` where `bad` is set (an index check's first offender)."""
    big = tl.full([], 9223372036854775807, tl.int64)
    tl.atomic_min(ptr, tl.reduce(tl.where(bad, pos.to(tl.int64), big), None, _vf_min))


def _vf_bf2f(x):
    if _VF_INTERPRETED:  # the interpreter's float conversions truncate: by the bits
        return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    return x.to(tl.float32)


def _vf_e4m3_2f(x):
    """fp8 e4m3fn -> fp32 by its bits, exact (0x7f / 0xff are NaN), signed zeros kept."""
    b = x.to(tl.uint8, bitcast=True).to(tl.uint32)
    e = (b >> 3) & 15
    m = b & 7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    v = tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)
    v = tl.where((b & 127) == 127, float("nan"), v)
    return tl.where(b >= 128, v * -1.0, v)


def _vf_e5m2_2f(x):
    """fp8 e5m2 -> fp32 by its bits, exact, inf and NaN included."""
    b = x.to(tl.uint8, bitcast=True).to(tl.uint32)
    e = (b >> 2) & 31
    m = b & 3
    normal = (((e + 112) << 23) | (m << 21)).to(tl.float32, bitcast=True)
    v = tl.where(e == 0, m.to(tl.float32) * 0.0000152587890625, normal)
    v = tl.where(e == 31, tl.where(m == 0, float("inf"), float("nan")), v)
    return tl.where(b >= 128, v * -1.0, v)


def _vf_bf_bits(x):
    """fp32 -> the upper 16 bits of the nearest bf16 (ties to even, NaN stays quiet NaN), as torch."""
    b = x.to(tl.uint32, bitcast=True)
    r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return tl.where(x != x, 0x7FC0, r)


def _vf_f2bf(x):
    if _VF_INTERPRETED:
        return _vf_bf_bits(x).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return x.to(tl.bfloat16)  # cvt.rn: ties to even (NaN: the canonical 0x7FFF, as CUDA's eager)


def _vf_round_bf(x):
    if _VF_INTERPRETED:
        return (_vf_bf_bits(x) << 16).to(tl.float32, bitcast=True)
    return x.to(tl.bfloat16).to(tl.float32)


def _vf_round_h(x):
    return x.to(tl.float16).to(tl.float32)


def _vf_mix32(x):
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


def _vf_key_lo(seed, stream_golden):
    return _vf_mix32(((seed + stream_golden) & 0xFFFFFFFF).to(tl.uint32))


def _vf_key_hi(seed, stream):
    return _vf_mix32((((seed >> 32) ^ stream) & 0xFFFFFFFF).to(tl.uint32))


def _vf_rand(lo, hi, idx):
    i = idx.to(tl.int64)
    h = _vf_mix32((i & 0xFFFFFFFF).to(tl.uint32) ^ lo)
    h = _vf_mix32(h ^ (i >> 32).to(tl.uint32) ^ hi)
    return (h >> 8).to(tl.float32) * (1.0 / 16777216.0)


def _vf_sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


def _vf_silu(x):
    return x / (1.0 + tl.exp(-x))


def _vf_tanh(x):
    a = tl.abs(x)
    z = x * x
    p = ((((-5.70498872745e-3 * z + 2.06390887954e-2) * z - 5.37397155531e-2) * z + 1.33314422036e-1) * z
         - 3.33332819422e-1) * z * x + x
    big = 1.0 - 2.0 / (tl.exp(2.0 * a) + 1.0)
    return tl.where(x == 0, x, tl.where(a < 0.625, p, tl.where(x < 0, big * -1.0, big)))


def _vf_erf(x):
    c = tl.minimum(tl.maximum(x, -4.0), 4.0)
    z = c * c
    p = -2.72614225801306e-10 * z + 2.77068142495902e-08
    p = p * z - 2.10102402082508e-06
    p = p * z - 5.69250639462346e-05
    p = p * z - 7.34990630326855e-04
    p = p * z - 2.95459980854025e-03
    p = p * z - 1.60960333262415e-02
    q = -1.45660718464996e-05 * z - 2.13374055278905e-04
    q = q * z - 1.68282697438203e-03
    q = q * z - 7.37332916720468e-03
    q = q * z - 1.42647390514189e-02
    return tl.where(x != x, x, c * p / q)


def _vf_gelu(x):
    return 0.5 * x * (1.0 + _vf_erf(x * 0.7071067811865476))


def _vf_gelu_tanh(x):
    return 0.5 * x * (1.0 + _vf_tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


def _vf_expm1(x):
    u = tl.exp(x)
    d = u - 1.0
    small = tl.where(u == 1.0, x, tl.where(d == -1.0, -1.0, d * x / tl.log(u)))
    return tl.where(tl.abs(x) < 0.5, small, d)


def _vf_log1p(x):
    u = 1.0 + x
    return tl.where((u == 1.0) | (x != x), x, tl.where(tl.abs(x) < 0.5, tl.log(u) * x / (u - 1.0), tl.log(u)))


def _vf_signbit(x):
    return x.to(tl.int32, bitcast=True) < 0


def _vf_trunc(x):
    return tl.where(x < 0, tl.ceil(x), tl.floor(x))


def _vf_round(x):
    """Round half to even, as torch.round (x - floor(x) is exact below 2^23)."""
    f = tl.floor(x)
    d = x - f
    odd = (f - 2.0 * tl.floor(f * 0.5)) != 0.0
    r = tl.where((d > 0.5) | ((d == 0.5) & odd), f + 1.0, f)
    r = tl.where(r == 0.0, x * 0.0, r)
    return tl.where(tl.abs(x) >= 8388608.0, x, r)


def _vf_atan(x):
    a = tl.abs(x)
    big = a > 2.414213562373095
    mid = a > 0.4142135623730950
    y0 = tl.where(big, 1.5707963267948966, tl.where(mid, 0.7853981633974483, 0.0))
    r = tl.where(big, -1.0 / a, tl.where(mid, (a - 1.0) / (a + 1.0), a))
    z = r * r
    p = (((8.05374449538e-2 * z - 1.38776856032e-1) * z + 1.99777106478e-1) * z - 3.33329491539e-1) * z * r + r
    y = y0 + p
    return tl.where(x < 0, y * -1.0, tl.where(x == 0, x, y))


def _vf_atan2(y, x):
    """atan2 with C's quadrants, signed zeros and infinities."""
    neg_y = _vf_signbit(y)
    pi = tl.where(neg_y, -3.141592653589793, 3.141592653589793)
    t = _vf_atan(y / x)
    t = tl.where(_vf_signbit(x), t + pi, t)
    inf_x = tl.abs(x) == float("inf")
    inf_y = tl.abs(y) == float("inf")
    corner = tl.where(_vf_signbit(x), 2.356194490192345, 0.7853981633974483)
    t = tl.where(inf_x & inf_y, tl.where(neg_y, corner * -1.0, corner), t)
    zero = tl.where(_vf_signbit(x), pi, y)
    t = tl.where((y == 0) & (x == x), zero, t)
    return tl.where((x != x) | (y != y), x + y, t)


def _vf_asin(x):
    return _vf_atan2(x, tl.sqrt_rn((1.0 - x) * (1.0 + x)))


def _vf_acos(x):
    return _vf_atan2(tl.sqrt_rn((1.0 - x) * (1.0 + x)), x)


def _vf_sinh(x):
    a = tl.abs(x)
    e = _vf_expm1(a)
    s = tl.where(a > 88.0, tl.exp(a - 0.6931471805599453), 0.5 * (e + e / (e + 1.0)))
    return tl.where(_vf_signbit(x), s * -1.0, s)


def _vf_cosh(x):
    a = tl.abs(x)
    return tl.where(a > 88.0, tl.exp(a - 0.6931471805599453), 0.5 * (tl.exp(a) + tl.exp(-a)))


def _vf_asinh(x):
    a = tl.abs(x)
    small = _vf_log1p(a + a * a / (1.0 + tl.sqrt_rn(1.0 + a * a)))
    s = tl.where(a > 268435456.0, tl.log(a) + 0.6931471805599453, small)
    return tl.where(_vf_signbit(x), s * -1.0, s)


def _vf_acosh(x):
    y = tl.where(x > 268435456.0, tl.log(x) + 0.6931471805599453, tl.log(x + tl.sqrt_rn((x - 1.0) * (x + 1.0))))
    return tl.where(x < 1.0, float("nan"), y)


def _vf_atanh(x):
    return 0.5 * (_vf_log1p(x) - _vf_log1p(-x))


def _vf_pow(a, b):
    """a ** b for floats: exp2(b * log2|a|), with torch's signs, zeros, ones, infinities and NaNs."""
    r = tl.exp2(b * tl.log2(tl.abs(a)))
    b_int = tl.floor(b) == b
    b_odd = b_int & (tl.abs(b) < 16777216.0) & ((b - 2.0 * tl.floor(b * 0.5)) != 0.0)
    neg = _vf_signbit(a)
    r = tl.where(neg & b_odd, r * -1.0, r)
    r = tl.where(neg & (a != 0) & ~b_int & (tl.abs(b) != float("inf")), float("nan"), r)
    r = tl.where((a == -1.0) & (tl.abs(b) == float("inf")), 1.0, r)
    return tl.where((a == 1.0) | (b == 0.0), 1.0, r)


def _vf_floordiv_i(a, b):
    """Integer floor division; 0 for a zero divisor (reported separately), INT_MIN // -1 wraps."""
    d = tl.where((b == 0) | (b == -1), 1, b)
    q = a // d
    r = a - q * d
    q = q - ((r != 0) & ((r < 0) != (d < 0))).to(q.dtype)
    return tl.where(b == -1, -a, tl.where(b == 0, 0, q))


def _vf_remainder_i(a, b):
    d = tl.where((b == 0) | (b == -1), 1, b)
    r = a % d
    r = tl.where((r != 0) & ((r < 0) != (d < 0)), r + d, r)
    return tl.where((b == 0) | (b == -1), 0, r)


def _vf_fmod_i(a, b):
    d = tl.where((b == 0) | (b == -1), 1, b)
    return tl.where((b == 0) | (b == -1), 0, a % d)


def _vf_floordiv_f(a, b):
    """torch's floor division of floats (c10's div_floor_floating)."""
    m = a % b
    div = (a - m) / b
    div = tl.where((m != 0) & ((b < 0) != (m < 0)), div - 1.0, div)
    fl = tl.floor(div)
    fl = tl.where(div - fl > 0.5, fl + 1.0, fl)
    q = a / b
    fl = tl.where(div != 0, fl, 0.0 * q)
    return tl.where(b == 0, q, fl)


def _vf_remainder_f(a, b):
    m = a % b
    return tl.where((m != 0) & ((b < 0) != (m < 0)), m + b, m)
'''
