"""Races between the GEMM driver's threads, each called repeatedly (a race shows in some calls only).

The driver's cooperative path (driver.py: batch count not a multiple of the threads and under 4
per thread, or one batch entry) shares buffers between threads; whatever a thread owns in one
column panel may be another's in the next panel or the next batch entry, so the panel loop
needs a barrier there. tests/fuzz/test_fuzz_threads.py stresses whole graphs the same way.
"""

from __future__ import annotations

import torch

from vfuse.codegen.cpp.gemm import Blocking, Epilogue, GemmSpec, render_gemm
from vfuse.codegen.cpp.gemm.prepack import HEADER, padded_n

# A prepacked B (a frozen weight: no B panel to pack, so no barrier per panel) with a double C:
# partial sums over K's three blocks go to the shared fp32 workspace. One MC block (M 48) on two
# threads splits each panel's slivers between them: 3 slivers of 16 per panel of 48 (thread 0
# two, thread 1 one, so thread 1 runs ahead), 2 in the short last panel (20 columns: one each),
# whose sliver 1 is thread 1's where it was thread 0's in the panel before.
PREPACKED_WS = GemmSpec.from_shapes(
    "pp_ws", (7, 48, 384), (164, 384), trans_b=True, blocking=Blocking(6, 16, 48, 128, 48, 16), prepack=True
)
TO_DOUBLE = Epilogue("to_double", store="static_cast<double>(v)", out_ctype="double")


def test_prepacked_workspace_across_panels_and_batch_entries(build, call) -> None:
    """Without a barrier where the slivers are dealt anew, a thread on the next panel (or batch
    entry) overwrote workspace partial sums another thread still added its K blocks to."""
    lib = build(render_gemm(PREPACKED_WS, TO_DOUBLE))
    torch.manual_seed(7)
    b = torch.randn(164, 384)
    region = torch.zeros(HEADER + 4 * 384 * padded_n(164, 16), dtype=torch.uint8)
    for rep in range(60):
        a = torch.randn(7, 48, 384)
        out = torch.full((7, 48, 164), float("nan"), dtype=torch.float64)
        call(lib, "pp_ws", a, b, out, region, nthreads=2)
        where = f"call {rep}"
        torch.testing.assert_close(out, (a @ b.T).double(), rtol=1e-4, atol=2e-4, msg=lambda m, w=where: f"{w}: {m}")
