"""IR graphs mirroring the seed's fusion patterns as the frontend decomposes them.

Each builder returns a verified Graph; the tests plan them and check the exact kernel structure.
"""

from __future__ import annotations

from vfuse.fusion import FusionPlan
from vfuse.fusion.forms import Illegal, classify
from vfuse.fusion.libm import scalar_call
from vfuse.fusion.rules import Rule
from vfuse.ir import DType, Graph, GraphBuilder, Kind, Op, TensorType, verify
from vfuse.targets import Target
from vfuse.targets.isa import Isa

F32 = DType.F32


def _input(b: GraphBuilder, index: int, shape: tuple[int, ...], dtype: DType = F32, name: str = "") -> str:
    return b.add(Op.INPUT, name=name or f"in{index}", index=index, type=TensorType(shape, dtype))


def _scalar(b: GraphBuilder, value: float, dtype: DType = F32, name: str = "c") -> str:
    return b.add(Op.FULL, name=name, value=value, shape=(), dtype=dtype)


def elementwise_chain(n: int = 1 << 16) -> Graph:
    """add -> relu -> mul."""
    b = GraphBuilder()
    x, y, z = (_input(b, i, (n,)) for i in range(3))
    a = b.add(Op.ADD, (x, y), name="add")
    r = b.add(Op.RELU, (a,), name="relu")
    m = b.add(Op.MUL, (r, z), name="mul")
    return verify(b.build([m]))


def layer_norm(rows: int = 512, d: int = 768, eps: float = 1e-5) -> Graph:
    """mean, centre, variance, rsqrt, scale, shift: the decomposition of F.layer_norm."""
    b = GraphBuilder()
    x, w, bias = _input(b, 0, (rows, d)), _input(b, 1, (d,)), _input(b, 2, (d,))
    s = b.add(Op.SUM, (x,), name="sum", axes=(1,), keepdim=True)
    mean = b.add(Op.MUL, (s, _scalar(b, 1 / d, name="inv_d")), name="mean")
    xc = b.add(Op.SUB, (x, mean), name="xc")
    sq = b.add(Op.MUL, (xc, xc), name="sq")
    s2 = b.add(Op.SUM, (sq,), name="sum2", axes=(1,), keepdim=True)
    var = b.add(Op.MUL, (s2, _scalar(b, 1 / d, name="inv_d2")), name="var")
    ve = b.add(Op.ADD, (var, _scalar(b, eps, name="eps")), name="var_eps")
    r = b.add(Op.RSQRT, (ve,), name="rstd")
    y = b.add(Op.MUL, (xc, r), name="norm")
    yw = b.add(Op.MUL, (y, w), name="scaled")
    out = b.add(Op.ADD, (yw, bias), name="out")
    return verify(b.build([out]))


def rms_norm_silu(rows: int = 512, d: int = 1024, eps: float = 1e-6) -> Graph:
    b = GraphBuilder()
    x, w = _input(b, 0, (rows, d)), _input(b, 1, (d,))
    sq = b.add(Op.MUL, (x, x), name="sq")
    s = b.add(Op.SUM, (sq,), name="sum", axes=(1,), keepdim=True)
    ms = b.add(Op.MUL, (s, _scalar(b, 1 / d, name="inv_d")), name="ms")
    r = b.add(Op.RSQRT, (b.add(Op.ADD, (ms, _scalar(b, eps, name="eps")), name="ms_eps"),), name="rstd")
    y = b.add(Op.MUL, (b.add(Op.MUL, (x, r), name="norm"), w), name="scaled")
    out = b.add(Op.SILU, (y,), name="silu")
    return verify(b.build([out]))


def linear_gelu(m: int = 512, k: int = 768, n: int = 3072) -> Graph:
    b = GraphBuilder()
    x, w, bias = _input(b, 0, (m, k)), _input(b, 1, (k, n)), _input(b, 2, (n,))
    mm = b.add(Op.MATMUL, (x, w), name="mm")
    h = b.add(Op.ADD, (mm, bias), name="bias_add")
    out = b.add(Op.GELU, (h,), name="gelu", approximate="none")
    return verify(b.build([out]))


def conv_bn_relu(n: int = 8, c: int = 64, hw: int = 56) -> Graph:
    """conv2d, then inference BatchNorm as a per-channel scale and shift, then ReLU."""
    b = GraphBuilder()
    x, w = _input(b, 0, (n, c, hw, hw)), _input(b, 1, (c, c, 3, 3))
    scale, shift = _input(b, 2, (c, 1, 1)), _input(b, 3, (c, 1, 1))
    y = b.add(Op.CONV2D, (x, w), name="conv", stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1)
    bn = b.add(Op.ADD, (b.add(Op.MUL, (y, scale), name="bn_scale"), shift), name="bn_shift")
    out = b.add(Op.RELU, (bn,), name="relu")
    return verify(b.build([out]))


def attention_sdpa(bh: int = 16, t: int = 256, d: int = 64) -> Graph:
    b = GraphBuilder()
    q, k, v = (_input(b, i, (bh, t, d)) for i in range(3))
    out = b.add(Op.SDPA, (q, k, v), name="sdpa", scale=None, causal=False, gqa=False)
    return verify(b.build([out]))


def attention_written_out(bh: int = 16, t: int = 256, d: int = 64) -> Graph:
    """q @ k^T * scale -> softmax (amax, sub, exp, sum, div) -> @ v."""
    b = GraphBuilder()
    q, kt, v = _input(b, 0, (bh, t, d)), _input(b, 1, (bh, d, t)), _input(b, 2, (bh, t, d))
    s = b.add(Op.MUL, (b.add(Op.MATMUL, (q, kt), name="qk"), _scalar(b, d**-0.5, name="scale")), name="scores")
    mx = b.add(Op.AMAX, (s,), name="amax", axes=(2,), keepdim=True)
    e = b.add(Op.EXP, (b.add(Op.SUB, (s, mx), name="shifted"),), name="exp")
    p = b.add(Op.DIV, (e, b.add(Op.SUM, (e,), name="sum", axes=(2,), keepdim=True)), name="probs")
    out = b.add(Op.MATMUL, (p, v), name="pv")
    return verify(b.build([out]))


def gelu_dropout_residual(n: int = 1 << 18, p: float = 0.1) -> Graph:
    b = GraphBuilder()
    x, res = _input(b, 0, (n,)), _input(b, 1, (n,))
    seed = b.add(Op.RNG_SEED, name="seed")
    g = b.add(Op.GELU, (x,), name="gelu", approximate="tanh")
    keep = b.add(
        Op.GE, (b.add(Op.RAND, (seed,), name="rand", shape=(n,), stream=0), _scalar(b, p, name="p")), name="keep"
    )
    mask = b.add(Op.CAST, (keep,), name="mask", dtype=F32)
    dropped = b.add(
        Op.MUL, (b.add(Op.MUL, (g, mask), name="masked"), _scalar(b, 1 / (1 - p), name="inv_keep")), name="dropped"
    )
    out = b.add(Op.ADD, (dropped, res), name="residual")
    return verify(b.build([out]))


def dequant_op_quant(n: int = 1 << 18) -> Graph:
    """int8 -> f32 (sub zero point, mul scale) -> relu -> back to int8 (div, round, add, clamp)."""
    b = GraphBuilder()
    q = _input(b, 0, (n,), DType.I8)
    x = b.add(Op.CAST, (q,), name="to_f32", dtype=F32)
    zp, sc = _scalar(b, 3.0, name="zp"), _scalar(b, 0.05, name="scale")
    deq = b.add(Op.MUL, (b.add(Op.SUB, (x, zp), name="sub_zp"), sc), name="dequant")
    y = b.add(Op.RELU, (deq,), name="relu")
    r = b.add(Op.ROUND, (b.add(Op.DIV, (y, sc), name="div_scale"),), name="round")
    shifted = b.add(Op.ADD, (r, zp), name="add_zp")
    lo, hi = _scalar(b, -128.0, name="qmin"), _scalar(b, 127.0, name="qmax")
    clamped = b.add(Op.MINIMUM, (b.add(Op.MAXIMUM, (shifted, lo), name="clamp_lo"), hi), name="clamp_hi")
    out = b.add(Op.CAST, (clamped,), name="to_i8", dtype=DType.I8)
    return verify(b.build([out]))


SINGLE_KERNEL_PATTERNS = {
    "elementwise_chain": elementwise_chain,
    "layer_norm": layer_norm,
    "rms_norm_silu": rms_norm_silu,
    "linear_gelu": linear_gelu,
    "conv_bn_relu": conv_bn_relu,
    "attention_sdpa": attention_sdpa,
    "gelu_dropout_residual": gelu_dropout_residual,
    "dequant_op_quant": dequant_op_quant,
}


# A fixed CPU (2 cores, AVX-512, Zen-like caches) so that plans do not depend on the noisy
# measurement of the machine the tests run on.
FIXED_CPU = Target(
    name="cpu-fixed",
    kind="cpu",
    cores=2,
    simd_lanes=16,
    l1_bytes=48 * 1024,
    l2_bytes=1024 * 1024,
    l3_bytes=32 * 1024 * 1024,
    smem_per_sm=0,
    regs_per_thread=32,
    regs_per_sm=32,
    dram_bw=20e9,
    cache_bw=100e9,
    peak_f32=2e11,
    peak_f16=2e11,
    peak_bf16=4e11,
    peak_i8=8e11,
    vector_f32=1.6e11,
    launch_s=2e-6,
    max_threads=2,
)


def check_plan(plan: FusionPlan) -> None:
    """Invariants every plan must satisfy: each compute node runs, each kernel is a legal form,
    reads only values written by earlier kernels (or graph sources), and every graph output is
    written."""
    g = plan.graph
    covered = {n for grp in plan.groups for n in grp.nodes}
    assert covered == {n.name for n in g.compute_nodes}
    written: set[str] = set()
    for grp in plan.groups:
        nodes = [g[n] for n in grp.nodes]
        form = classify(nodes, grp.outputs, g)
        assert not isinstance(form, Illegal), form
        if grp.label == Rule.LIBRARY_POINTWISE.value:  # one scalar-libm node torch runs (generic: the widest set)
            assert form.label == "pointwise" and len(nodes) == 1 and scalar_call(nodes[0], Isa.GENERIC)
        else:
            assert form.label == grp.label
        for i in grp.inputs:
            assert g[i].kind is Kind.SOURCE or i in written, f"kernel {grp.id} reads %{i} before it is written"
        written |= set(grp.outputs)
    assert {o for o in g.outputs if g[o].kind is not Kind.SOURCE} <= written


def labels(plan: FusionPlan) -> list[str]:
    return [grp.label for grp in plan.groups]


def rules(plan: FusionPlan, accepted: bool) -> set[str]:
    return {d.rule for d in plan.decisions if d.accepted is accepted}
