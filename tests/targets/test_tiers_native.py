"""Every kernel family compiled through vfuse.compile at every instruction-set tier this CPU runs
(`VFUSE_TEST_ISA=avx2,...` narrows them), against eager torch; a lower tier's library holds no
instruction of a higher one."""

from __future__ import annotations

import re
import subprocess

import pytest
import torch
from tests.kernel_families import FAMILIES, RANDOM, tiers_here

import vfuse
from vfuse.codegen.cpp.toolchain import build_library, find_toolchain
from vfuse.context import Options
from vfuse.targets.isa import LANES, Isa

# Registers a tier's code must not name: AVX-512's zmm and mask registers, AVX's ymm, and at every
# tier MMX's (g++ used them without `emms` at plain x86-64, which left the x87 stack full: NaN later).
FORBIDDEN = {Isa.GENERIC: r"%[yz]?mm\d|%k[1-7]\b", Isa.AVX2: r"%z?mm\d|%k[1-7]\b", Isa.AVX512: r"%mm\d"}


@pytest.mark.parametrize("tier", tiers_here(), ids=lambda t: t.value)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_at_every_tier_matches_eager(family: str, tier: Isa) -> None:
    fn, inputs = FAMILIES[family]
    compiled = vfuse.compile(fn, inputs, backend="cpp", isa=tier.value)
    program = compiled.compiled.executor.program
    assert (program.isa, program.vector_width) == (tier, LANES[tier])
    torch.manual_seed(0)
    got = compiled(*inputs)
    if family in RANDOM:
        reference = vfuse.compile(fn, inputs, backend="interp")
        torch.manual_seed(0)
        want = reference(*inputs)
        assert 0.2 < float((got == 1).float().mean()) < 0.4  # dropped elements: 0 + 1
    else:
        want = fn(*inputs)
    torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
    if tier in FORBIDDEN:
        _assert_no_higher_tier_code(compiled.compiled.executor.source, tier)


def _assert_no_higher_tier_code(source: str, tier: Isa) -> None:
    so = build_library(source, Options.from_env().cache_dir, find_toolchain(isa=tier))  # a cache hit: the same key
    asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(so)], capture_output=True, text=True).stdout
    assert asm, f"objdump printed nothing for {so}"
    found = re.search(FORBIDDEN[tier], asm)
    assert found is None, f"{tier.value} library {so} uses {found.group(0) if found else ''}"
