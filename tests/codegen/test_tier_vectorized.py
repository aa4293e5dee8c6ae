"""The hand-written kernel families are vector code on every tier this CPU runs, not a scalar
fallback: each tier's library is disassembled and the hot functions checked for packed arithmetic on
the tier's registers (GEMM and conv micro-kernels keep the whole register tile of the schedule,
flash attention's score tile too, byte tables shuffle bytes). Numerics per tier: test_tiers_native.py."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable

import pytest
import torch
from tests.kernel_families import CONTRACTIONS, tiers_here

import vfuse
from vfuse.codegen.cpp.toolchain import build_library, find_toolchain
from vfuse.context import Options
from vfuse.schedule.kernel import ContractionKernel
from vfuse.targets.cpu import machine_flags
from vfuse.targets.isa import X86, Isa, machine_arch

pytestmark = pytest.mark.skipif(
    machine_arch() != X86 or shutil.which("objdump") is None, reason="x86 disassembly checks (needs objdump)"
)

# The packed multiply(-add) each tier's fp32 tiles must be made of, on that tier's registers.
PACKED = {Isa.GENERIC: r"\tmulps\s+%xmm", Isa.AVX2: r"\tvfmadd\d+ps\s+.*%ymm", Isa.AVX512: r"\tvfmadd\d+ps\s+.*%zmm"}


def _functions(fn: Callable, inputs: tuple[torch.Tensor, ...], tier: Isa) -> tuple[dict[str, str], list]:
    """(disassembly per symbol of the compiled library, the program's contraction kernels)."""
    compiled = vfuse.compile(fn, inputs, backend="cpp", isa=tier.value)
    executor = compiled.compiled.executor
    torch.testing.assert_close(compiled(*inputs), fn(*inputs), rtol=2e-3, atol=2e-3)
    so = build_library(executor.source, Options().cache_dir, find_toolchain(isa=tier))  # a cache hit
    asm = subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", str(so)], capture_output=True, text=True).stdout
    blocks = re.findall(r"^[0-9a-f]+ <([^\n]*)>:\n(.*?)(?=\n\n|\Z)", asm, re.M | re.S)
    kernels = [k for k in executor.program.kernels if isinstance(k, ContractionKernel)]
    return dict(blocks), kernels


def _packed(functions: dict[str, str], name: str, tier: Isa) -> int:
    bodies = [body for sym, body in functions.items() if name in sym]
    assert bodies, f"no function {name} in the library (have {sorted(functions)[:20]})"
    return max(len(re.findall(PACKED[tier], body)) for body in bodies)


@pytest.mark.parametrize("tier", [t for t in tiers_here() if t in PACKED], ids=lambda t: t.value)
@pytest.mark.parametrize("family", ["linear_bias_gelu", "conv3x3"])
def test_micro_kernel_holds_the_register_tile(family: str, tier: Isa) -> None:
    functions, kernels = _functions(*CONTRACTIONS[family], tier)
    (k,) = kernels
    # Fully unrolled: one packed FMA (SSE2: multiply) per accumulator of the mr x nr tile and k step.
    # The GEMM's micro-kernel is its own function; the direct conv's (a step is its 9 taps) is inlined.
    # The direct conv computes fewer than mr output channels as one tail block of that many rows.
    name, steps = (f"vg_ukr_{k.mr}x{k.nr}_w{k.vector}", 1) if family.startswith("linear") else ("", 9)
    rows = k.mr if family.startswith("linear") else min(k.mr, k.out_shape[1])
    assert _packed(functions, name, tier) >= steps * rows * k.nr // k.vector


@pytest.mark.parametrize("tier", [t for t in tiers_here() if t in PACKED], ids=lambda t: t.value)
def test_attention_scores_are_vector_tiles(tier: Isa) -> None:
    functions, (k,) = _functions(*CONTRACTIONS["attention_causal"], tier)
    # 4 keys x the tile's vectors, in vf_attn::scores_chunk or, where g++ inlined it, the function it is in.
    assert _packed(functions, "vf_attn", tier) >= 4 * k.nr // k.vector


@pytest.mark.parametrize("tier", [t for t in tiers_here() if t is not Isa.GENERIC], ids=lambda t: t.value)
def test_byte_table_shuffles_bytes(tier: Isa) -> None:
    functions, _ = _functions(*CONTRACTIONS["byte_table"], tier)
    vbmi = tier is Isa.AVX512 and "avx512vbmi" in machine_flags()
    shuffle = r"\tvperm[it]2b\s" if vbmi else r"\tvpshufb\s+.*%ymm"
    # vf_table_bytes is inlined into the kernel: the library's only byte shuffles are its own.
    assert any(re.search(shuffle, body) for body in functions.values()), f"no {shuffle} at {tier.value}"
