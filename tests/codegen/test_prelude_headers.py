"""The prelude's intrinsics headers (codegen/cpp/prelude.py): below AVX-512, g++ parses only the
headers up to AVX2, FMA and F16C (<immintrin.h> whole is ~0.85 s of CPU per unit, most of it
AVX-512's), every intrinsic family the kernels use at those tiers still compiles, and a later
`#include <immintrin.h>` (the GEMM, table and int8 parts) adds nothing; at AVX-512 the whole
header is there. Syntax checks only: the AVX-512 case runs on any x86 machine."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from vfuse.codegen.cpp.prelude import PRELUDE
from vfuse.codegen.cpp.toolchain import find_toolchain, flags_for
from vfuse.targets.isa import X86, CpuIsa, Isa, machine_arch

# One use of each family the generated code calls at AVX2 and below (streaming stores, byte
# tables, gathers, fp16 conversion, masked loads, prefetch, bit manipulation), after the parts'
# own include, which must be a no-op.
AVX2_USES = r"""
#include <immintrin.h>
void uses(const void* p, void* q, float* f, const int* idx) {
  __m256i a = _mm256_loadu_si256((const __m256i*)p);
  a = _mm256_shuffle_epi8(a, _mm256_set1_epi8(3));
  _mm256_stream_si256((__m256i*)q, _mm256_i32gather_epi32(idx, a, 4));
  __m256 h = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
  __m256 x = _mm256_fmadd_ps(_mm256_loadu_ps(f), h, _mm256_set1_ps(1));
  _mm256_maskstore_ps(f, _mm256_cmpgt_epi32(a, _mm256_setzero_si256()), _mm256_max_ps(x, _mm256_min_ps(x, x)));
  _mm_prefetch((const char*)p, _MM_HINT_T0);
  _mm_stream_si128((__m128i*)q, _mm_loadl_epi64((const __m128i*)p));
  _mm_sfence();
  f[0] = (float)(_bzhi_u32(idx[0], 3) + _tzcnt_u32(idx[1]) + _mm_popcnt_u32(idx[2]));
}
"""
AVX512_USES = r"""
#include <immintrin.h>
void uses(const float* f, float* g, __mmask16 m) {
  __m512 x = _mm512_maskz_loadu_ps(m, f);
  _mm512_mask_storeu_ps(g, m, _mm512_max_ps(x, _mm512_min_ps(x, x)));
  _mm512_stream_si512((__m512i*)g, _mm512_permutexvar_epi8(_mm512_set1_epi32(1), _mm512_loadu_si512(f)));
}
"""


def _gcc() -> str:
    tc = find_toolchain()
    match = re.search(r"\b(\d+)\.\d+\.\d+", tc.version)
    if machine_arch() != X86 or "clang" in tc.version.lower() or match is None or int(match.group(1)) < 11:
        pytest.skip("the header subset is for g++ 11 and later on x86")
    return tc.cxx


def _headers(tmp_path: Path, march: tuple[str, ...], uses: str) -> set[str]:
    """The headers g++ reads for the prelude and `uses` (-H), after checking they compile."""
    src = tmp_path / "unit.cpp"
    src.write_text(PRELUDE + uses)
    flags = [f for f in flags_for(CpuIsa(Isa.GENERIC, frozenset(), X86)) if not f.startswith("-m")]
    cmd = [_gcc(), *flags, *march, "-H", "-fsyntax-only", "-Wno-error", str(src)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    return {Path(line.lstrip(". ").strip()).name for line in res.stderr.splitlines() if line.startswith(".")}


@pytest.mark.parametrize("march", [("-march=x86-64-v3",), ("-march=x86-64", "-mno-mmx")], ids=["avx2", "generic"])
def test_below_avx512_only_the_headers_up_to_avx2(tmp_path: Path, march: tuple[str, ...]) -> None:
    uses = AVX2_USES if "v3" in march[0] else AVX2_USES.split("void uses")[0]
    seen = _headers(tmp_path, march, uses)
    assert {"avx2intrin.h", "fmaintrin.h", "f16cintrin.h", "xmmintrin.h"} <= seen
    assert not {h for h in seen if h.startswith("avx512")}, "AVX-512 headers parsed below AVX-512"


def test_at_avx512_the_whole_header(tmp_path: Path) -> None:
    seen = _headers(tmp_path, ("-march=x86-64-v4", "-mavx512vbmi"), AVX512_USES)
    assert {"immintrin.h", "avx512fintrin.h", "avx512vbmiintrin.h", "avx2intrin.h"} <= seen
