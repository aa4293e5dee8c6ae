"""`render_flash_attention(spec)` / `render_flash_attention_backward(spec)`: the C++ source of one
flash-attention kernel, forward or backward.

The algorithms live in `flash_attention.cpp` and `flash_attention_backward.cpp` (real C++, readable
and reviewable on their own), their shared register tiles in `tiles.h`; rendering only prepends the
configuration macros the spec decides.
"""

from __future__ import annotations

from importlib import resources

from vfuse.codegen.cpp.attention.spec import AttentionSpec
from vfuse.codegen.cpp.simd import SIMD_PRELUDE, vtype

_MACROS = ("VF_NAME", "VF_NS", "VF_WORKSPACE_NAME", "VF_D", "VF_DV", "VF_BQ", "VF_BK", "VF_CAUSAL", "VF_MASK")
_MACROS += ("VF_VEC", "VF_LANES", "VF_TILE", "VF_LSE", "VF_EPILOGUE")


def _text(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text()


def _config(spec: AttentionSpec, what: str) -> list[str]:
    return [
        f"// vfuse flash attention {what}: {spec}",
        # Undefined first: an earlier instance in the same translation unit defined them too.
        *(f"#undef {m}" for m in _MACROS),
        f"#define VF_NAME {spec.name}",
        f"#define VF_NS vf_attn_{spec.name}",
        f"#define VF_WORKSPACE_NAME {spec.name}_workspace_bytes",
        f"#define VF_D {spec.head_dim}",
        f"#define VF_DV {spec.dv}",
        f"#define VF_BQ {spec.block_q}",
        f"#define VF_BK {spec.block_k}",
        f"#define VF_CAUSAL {int(spec.causal)}",
        f"#define VF_MASK {spec.mask.value}",
        f"#define VF_VEC {vtype(spec.lanes)}",
        f"#define VF_LANES {spec.lanes}",
        f"#define VF_TILE {spec.tile_cols}",
    ]


def render_flash_attention(spec: AttentionSpec) -> str:
    """A self-contained C++17 translation unit defining `extern "C" void <spec.name>(...)`."""
    config = [
        *_config(spec, "forward"),
        f"#define VF_LSE {int(spec.lse)}",
        # The hook is a statement on `o`; the do/while makes it one statement wherever used.
        f"#define VF_EPILOGUE(o, b, h, i, c) do {{ {spec.epilogue.replace(chr(10), ' ')} }} while (0)",
    ]
    return SIMD_PRELUDE + _text("tiles.h") + "\n".join(config) + "\n" + _text("flash_attention.cpp")


def render_flash_attention_backward(spec: AttentionSpec) -> str:
    """The backward kernel for `spec` (its epilogue and lse flag do not apply):
    `extern "C" void <spec.name>(dout, q, k, v, lse, delta, mask, dq, dk, dv, ...)`."""
    if spec.epilogue:
        raise ValueError(f"{spec.name}: the attention backward takes no epilogue")
    config = _config(spec, "backward")
    return SIMD_PRELUDE + _text("tiles.h") + "\n".join(config) + "\n" + _text("flash_attention_backward.cpp")
