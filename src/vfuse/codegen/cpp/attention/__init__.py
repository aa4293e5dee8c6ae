"""Flash attention for the C++ backend: a FlashAttention-2 style CPU kernel template.

`render_flash_attention(spec)` returns the C++ source; `FlashAttentionKernel(spec)` compiles
it (cached by content hash) and runs it on torch tensors. See docs/attention.md.
"""

from vfuse.codegen.cpp.attention.kernel import FlashAttentionKernel
from vfuse.codegen.cpp.attention.render import render_flash_attention, render_flash_attention_backward
from vfuse.codegen.cpp.attention.spec import AttentionSpec, MaskKind, spec_for_sdpa

__all__ = [
    "AttentionSpec",
    "FlashAttentionKernel",
    "MaskKind",
    "render_flash_attention",
    "render_flash_attention_backward",
    "spec_for_sdpa",
]
