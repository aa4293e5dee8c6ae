"""A train-mode Conv-BatchNorm-ReLU step (issue 14, `vfuse bench --train`'s conv_bn_relu): outputs,
running statistics and every parameter's and the input's gradient against eager at odd shapes,
strides 1 and 2; the BatchNorm row kernels, which read or store the ReLU's bool mask, vectorize
(bytes loaded or stored had left them scalar: 6 ms instead of 0.5 ms at 8x32x28x28)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from tests.codegen.vectorization import simd_loops_vectorized
from tests.models.train_zoo import fix_typical_target
from tests.training.conv_steps import ConvBnRelu, train_steps

import vfuse
from vfuse.schedule.kernel import Kernel, Walk


def _train_steps(shape: tuple[int, ...], cout: int, stride: int) -> tuple[ConvBnRelu, vfuse.VfuseBackend]:
    torch.manual_seed(0)
    return train_steps(ConvBnRelu(shape[1], cout, stride=stride).train(), shape)


@pytest.mark.parametrize(
    ("shape", "cout", "stride"),
    [((3, 5, 11, 7), 7, 1), ((2, 4, 9, 13), 3, 2), ((1, 1, 5, 5), 1, 1), ((5, 3, 8, 8), 6, 2)],
)
def test_conv_bn_relu_training_matches_eager(shape: tuple[int, ...], cout: int, stride: int) -> None:
    _train_steps(shape, cout, stride)


def _row_kernel_lines(source: str, kernels: list[Kernel]) -> list[range]:
    lines = source.splitlines()
    spans = []
    for k in kernels:
        start = next(i for i, line in enumerate(lines) if re.match(rf"static void {k.name}\(", line))
        end = next(i for i in range(start, len(lines)) if lines[i] == "}")
        spans.append(range(start + 1, end + 2))  # 1-based lines of the function
    return spans


@pytest.mark.parametrize("target", ["measured", "typical"])
def test_batchnorm_row_kernels_with_the_relu_mask_vectorize(
    target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also under fixed typical figures (20 GB/s, 100 G flop/s): keeping the 1-byte mask beats
    recomputing the BatchNorm, whose batch statistics are a pass over the conv output of their own
    (entry/remat.pass_bytes; counting its flops only, the cut recomputed it and kept no mask)."""
    if target == "typical":
        fix_typical_target(monkeypatch)
    _, backend = _train_steps((4, 8, 12, 12), 8, 1)
    masks = 0
    for g in backend.compiled:
        program, source = g.executor.program, g.executor.source
        rows = [k for s in program.segments for k in s.kernels if isinstance(k, Kernel) and k.walk is Walk.ROWS]
        assert rows, "the BatchNorm statistics are one row kernel per graph"
        masks += "uint8_t*)p_" in source  # the mask as bytes (codegen/cpp/writer.py)
        simd, vectorized = simd_loops_vectorized(source, tmp_path)
        for span in _row_kernel_lines(source, rows):
            mine = {p for p in simd if p in span}
            assert mine and mine <= vectorized, f"row kernel loops {sorted(mine - vectorized)} scalar"
    assert masks == 2  # the forward stores the ReLU mask as bytes, the backward loads it
