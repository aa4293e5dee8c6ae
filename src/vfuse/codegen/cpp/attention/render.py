"""`render_flash_attention(spec)`: the C++ source of one flash-attention kernel.

The algorithm lives in `flash_attention.cpp` (real C++, readable and reviewable on its own);
rendering only prepends the configuration macros the spec decides.
"""

from __future__ import annotations

from importlib import resources

from vfuse.codegen.cpp.attention.spec import AttentionSpec
from vfuse.codegen.cpp.simd import SIMD_PRELUDE, vtype


def _template() -> str:
    return resources.files(__package__).joinpath("flash_attention.cpp").read_text()


def render_flash_attention(spec: AttentionSpec) -> str:
    """A self-contained C++17 translation unit defining `extern "C" void <spec.name>(...)`."""
    macros = ("VF_NAME", "VF_NS", "VF_WORKSPACE_NAME", "VF_D", "VF_DV", "VF_BQ", "VF_BK", "VF_CAUSAL", "VF_MASK")
    macros += ("VF_VEC", "VF_LANES", "VF_TILE")
    config = [
        f"// vfuse flash attention: {spec}",
        # Undefined first: an earlier instance in the same translation unit defined them too.
        *(f"#undef {m}" for m in (*macros, "VF_EPILOGUE")),
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
        # The hook is a statement on `o`; the do/while makes it one statement wherever used.
        f"#define VF_EPILOGUE(o, b, h, i, c) do {{ {spec.epilogue.replace(chr(10), ' ')} }} while (0)",
    ]
    return SIMD_PRELUDE + "\n".join(config) + "\n" + _template()
