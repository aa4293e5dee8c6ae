"""convolution_backward's data-gradient form (one GEMM + col2im, or one stride-1 conv per stride
phase) chosen by pricing both with the target's figures (frontend/conv_dgrad_cost.py), legality
aside; the choice is recorded on the form's contractions and shown by the report."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import vfuse
from vfuse.context import Context
from vfuse.entry.trace import trace_aten
from vfuse.frontend import lower_conv_backward
from vfuse.frontend.conv_dgrad_cost import FormChoice, Shapes, choose, gemm_s, illegal, phases_s
from vfuse.frontend.lower import lower
from vfuse.ir import Op
from vfuse.targets import get_target

aten = torch.ops.aten
# Fixed figures (a Zen 3's two cores): the structure below must not follow this machine's load.
TYPICAL = dataclasses.replace(get_target("cpu"), peak_f32=135e9, dram_bw=20e9, launch_s=2.5e-6, simd_lanes=8, cores=2)


def _shapes(n: int, c: int, h: int, w: int, co: int, k: tuple[int, int], s: int, p: int, groups: int = 1) -> Shapes:
    ho, wo = (h + 2 * p - k[0]) // s + 1, (w + 2 * p - k[1]) // s + 1
    return Shapes((n, co, ho, wo), (co, c // groups, *k), (h, w), (s, s), (p, p), (1, 1), groups)


def _form(sh: Shapes, target=TYPICAL) -> FormChoice:
    why = illegal(sh, lower_conv_backward.MAX_GEMM_TAPS)
    return FormChoice.legality(why) if why else choose(sh, target)


@pytest.mark.parametrize(
    ("case", "gemm"),
    [
        ((2, 128, 16, 16, 256, (3, 3), 2, 1), True),  # the measured strided case: 2.79 ms phases, 1.53 ms GEMM
        ((2, 3, 16, 16, 7, (3, 3), 2, 1), True),  # small: 9 kernels' launches against 2
        ((32, 64, 56, 56, 64, (3, 3), 1, 1), False),  # stride 1, a large plane: 9 col planes of 25 MiB
        ((1, 7, 9, 9, 5, (3, 3), 1, 1), False),  # stride 1, tiny: the col planes outweigh the weight copy
        ((32, 512, 7, 7, 512, (3, 3), 1, 1), True),  # 7-wide rows: the direct conv computes 9 columns each
    ],
)
def test_the_cheaper_form_is_chosen(case: tuple, gemm: bool) -> None:
    sh = _shapes(*case)
    choice = _form(sh)
    g, (p, kernels) = gemm_s(sh, TYPICAL), phases_s(sh, TYPICAL)
    assert choice.gemm is gemm and (g < p) is gemm
    assert (choice.gemm_s, choice.phases_s, choice.kernels) == (g, p, (2, kernels))
    assert kernels == (2 if sh.stride == (1, 1) else 2 * 4 + 1)


def test_the_figures_decide_not_the_geometry() -> None:
    """One geometry, two targets: launches dear, the GEMM form (2 kernels against 9); matrix
    flops nearly free and DRAM slow, the phase form (no col planes written and read back)."""
    sh = _shapes(1, 64, 56, 56, 64, (3, 3), 2, 1)
    assert _form(sh, dataclasses.replace(TYPICAL, launch_s=1e-3)).gemm
    assert not _form(sh, dataclasses.replace(TYPICAL, peak_f32=1e18, dram_bw=1e9)).gemm


@pytest.mark.parametrize(
    ("case", "why"),
    [
        ((2, 8, 9, 9, 6, (3, 3), 2, 1, 2), "groups 2"),
        ((2, 8, 9, 9, 6, (1, 1), 2, 0), "1x1"),
        ((1, 3, 15, 15, 7, (7, 7), 2, 3), "49 taps"),
    ],
)
def test_legality_keeps_the_phase_form(case: tuple, why: str) -> None:
    choice = _form(_shapes(*case))
    assert not choice.gemm and why in choice.why and choice.gemm_s == float("inf")


def _grad_input(s: int, p: int, groups: int = 1):
    def fn(go: torch.Tensor, x: torch.Tensor, wt: torch.Tensor) -> torch.Tensor:
        mask = [True, False, False]
        return aten.convolution_backward(go, x, wt, None, [s, s], [p, p], [1, 1], False, [0, 0], groups, mask)[0]

    return fn


CASES = [
    (2, 7, 11, 9, 5, (3, 3), 2, 1),  # strided, primes, a plane the stride does not divide
    (1, 5, 8, 8, 3, (3, 3), 1, 1),  # stride 1, batch 1
    (3, 4, 7, 7, 6, (2, 2), 2, 0),  # 2x2 stride 2: one tap per phase
    (2, 6, 9, 9, 4, (3, 3), 2, 1, 2),  # grouped: legality
]


# Launches and matrix flops dear, 16 lanes (no compact columns): the GEMM form wins everywhere legal.
GEMM_TARGET = dataclasses.replace(TYPICAL, launch_s=1.0, peak_f32=1.0, simd_lanes=16)


@pytest.mark.parametrize("target", [TYPICAL, GEMM_TARGET], ids=["typical", "gemm"])
def test_lowering_follows_the_choice_and_matches_eager(target, monkeypatch: pytest.MonkeyPatch) -> None:
    """The IR has exactly the chosen form's contractions (one MATMUL, or a CONV2D per phase some tap
    reaches), each recording the choice, and the compiled gradient matches eager."""
    # The form priced with `target`'s figures; the compilation plans for this machine.
    monkeypatch.setattr(lower_conv_backward, "choose", lambda sh, _machine: choose(sh, target))
    torch.manual_seed(0)
    forms = []
    for case in CASES:
        n, c, h, w, co, k, s, p, *g = case
        groups = g[0] if g else 1
        x, wt = torch.randn(n, c, h, w), torch.randn(co, c // groups, *k)
        go = torch.randn_like(F.conv2d(x, wt, None, s, p, 1, groups))
        fn = _grad_input(s, p, groups)
        graph = lower(trace_aten(fn, (go, x, wt)), Context())
        contractions = [node for node in graph.nodes if node.op in (Op.MATMUL, Op.CONV2D)]
        choice = _form(_shapes(n, c, h, w, co, k, s, p, groups), target)
        phases = sum(1 for rh in range(s) for rw in range(s) if _reached(rh, k[0], s, p) and _reached(rw, k[1], s, p))
        assert [node.op for node in contractions] == ([Op.MATMUL] if choice.gemm else [Op.CONV2D] * phases), case
        assert {node.attrs["form"] for node in contractions} == {choice}
        forms.append(choice.gemm)
        compiled = vfuse.compile(fn, (go, x, wt), strict=True)
        torch.testing.assert_close(compiled(go, x, wt), fn(go, x, wt), rtol=1e-4, atol=1e-4)
    # Typical figures: the stride-1 case keeps its conv (the col planes cost more than the weight
    # copy); launches and flops dear: every groups-1 case is one GEMM.
    assert forms == ([True, False, True, False] if target is TYPICAL else [True, True, True, False])


def _reached(r: int, k: int, s: int, p: int) -> bool:
    return any((r + p - t) % s == 0 for t in range(k))


def test_report_shows_the_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lower_conv_backward, "choose", lambda sh, _machine: choose(sh, TYPICAL))
    x, wt = torch.randn(2, 128, 16, 16), torch.randn(256, 128, 3, 3)
    go = torch.randn_like(F.conv2d(x, wt, None, 2, 1))
    report = vfuse.explain(_grad_input(2, 1), go, x, wt)
    want = str(_form(_shapes(2, 128, 16, 16, 256, (3, 3), 2, 1)))
    assert want.startswith("GEMM + col2im (predicted: GEMM + col2im ")
    assert report.lowering_choices == {"convolution_backward": want}
    assert report.to_json()["lowered_as"] == {"convolution_backward": want}
    text = " ".join(report.to_text(width=400, summary=True).split())
    assert f"lowered as %convolution_backward: {want}" in text
