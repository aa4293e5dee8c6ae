"""The generated flash-attention kernel against F.scaled_dot_product_attention (fp32, rtol 1e-4)."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch
import torch.nn.functional as F

from vfuse.codegen.cpp.attention import (
    AttentionSpec,
    FlashAttentionKernel,
    MaskKind,
    render_flash_attention,
    spec_for_sdpa,
)
from vfuse.codegen.cpp.toolchain import find_toolchain
from vfuse.context import Context
from vfuse.entry.trace import trace_aten
from vfuse.frontend.lower import lower
from vfuse.interp import run
from vfuse.ir import Op
from vfuse.passes import optimize
from vfuse.passes.attention import fuse_attention

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def _qkv(b: int, h: int, hkv: int, lq: int, lk: int, d: int, dv: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(lq * 1000 + lk)
    return [torch.randn(b, h, lq, d, generator=g), torch.randn(b, hkv, lk, d, generator=g),
            torch.randn(b, hkv, lk, dv, generator=g)]  # fmt: skip


@pytest.mark.parametrize(
    ("causal", "lq", "lk", "hkv"),
    [(False, 64, 64, 4), (True, 128, 128, 4), (True, 37, 53, 4), (True, 53, 37, 2), (False, 1, 77, 1), (True, 5, 5, 2)],
)
def test_matches_torch_without_mask(causal: bool, lq: int, lk: int, hkv: int) -> None:
    kern = FlashAttentionKernel(AttentionSpec(name="fa_plain", head_dim=32, causal=causal))
    q, k, v = _qkv(2, 4, hkv, lq, lk, 32, 32)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hkv != 4)
    _close(kern(q, k, v), want)


@pytest.mark.parametrize("mask_shape", [(2, 1, 1, 45), (1, 3, 29, 45), (29, 45), (2, 3, 29, 45)])
def test_additive_mask_broadcasts_without_copy(mask_shape: tuple[int, ...]) -> None:
    kern = FlashAttentionKernel(AttentionSpec(name="fa_add", head_dim=48, mask=MaskKind.ADDITIVE))
    q, k, v = _qkv(2, 3, 3, 29, 45, 48, 48)
    mask = torch.randn(mask_shape)
    mask[..., 3] = float("-inf")
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
    _close(kern(q, k, v, mask, scale=0.3), want)


def test_bool_mask_gqa_and_odd_value_dim() -> None:
    """Dv = 24 exercises the partial-vector tail; a fully masked row gives zeros like torch."""
    spec = AttentionSpec(name="fa_bool", head_dim=40, value_dim=24, mask=MaskKind.BOOL)
    q, k, v = _qkv(1, 6, 2, 70, 90, 40, 24)
    keep = torch.rand(1, 1, 70, 90) > 0.5
    keep[..., 7, :] = False
    got = FlashAttentionKernel(spec)(q, k, v, keep)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True)
    _close(got, want)
    assert torch.all(got[:, :, 7] == 0)


def test_rank_2_and_rank_5_operands() -> None:
    kern = FlashAttentionKernel(AttentionSpec(name="fa_ranks", head_dim=16, mask=MaskKind.ADDITIVE))
    q, k, v = (torch.randn(7, 16), torch.randn(9, 16), torch.randn(9, 16))
    mask = torch.randn(9)
    _close(kern(q, k, v, mask), F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    q, k, v = (torch.randn(2, 3, 4, 7, 16), torch.randn(2, 3, 4, 9, 16), torch.randn(2, 3, 4, 9, 16))
    mask = torch.randn(3, 1, 7, 9)
    _close(kern(q, k, v, mask), F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


def test_epilogue_hook_sees_value_and_indices() -> None:
    spec = AttentionSpec(name="fa_epi", head_dim=16, causal=True, epilogue="o = o * 2.0f + (float)(c + 100 * i);")
    q, k, v = _qkv(1, 2, 2, 9, 9, 16, 16)
    index = torch.arange(16) + 100 * torch.arange(9)[:, None]
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True) * 2 + index
    _close(FlashAttentionKernel(spec)(q, k, v), want)


@pytest.mark.parametrize(("lanes", "tile", "march"), [(16, 64, "-march=x86-64-v2"), (8, 16, "-march=x86-64-v3")])
def test_other_tiers(tmp_path, lanes: int, tile: int, march: str) -> None:  # type: ignore[no-untyped-def]
    """AVX-512's width built without AVX-512 (g++ splits the vectors), AVX2's as AVX2 builds it."""
    tc = find_toolchain()
    tc = dataclasses.replace(tc, flags=tuple(f for f in tc.flags if not f.startswith(("-march", "-mtune"))) + (march,))
    spec = AttentionSpec(name=f"fa_tier{lanes}", head_dim=20, causal=True, lanes=lanes, tile=tile)
    kern = FlashAttentionKernel(spec, tmp_path, tc)
    q, k, v = _qkv(1, 2, 2, 33, 33, 20, 20)
    _close(kern(q, k, v), F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_standalone_kernel_is_built_as_a_compiled_graph_builds_it() -> None:
    """FMA contraction on around the template, with the graph renderer's own pragmas: under the
    toolchain's -ffp-contract=off alone its tiles were mul + add with an accumulator spilled (1.35x slower)."""
    from vfuse.codegen.cpp.render import CONTRACT_END, CONTRACT_FMA

    spec = AttentionSpec(name="fa_fma", head_dim=16, lanes=8, tile=24)
    kern = FlashAttentionKernel(spec)
    assert kern.source.startswith(CONTRACT_FMA + "\n") and kern.source.rstrip().endswith(CONTRACT_END)
    assert render_flash_attention(spec) in kern.source
    q, k, v = _qkv(1, 2, 2, 7, 7, 16, 16)
    _close(kern(q, k, v), F.scaled_dot_product_attention(q, k, v))


def test_source_is_self_contained_and_memory_is_independent_of_length() -> None:
    spec = AttentionSpec(name="my_attn", head_dim=64, block_q=32, block_k=64)
    src = render_flash_attention(spec)
    assert 'extern "C" void my_attn(' in src.replace("VF_NAME", "my_attn")
    includes = [line for line in src.splitlines() if line.startswith("#include")]
    assert all("ATen" not in i and "torch" not in i for i in includes) and "#define VF_NAME my_attn" in src
    # qt 64x32 + st 64x32 + acc 32x64 + m, l, alpha 3x32: 6240 floats, whatever Lq and Lk are
    assert spec.workspace_bytes() == 6240 * 4 == FlashAttentionKernel(spec).workspace_bytes()
    with pytest.raises(ValueError):
        AttentionSpec(block_q=24)


def test_sdpa_node_from_the_rewrite_runs_on_the_kernel() -> None:
    """Pass + kernel: a traced GQA attention with a padding mask becomes SDPA; its kernel
    (spec from the node) gives the interpreter's and eager's result."""

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        k, v = (t[:, :, None].expand(2, 2, 2, 50, 32).reshape(2, 4, 50, 32) for t in (k, v))
        return torch.softmax(q @ k.transpose(-1, -2) * 0.2 + pad, -1) @ v

    q, k, v = _qkv(2, 4, 2, 50, 50, 32, 32)
    pad = torch.zeros(2, 1, 1, 50)
    pad[0, ..., -5:] = float("-inf")
    graph = fuse_attention(optimize(lower(trace_aten(fn, [q, k, v, pad]), Context())))
    (node,) = [n for n in graph.nodes if n.op is Op.SDPA]
    assert node.attrs["gqa"] and graph[node.inputs[1]].tensor_type.shape == (2, 2, 50, 32)
    kern = FlashAttentionKernel(spec_for_sdpa(graph, node, "fa_from_node"))
    got = kern(q, k, v, pad, scale=node.attrs["scale"])
    _close(got, run(graph, [q, k, v, pad])[0])
    _close(got, fn(q, k, v, pad))
