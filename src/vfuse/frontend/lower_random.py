"""Random lowerings: dropout, bernoulli, rand/rand_like and uniform become RAND nodes.

Every RAND reads the graph's one RNG_SEED (drawn per call from torch's generator, so
torch.manual_seed governs vfuse too) with its own stream number. The numbers differ from
eager's (a different generator), never the distribution. Explicit generators go to torch.
A training graph's seed draws (`randint(0, SEED_HIGH, ())`, entry/dropout.py) are RNG_SEED nodes too:
the same torch draw, so the same seed, one per call in graph order.
"""

from __future__ import annotations

import torch
import torch.fx

from vfuse.frontend.emitter import Emitter, bind
from vfuse.frontend.errors import Fallback
from vfuse.frontend.lower_source import full
from vfuse.frontend.registry import lowers
from vfuse.ir import DType, Op
from vfuse.ir.defs.random import SEED_HIGH

aten = torch.ops.aten


def rand(em: Emitter, shape: tuple[int, ...]) -> str:
    """Uniform f32 in [0, 1) of `shape`, from a fresh stream."""
    return em.emit(Op.RAND, (em.seed(),), shape=shape, stream=em.stream())


def _no_generator(node: torch.fx.Node) -> None:
    if bind(node).get("generator") is not None:
        raise Fallback("an explicit torch.Generator")


@lowers(aten.native_dropout.default)
def lower_native_dropout(em: Emitter, node: torch.fx.Node) -> tuple[str, str]:
    """(x * keep * 1/(1-p), keep) with keep = rand >= p, i.e. kept with probability 1 - p."""
    a = bind(node)
    x, p = em.value(a["input"]), float(a["p"])
    t = em.ttype(x)
    if a["train"] is False or p == 0.0:
        return x, full(em, True, t.shape, DType.BOOL)
    keep = em.emit(Op.GE, (rand(em, t.shape), em.scalar(p, DType.F32)))
    scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)  # torch's scale, so p == 1 gives zeros
    y = em.emit(Op.MUL, (em.emit(Op.MUL, (x, em.cast(keep, t.dtype))), em.scalar(scale, t.dtype)))
    return y, keep


@lowers(aten.bernoulli.p)
def lower_bernoulli_p(em: Emitter, node: torch.fx.Node) -> str:
    _no_generator(node)
    out = em.out_type()
    hit = em.emit(Op.LT, (rand(em, out.shape), em.scalar(bind(node)["p"], DType.F32)))
    return em.cast(hit, out.dtype)


@lowers(aten.bernoulli.default)
def lower_bernoulli(em: Emitter, node: torch.fx.Node) -> str:
    """Each element is 1 with the probability given by the input's element."""
    _no_generator(node)
    out = em.out_type()
    probs = em.cast(em.value(bind(node)["self"]), DType.F32)
    return em.cast(em.emit(Op.LT, (rand(em, out.shape), probs)), out.dtype)


@lowers(aten.rand.default, aten.rand_like.default, aten.rand.generator)
def lower_rand(em: Emitter, node: torch.fx.Node) -> str:
    _no_generator(node)
    out = em.out_type()
    if not out.dtype.is_float:
        raise Fallback("rand of a non-float dtype")
    return em.cast(rand(em, out.shape), out.dtype)


@lowers(aten.uniform.default)
def lower_uniform(em: Emitter, node: torch.fx.Node) -> str:
    """from + (to - from) * u, u uniform in [0, 1)."""
    _no_generator(node)
    a = bind(node)
    out = em.out_type()
    u = em.cast(rand(em, out.shape), out.dtype)
    scaled = em.emit(Op.MUL, (u, em.scalar(a["to"] - a["from"], out.dtype)))
    return em.emit(Op.ADD, (scaled, em.scalar(a["from"], out.dtype)))


@lowers(aten.randint.low)
def lower_seed_draw(em: Emitter, node: torch.fx.Node) -> str:
    """`randint(0, SEED_HIGH, (), dtype=int64)` on the CPU generator, the seed entry/dropout.py draws for
    training dropout and attention_dropout: a fresh RNG_SEED (its draw is that very call, so
    torch.manual_seed gives the seed eager gives). Not em.seed(): every randint is a draw of its own."""
    a = bind(node)
    device = a.get("device")
    exact = a["low"] == 0 and a["high"] == SEED_HIGH and list(a["size"]) == [] and em.out_type().dtype is DType.I64
    if not exact or (device is not None and torch.device(device).type != "cpu"):
        raise Fallback("randint other than a seed's draw (0, 2**62, (), int64, cpu)")
    if _torch_drew_before(em):
        # Seeds are drawn when a call starts, torch's random ops when their step runs: after one of
        # those the seed would come from another point of the generator's sequence than in eager.
        raise Fallback("a seed's draw after a random op run through torch (kept in torch's order)")
    return em.emit(Op.RNG_SEED)


def _torch_drew_before(em: Emitter) -> bool:
    """Whether a node lowered so far runs a random torch op (an OPAQUE of a nondeterministic_seeded op)."""
    for n in em.nodes:
        if n.op is Op.OPAQUE:
            target = n.attrs["call"].target
            target = getattr(target, "target", target)  # TensorItems wraps multi-result ops
            if isinstance(target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in target.tags:
                return True
    return False
