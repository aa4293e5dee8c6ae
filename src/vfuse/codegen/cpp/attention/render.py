"""`render_flash_attention(spec)` / `render_flash_attention_backward(spec)`: the C++ source of one
flash-attention kernel, forward or backward.

The algorithms live in `flash_attention.cpp` and `flash_attention_backward.cpp` (real C++, readable
and reviewable on their own), their shared register tiles in `tiles.h`; rendering only prepends the
configuration macros the spec decides.

`shared_instance` renders one for a program: named by the hash of its text (`vf_attn_<hash>`),
include-guarded, static and noinline, so every layer's attention whose spec differs only in its name
compiles once per unit (22 KB of C++; a second instance in a unit cost g++ ~0.07 s of CPU, docs/perf-log.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import struct
from importlib import resources

from vfuse.codegen.cpp.attention.spec import AttentionSpec
from vfuse.codegen.cpp.simd import SIMD_PRELUDE, vtype

_MACROS = ("VF_NAME", "VF_NS", "VF_WORKSPACE_NAME", "VF_D", "VF_DV", "VF_BQ", "VF_BK", "VF_CAUSAL", "VF_MASK")
_MACROS += ("VF_VEC", "VF_LANES", "VF_TILE", "VF_LSE", "VF_EPILOGUE")
_MACROS += ("VF_DROPOUT", "VF_DROP_THR", "VF_DROP_SCALE", "VF_DROPOUT_PARAMS", "VF_DROPOUT_KEY")


# Static (each unit defines its own copy) and noinline (each caller is one call, not a copy of
# the kernel to optimize again): the template's two exported functions.
_EXPORTED = ('extern "C" void VF_NAME(', 'extern "C" int64_t VF_WORKSPACE_NAME(')
_SHARED_LINKAGE = "__attribute__((noinline)) static "
SHARED_PREFIX = "vf_attn_"  # + 20 hex digits: an instance kernels share (report/source.py finds it)
_INSTANCE = "vf_attn_instance"  # the name hashed, replaced by the hash


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
        *_dropout(spec),
    ]


def _dropout(spec: AttentionSpec) -> list[str]:
    """Dropout on P: the keep threshold on the hash's 24 bits and the scale, compile-time; the seed
    and stream, extra trailing arguments of the kernel (none without dropout: the same signature)."""
    if not spec.dropout:
        return ["#define VF_DROPOUT 0", "#define VF_DROPOUT_PARAMS", "#define VF_DROPOUT_KEY vf_attn::Dropout{}"]
    thr, scale = dropout_constants(spec.dropout)
    return [
        "#define VF_DROPOUT 1",
        f"#define VF_DROP_THR {thr}u",
        f"#define VF_DROP_SCALE {scale.hex()}f",
        "#define VF_DROPOUT_PARAMS , int64_t seed, int64_t stream",
        "#define VF_DROPOUT_KEY vf_attn::dropout_key(seed, stream, VF_DROP_THR, VF_DROP_SCALE)",
    ]


def dropout_constants(p: float) -> tuple[int, float]:
    """(thr, scale): uniform u = k / 2^24 >= p (compared in fp32, as ir/defs/rng.py's numbers are) iff
    k >= thr = ceil(fp32(p) 2^24); kept values times scale = fp32(1 / (1 - p)), as the reference's."""
    p32 = struct.unpack("f", struct.pack("f", p))[0]
    scale = struct.unpack("f", struct.pack("f", 1.0 / (1.0 - p)))[0]
    return math.ceil(p32 * (1 << 24)), scale


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


def shared_instance(spec: AttentionSpec, backward: bool = False) -> tuple[str, str]:
    """(source, function name): the instance of `spec` under the name of its text's hash
    (`vf_attn_<hash>`), its configuration and algorithm include-guarded (once per unit whatever
    the kernels that call it), the guarded SIMD prelude and tiles before them; the same
    arguments as `spec.name` would take."""
    render = render_flash_attention_backward if backward else render_flash_attention
    text = render(dataclasses.replace(spec, name=_INSTANCE))
    for head in _EXPORTED:
        assert text.count(head) == 1, head
        text = text.replace(head, _SHARED_LINKAGE + head.removeprefix('extern "C" '))
    common = SIMD_PRELUDE + _text("tiles.h")
    assert text.startswith(common)
    instance = text[len(common) :]
    digest = hashlib.sha256(instance.encode()).hexdigest()[:20]
    name = f"{SHARED_PREFIX}{digest}"
    guard = f"VF_ATTN_{digest}"
    return f"{common}#ifndef {guard}\n#define {guard}\n{instance.replace(_INSTANCE, name)}\n#endif\n", name
