"""The counter-based RNG ported to Triton integer ops (`_vf_rand` in codegen/triton/prelude.py)
gives the bits of the reference (ir/defs/rng.py) for any seed, stream and element index: negative
seeds, streams, and counters past 2^32 (the hi word), which no test tensor is big enough to reach."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vfuse.codegen.triton.module import load_module, module_path
from vfuse.codegen.triton.prelude import PRELUDE
from vfuse.ir.defs.rng import GOLDEN, MASK32, mix32

pytest.importorskip("triton", reason="triton is not installed (pip install 'vfuse[gpu]')")

KERNEL = """

def draw(idx, out, seeds):
    offs = tl.arange(0, 8)
    seed = tl.load(seeds + 0)
    stream = tl.load(seeds + 1)
    lo = _vf_key_lo(seed, tl.load(seeds + 2))
    hi = _vf_key_hi(seed, stream)
    tl.store(out + offs, _vf_rand(lo, hi, tl.load(idx + offs)))
"""


def _reference(seed: int, stream: int, idx: torch.Tensor) -> torch.Tensor:
    """ir/defs/rng.uniform at arbitrary element indices."""
    key = mix32(torch.tensor([(seed + stream * GOLDEN) & MASK32]))
    key_hi = mix32(torch.tensor([((seed >> 32) ^ stream) & MASK32]))
    h = mix32((idx & MASK32) ^ key)
    h = mix32(h ^ (idx >> 32) ^ key_hi)
    return (h >> 8).to(torch.float32) * (1.0 / (1 << 24))


@pytest.mark.parametrize("seed", [0, 12345, -1, -(2**63), 2**62 + 977])
@pytest.mark.parametrize("stream", [0, 3])
def test_rand_bits_match_the_reference(tmp_path: Path, seed: int, stream: int) -> None:
    module = load_module(module_path(PRELUDE + KERNEL, tmp_path), interpret=True)
    idx = torch.tensor([0, 1, 2, 999, 2**32 - 1, 2**32, 2**32 + 5, 2**40 + 3], dtype=torch.int64)
    out = torch.empty(8)
    seeds = torch.tensor([seed, stream, (stream * GOLDEN) & MASK32], dtype=torch.int64)
    module.draw[(1,)](idx, out, seeds)
    want = _reference(seed, stream, idx)
    assert torch.equal(out, want)
    if seed == 0 and stream == 0:
        from vfuse.ir.defs.rng import uniform

        assert torch.equal(out[:3], uniform(0, 0, 3))  # the reference itself, on the first indices
