"""Written-out training attention with dropout, as HF's eager attention and GPT-2-style blocks write it,
for the fuzz of entry/attention_rewrite.py's matcher (tests/fuzz/test_fuzz_attention_dropout.py).

`Form` is one drawn way of writing `softmax(q k^T scale [+ mask]) -> dropout -> @ v`: scale as a product,
a division (by a number or `torch.full([], sqrt(d))`) or folded into q; a boolean mask by masked_fill or
where; an additive mask (a module buffer, or ALiBi built in the graph) added before or after the scale;
causal by masked_fill of a tril built in the graph or sliced from a buffer; grouped-query heads by
repeat_interleave or expand + reshape (HF's repeat_kv); dropout as nn.Dropout, F.dropout or torch.dropout;
the softmax as torch.softmax, F.softmax (dim=-1 or 3), Tensor.softmax. `breaker` names a change that
makes it NOT exactly vfuse's attention_dropout (dropout after @ v, softmax over dim -2, a factor after
the softmax, dropout on the scores, two dropouts, P read elsewhere, a run-time additive mask).

`Written(form, seeded)` runs it; with `seeded` (a `SeededDropout`) each dropout draws entry/dropout.py's
mask (the graph's seed from torch's generator, stream k for the k-th dropout): what vfuse computes for
a written-out form it does not rewrite. `reference` is what vfuse must compute for a form it rewrites:
`attention_dropout` called with the SDPA arguments the form means.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from hypothesis import strategies as st
from torch import nn

from vfuse.entry.dropout import attention_dropout, uniform
from vfuse.ir.defs.random import SEED_HIGH

BREAKERS = ("after_pv", "softmax_dim", "scale_after", "on_scores", "two_dropouts", "probs_used", "runtime_additive")
MAX_L = 40  # the causal buffer's side


@dataclass(frozen=True)
class Form:
    b: int
    hkv: int
    group: int
    lq: int
    lk: int
    d: int
    dv: int
    p: float
    scale: str  # mul | div | div_full | q | none
    factor: float  # the scale's factor (div: divides by 1 / factor)
    mask: str  # none | fill | where | additive_buffer | alibi
    mask_first: bool  # an additive mask added before the scale
    causal: str  # none | tril | tril_buffer
    gqa: str  # repeat_interleave | expand (group > 1)
    dropout: str  # module | F | torch
    softmax: str  # torch | F | F_dim3 | method
    kt: str  # transpose | transpose23 | mT
    seed: int  # of the inputs and masks
    breaker: str = ""  # "" (rewritable) or one of BREAKERS

    @property
    def heads(self) -> int:
        return self.hkv * self.group

    @property
    def is_causal(self) -> bool:
        """Whether the rewrite's call is is_causal (a causal mask alone), not a combined mask."""
        return self.causal != "none" and self.mask == "none"

    def shape(self) -> tuple[int, ...]:
        """(batch x heads, Lq, Lk, D, Dv), as attention_rewrite.costs takes it."""
        return (self.b * self.heads, self.lq, self.lk, self.d, self.dv)


@st.composite
def forms(draw: Any, breakers: tuple[str, ...] = ("",)) -> Form:
    group = draw(st.sampled_from([1, 2, 3]))
    return Form(
        b=draw(st.integers(1, 2)),
        hkv=draw(st.integers(1, 2)),
        group=group,
        lq=draw(st.sampled_from([1, 5, 17, 31])),
        lk=draw(st.sampled_from([1, 7, 23, 40])),
        d=draw(st.sampled_from([3, 8, 13])),
        dv=draw(st.sampled_from([3, 8, 13])),
        p=draw(st.sampled_from([0.1, 0.5])),
        scale=draw(st.sampled_from(["mul", "div", "div_full", "q", "none"])),
        factor=draw(st.sampled_from([0.125, 0.3, 1 / 7])),
        mask=draw(st.sampled_from(["none", "fill", "where", "additive_buffer", "alibi"])),
        mask_first=draw(st.booleans()),
        causal=draw(st.sampled_from(["none", "tril", "tril_buffer"])),
        gqa=draw(st.sampled_from(["repeat_interleave", "expand"])),
        dropout=draw(st.sampled_from(["module", "F", "torch"])),
        softmax=draw(st.sampled_from(["torch", "F", "F_dim3", "method"])),
        kt=draw(st.sampled_from(["transpose", "transpose23", "mT"])),
        seed=draw(st.integers(0, 2**31 - 1)),
        breaker=draw(st.sampled_from(breakers)),
    )


def inputs(form: Form) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(form.seed)
    f = form
    sizes = [(f.b, f.heads, f.lq, f.d), (f.b, f.hkv, f.lk, f.d), (f.b, f.hkv, f.lk, f.dv)]
    return [torch.randn(s, generator=g).requires_grad_() for s in sizes]


def masks(form: Form) -> tuple[torch.Tensor, torch.Tensor]:
    """(boolean keep-mask [b, 1, lq, lk] keeping key 0 of every row, additive mask [1, h, lq, lk])."""
    g = torch.Generator().manual_seed(form.seed + 1)
    keep = torch.rand(form.b, 1, form.lq, form.lk, generator=g) > 0.3
    keep[..., 0] = True  # a fully masked row is NaN in eager
    return keep, torch.randn(1, form.heads, form.lq, form.lk, generator=g)


def alibi(lq: int, lk: int) -> torch.Tensor:
    i, j = torch.arange(lq, dtype=torch.float32), torch.arange(lk, dtype=torch.float32)
    return -(i[:, None] - j[None, :]).abs() * 0.5


class SeededDropout:
    """entry/dropout.py's training dropout run eagerly: the seed is the first draw, stream k the k-th call."""

    def __init__(self) -> None:
        self.seed: torch.Tensor | None = None
        self.stream = 0

    def __call__(self, x: torch.Tensor, p: float) -> torch.Tensor:
        if self.seed is None:
            self.seed = torch.randint(0, SEED_HIGH, (), dtype=torch.int64)
        keep = uniform(self.seed, x.shape, self.stream) >= p
        self.stream += 1
        return x * keep.to(x.dtype) * (1.0 / (1.0 - p))


class Written(nn.Module):
    """The form, written out; with `seeded`, its dropouts draw entry/dropout.py's masks (eagerly)."""

    def __init__(self, form: Form, seeded: SeededDropout | None = None) -> None:
        super().__init__()
        self.form, self.seeded = form, seeded
        self.drop = nn.Dropout(form.p)
        keep, additive = masks(form)
        self.keep = keep  # a run-time input of the graph (a closure constant, not a buffer)
        self.register_buffer("additive", additive)
        self.register_buffer("tril", torch.ones(MAX_L, MAX_L, dtype=torch.bool).tril())
        self.runtime_additive = additive.clone()

    def dropout(self, x: torch.Tensor) -> torch.Tensor:
        f = self.form
        if self.seeded is not None:
            return self.seeded(x, f.p)
        if f.dropout == "module":
            return self.drop(x)
        return F.dropout(x, p=f.p, training=True) if f.dropout == "F" else torch.dropout(x, f.p, True)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        f = self.form
        k, v = _repeat(f, k), _repeat(f, v)
        if f.scale == "q":
            q = q * f.factor
        kt = {"transpose": lambda: k.transpose(-2, -1), "transpose23": lambda: k.transpose(2, 3), "mT": lambda: k.mT}
        s = torch.matmul(q, kt[f.kt]()) if f.softmax == "torch" else q @ kt[f.kt]()
        if f.breaker == "on_scores":
            s = self.dropout(s)  # before the -inf fills (-inf * 0 is NaN)
        s = self._boolean(self._causal(self._additive(_scaled(f, self._additive(s, True)), False)))
        probs = _softmax(f, s)
        if f.breaker == "scale_after":
            probs = probs * 0.5
        if f.breaker not in ("after_pv", "on_scores"):
            probs = self.dropout(probs)
        if f.breaker == "two_dropouts":
            probs = self.dropout(probs)
        out = probs @ v
        if f.breaker == "after_pv":
            out = self.dropout(out)
        if f.breaker == "probs_used":
            out = out + probs.mean(-1, keepdim=True)
        return out

    def _additive(self, s: torch.Tensor, first: bool) -> torch.Tensor:
        f = self.form
        if first != f.mask_first:
            return s
        if f.breaker == "runtime_additive":
            return s + self.runtime_additive
        if f.mask == "additive_buffer":
            return s + self.additive
        return s + alibi(f.lq, f.lk) if f.mask == "alibi" else s

    def _boolean(self, s: torch.Tensor) -> torch.Tensor:
        if self.form.mask == "fill":
            return s.masked_fill(~self.keep, float("-inf"))
        return torch.where(self.keep, s, float("-inf")) if self.form.mask == "where" else s

    def _causal(self, s: torch.Tensor) -> torch.Tensor:
        f = self.form
        if f.causal == "tril":
            return s.masked_fill(~torch.ones(f.lq, f.lk, dtype=torch.bool).tril(), float("-inf"))
        return s.masked_fill(~self.tril[: f.lq, : f.lk], float("-inf")) if f.causal == "tril_buffer" else s


def _repeat(f: Form, x: torch.Tensor) -> torch.Tensor:
    if f.group == 1:
        return x
    if f.gqa == "repeat_interleave":
        return x.repeat_interleave(f.group, dim=1)
    b, h, n, d = x.shape
    return x[:, :, None].expand(b, h, f.group, n, d).reshape(b, h * f.group, n, d)


def _scaled(f: Form, s: torch.Tensor) -> torch.Tensor:
    if f.scale == "mul":
        return s * f.factor
    if f.scale == "div":
        return s / (1 / f.factor)
    return s / torch.full([], 1 / f.factor) if f.scale == "div_full" else s


def _softmax(f: Form, s: torch.Tensor) -> torch.Tensor:
    dim = -2 if f.breaker == "softmax_dim" else -1
    if f.softmax == "torch":
        return torch.softmax(s, dim)
    if f.softmax == "F_dim3":
        return F.softmax(s, dim=dim % 4)
    return F.softmax(s, dim=dim) if f.softmax == "F" else s.softmax(dim)


def scale_of(f: Form) -> float:
    """The SDPA scale the form means (folded into q: that q is the call's q, scale 1 after it)."""
    return 1.0 if f.scale in ("none", "q") else f.factor


def reference(f: Form, module: Written):
    """`attention_dropout` with the SDPA arguments of the form: the masks combined as the rewrite does
    (one boolean or additive mask alone as it is; several: additive, -inf where a keep-mask is False)."""
    keep, additive = module.keep, module.additive
    bias = {"additive_buffer": additive, "alibi": alibi(f.lq, f.lk)}.get(f.mask)
    keeps = [keep] if f.mask in ("fill", "where") else []
    if f.causal != "none" and f.mask != "none":
        keeps.append(torch.ones(f.lq, f.lk, dtype=torch.bool).tril())
    if bias is not None and f.mask_first:
        bias = bias * scale_of(f)  # (s + bias) * c = s * c + bias * c
    mask: torch.Tensor | None = None
    if bias is None and len(keeps) == 1:
        mask = keeps[0]
    elif bias is not None or keeps:
        mask = (bias if bias is not None else 0.0) + sum(torch.where(k, 0.0, -math.inf) for k in keeps)

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q = q * f.factor if f.scale == "q" else q
        return attention_dropout(q, k, v, mask, f.p, f.is_causal, scale_of(f), enable_gqa=True)

    return attend
