"""Benchmark workloads: small fp32 inference modules plus deterministic input factories.

Each workload is memory-bound on purpose: vertical fusion wins by not writing intermediates
to DRAM, so the figure of merit is achieved bandwidth against the *minimal bytes* (inputs and
parameters read once, outputs written once), which `minimal_bytes` computes from the actual
tensors so a new workload cannot get it wrong by hand.

To add a workload: write a module and a `_build_x(quick)` factory, then add one line to
`WORKLOADS` at the bottom. Compute-bound workloads (GEMM, conv, attention) live in
`workloads_compute.py`; their registry lines set a looser relative tolerance (a different
summation order in a K-long dot product moves the last bits) and `frozen` (weights compiled in).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vfuse.bench import workloads_compute as wc
from vfuse.bench.checks import FLOAT_ATOL, FLOAT_RTOL

# Full sizes follow the issue; quick sizes keep the row length (so reductions stay realistic)
# and cut rows, so tests and CI exercise the same code paths in well under a second.
_ROWS_FULL = 8192
_ROWS_QUICK = 64
_SEED = 0


@dataclass(frozen=True)
class Instance:
    """One concrete benchmark case: the module and the inputs it is called with."""

    module: nn.Module
    inputs: tuple[Tensor, ...]


@dataclass(frozen=True)
class Workload:
    """A named workload; `build(quick)` makes a fresh instance (fresh module, fresh inputs).

    rtol / atol: the float check's tolerances against eager for this workload.
    frozen: contenders that can compile parameters in as constants do so (vfuse freeze=True,
        Inductor freezing), as for deployed inference; see `Contender.prepare_frozen`.
    """

    name: str
    description: str
    build: Callable[[bool], Instance]
    rtol: float = FLOAT_RTOL
    atol: float = FLOAT_ATOL
    frozen: bool = False


# Compute-bound checks: eager, oneDNN/MKL and generated kernels sum K-long dot products in
# different orders, so fp32 results differ by more than the memory-bound workloads' 1e-5.
_GEMM_RTOL = 1e-4


def _compute(name: str, description: str, build: Callable[[bool], wc.Built], frozen: bool = True) -> Workload:
    """A `workloads_compute` workload: its (module, inputs) factory as an Instance factory,
    the compute-bound tolerance, and frozen weights unless it has none (attention)."""
    return Workload(name, description, lambda quick: Instance(*build(quick)), rtol=_GEMM_RTOL, frozen=frozen)


def _rows(quick: bool) -> int:
    return _ROWS_QUICK if quick else _ROWS_FULL


def _randn(gen: torch.Generator, *shape: int, scale: float = 1.0, shift: float = 0.0) -> Tensor:
    return torch.randn(*shape, generator=gen) * scale + shift


def _flat_tensors(value: Any) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _flat_tensors(v)]
    return []


def minimal_bytes(instance: Instance, outputs: Any) -> int:
    """Bytes an ideal kernel must move: every input, parameter and buffer once, every output once."""
    state = [*instance.module.parameters(), *instance.module.buffers()]
    reads = sum(t.nbytes for t in (*instance.inputs, *state))
    writes = sum(t.nbytes for t in _flat_tensors(outputs))
    return reads + writes


# --- chain: a pure elementwise chain with two inputs --------------------------------------


class Chain(nn.Module):
    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        return torch.relu(x + y) * 0.5 + torch.sigmoid(x)


def _build_chain(quick: bool) -> Instance:
    gen = torch.Generator().manual_seed(_SEED)
    n = 1 << 16 if quick else 1 << 24
    return Instance(Chain(), (_randn(gen, n), _randn(gen, n)))


# --- transpose_add: a pointwise chain reading one operand transposed ----------------------


class TransposeAdd(nn.Module):
    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        return torch.relu(x.t() + y) * torch.sigmoid(y)


def _build_transpose_add(quick: bool) -> Instance:
    gen = torch.Generator().manual_seed(_SEED)
    rows, cols = (256, 512) if quick else (2048, 4096)
    return Instance(TransposeAdd(), (_randn(gen, cols, rows), _randn(gen, rows, cols)))


# --- normalizations: row reductions with elementwise epilogues -----------------------------


def _affine_layernorm(dim: int, gen: torch.Generator) -> nn.LayerNorm:
    # Non-trivial affine parameters, so a compiler that drops them fails the check.
    norm = nn.LayerNorm(dim)
    with torch.no_grad():
        norm.weight.copy_(_randn(gen, dim, scale=0.1, shift=1.0))
        norm.bias.copy_(_randn(gen, dim, scale=0.1))
    return norm


class LnGelu(nn.Module):
    def __init__(self, dim: int, gen: torch.Generator) -> None:
        super().__init__()
        self.norm = _affine_layernorm(dim, gen)

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(self.norm(x))


class LayerNormOnly(nn.Module):
    def __init__(self, dim: int, gen: torch.Generator) -> None:
        super().__init__()
        self.norm = _affine_layernorm(dim, gen)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(x)


class RmsSilu(nn.Module):
    """silu(RMSNorm(x)), RMSNorm written out so every compiler sees the same primitive ops."""

    def __init__(self, dim: int, gen: torch.Generator, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(_randn(gen, dim, scale=0.1, shift=1.0))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        return F.silu(normed)


class Softmax(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return torch.softmax(x, -1)


def _build_ln_gelu(quick: bool) -> Instance:
    gen = torch.Generator().manual_seed(_SEED)
    return Instance(LnGelu(1024, gen), (_randn(gen, _rows(quick), 1024),))


def _build_layernorm_small(quick: bool) -> Instance:
    gen = torch.Generator().manual_seed(_SEED)
    return Instance(LayerNormOnly(256, gen), (_randn(gen, _rows(quick), 256),))


def _build_rms_silu(quick: bool) -> Instance:
    gen = torch.Generator().manual_seed(_SEED)
    return Instance(RmsSilu(1024, gen), (_randn(gen, _rows(quick), 1024),))


def _build_softmax(quick: bool) -> Instance:
    gen = torch.Generator().manual_seed(_SEED)
    return Instance(Softmax(), (_randn(gen, _rows(quick), 1024, scale=3.0),))


# --- gelu_residual: elementwise with a residual input and a per-channel scale ---------------


class GeluResidual(nn.Module):
    def __init__(self, dim: int, gen: torch.Generator) -> None:
        super().__init__()
        # Per-channel scale (layer-scale style) so the broadcast path is exercised too.
        self.scale = nn.Parameter(_randn(gen, dim, scale=0.1, shift=1.0))

    def forward(self, x: Tensor, residual: Tensor) -> Tensor:
        return (F.gelu(x) + residual) * self.scale


def _build_gelu_residual(quick: bool) -> Instance:
    gen = torch.Generator().manual_seed(_SEED)
    rows = _rows(quick)
    return Instance(GeluResidual(4096, gen), (_randn(gen, rows, 4096), _randn(gen, rows, 4096)))


# --- dequant_quant: int8 in, int8 out, fp32 math in between --------------------------------


class DequantGeluQuant(nn.Module):
    """Affine int8 dequantize -> gelu -> requantize (round half to even, clamp to int8).

    Written with plain tensor ops (not torch.quantize_per_tensor) so every contender traces
    the same graph; torch.round rounds half to even, as quantizers do.
    """

    def __init__(self, in_scale: float, in_zero: int, out_scale: float, out_zero: int) -> None:
        super().__init__()
        self.in_scale, self.in_zero = in_scale, in_zero
        self.out_scale, self.out_zero = out_scale, out_zero

    def forward(self, q: Tensor) -> Tensor:
        x = (q.to(torch.float32) - self.in_zero) * self.in_scale
        y = torch.round(F.gelu(x) / self.out_scale) + self.out_zero
        return torch.clamp(y, -128, 127).to(torch.int8)


def _build_dequant_quant(quick: bool) -> Instance:
    gen = torch.Generator().manual_seed(_SEED)
    q = torch.randint(-128, 128, (_rows(quick), 4096), generator=gen, dtype=torch.int8)
    return Instance(DequantGeluQuant(0.05, 3, 0.04, -5), (q,))


# --- tiny_graph: per-call overhead ---------------------------------------------------------


class TinyGraph(nn.Module):
    """50 pointwise/reduction ops on 64-element tensors: time is all per-call overhead."""

    iterations = 10  # 5 ops per iteration: mul, add, tanh, mean, sub

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        for _ in range(self.iterations):
            x = torch.tanh(x * y + 0.5)
            x = x - x.mean(-1, keepdim=True)
        return x


def _build_tiny_graph(quick: bool) -> Instance:
    # Already tiny: quick mode changes nothing, so the quick test measures the real thing.
    gen = torch.Generator().manual_seed(_SEED)
    return Instance(TinyGraph(), (_randn(gen, 64), _randn(gen, 64)))


WORKLOADS: Mapping[str, Workload] = MappingProxyType(
    {
        w.name: w
        for w in (
            Workload("chain", "relu(x+y)*0.5+sigmoid(x), 16M elements", _build_chain),
            Workload("transpose_add", "relu(x.t()+y)*sigmoid(y) 2048x4096", _build_transpose_add),
            Workload("ln_gelu", "gelu(layer_norm(x)) 8192x1024, affine", _build_ln_gelu),
            Workload("layernorm_small", "layer_norm(x) 8192x256, affine", _build_layernorm_small),
            Workload("rms_silu", "silu(rmsnorm(x)) 8192x1024", _build_rms_silu),
            Workload("softmax", "softmax(x, -1) 8192x1024", _build_softmax),
            Workload("gelu_residual", "(gelu(x)+r)*s 8192x4096", _build_gelu_residual),
            Workload("dequant_quant", "int8 dequant -> gelu -> quant 8192x4096", _build_dequant_quant),
            Workload("tiny_graph", "50 ops on 64 elements (per-call overhead)", _build_tiny_graph),
            _compute("linear_gelu", "gelu(linear(x)) 2048x1024 -> 4096", wc.build_linear_gelu),
            _compute("linear_gelu_smallk", "gelu(linear(x)) 16384x64 -> 4096", wc.build_linear_gelu_smallk),
            _compute("qlinear", "int8 gelu(linear(x)) 2048x1024 -> 4096, (de)quantize fused", wc.build_qlinear),
            _compute("conv_bn_relu", "relu(bn(conv3x3(x))) 8x64x56x56, eval BN", wc.build_conv_bn_relu),
            _compute("attention", "softmax(q@k^T*s)@v 4x8x1024x64, written out", wc.build_attention, frozen=False),
            _compute(
                "causal_attention",
                "softmax(masked_fill(q@k^T*s, ~tril, -inf))@v 2x12x2048x64, written out",
                wc.build_causal_attention,  # frozen: the tril buffer becomes a constant causal mask
            ),
            _compute("gpt2_block", "pre-LN GPT-2 block, B=4 T=512 d=768 12 heads", wc.build_gpt2_block),
        )
    }
)


def select(names: list[str] | None) -> list[Workload]:
    """Workloads by name in the order given (all, in registry order, when names is None)."""
    if names is None:
        return list(WORKLOADS.values())
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise ValueError(f"unknown workload(s) {', '.join(unknown)}; known: {', '.join(WORKLOADS)}")
    return [WORKLOADS[n] for n in names]
