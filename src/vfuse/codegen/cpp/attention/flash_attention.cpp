// Flash attention for CPUs (FlashAttention-2 schedule), one instance per head size and mask kind.
//
// vfuse.codegen.cpp.attention.render prepends the configuration: VF_NAME, VF_WORKSPACE_NAME, VF_D (q/k head size),
// VF_DV (v head size), VF_BQ / VF_BK (tile rows of Q / K), VF_CAUSAL (0/1), VF_MASK (0 none,
// 1 additive float, 2 boolean keep-mask) and VF_EPILOGUE(o, b, h, i, c), a statement applied
// to each output element `o` (a float lvalue) at batch b, head h, row i, column c.
//
// Work: parallel over (batch, head, Q tile); each task streams K/V tiles and keeps a running
// row max m, row sum l and unnormalized output acc (online softmax: when the max grows, l and
// acc are rescaled by exp(m_old - m_new)). Scores are kept transposed (st[key][row]): the Q
// tile is transposed once per task, K rows are read in place (no per-tile packing), and the
// softmax statistics of 16 rows are one vector. Extra memory is one `Work` per thread: O(tile), never
// the Lq x Lk score matrix. With VF_CAUSAL (top-left aligned, like torch's is_causal) K tiles
// entirely above the diagonal are skipped; a row that keeps no key at all outputs zeros.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>

#include <omp.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

// A namespace per instance (VF_NS): several kernels can share one translation unit.
namespace VF_NS {

constexpr int64_t D = VF_D, DV = VF_DV, BQ = VF_BQ, BK = VF_BK;
constexpr int64_t DVP = (DV + 15) / 16 * 16;  // accumulator rows padded to whole vectors
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();
static_assert(BQ % 16 == 0 && BK % 4 == 0, "tiles: BQ a multiple of 16, BK of 4");

// Everything the kernel allocates, once per thread; its size does not depend on Lq or Lk.
struct alignas(64) Work {
  float qt[D][BQ];     // Q tile transposed, pre-multiplied by the scale (zero rows past Lq)
  float st[BK][BQ];    // scores, then probabilities, of the current K tile, transposed
  float acc[BQ][DVP];  // unnormalized output rows
  float m[BQ];         // running row max
  float l[BQ];         // running row sum of exp(s - m)
  float alpha[BQ];     // this tile's rescale factor exp(m_old - m_new)
};

struct Mask {  // element (b, h, i, j) at p + b*sb + h*sh + i*sq + j*sk; strides 0 broadcast
  const void* p;
  int64_t sb, sh, sq, sk;
};

struct Task {  // one (batch, head, Q tile)
  const float* q;  // first row of the tile
  const float* k;  // first row of this head's K
  const float* v;
  float* out;
  int64_t b, h, q0, nq, lk;
  float scale;
};

#if defined(__AVX512F__)
// exp(x) = 2^n * e^r, n = round(x / ln2), r = x - n ln2 (two-part ln2); e^r by a degree-6
// Taylor polynomial (|r| <= 0.35: relative error ~1e-7). Inputs below -127 (and -inf) give 0.
inline __m512 exp512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-127.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  for (float c : {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f}) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
  return _mm512_scalef_ps(p, n);
}
#endif

// st[j][:] = k[j] . qt for keys [0, nk) in blocks of 4; a block's rows past nk repeat the
// last key (they are never read).
void scores(Work& w, const float* k, int64_t nk) {
#if defined(__AVX512F__)
  constexpr int NV = BQ / 16;
  for (int64_t j = 0; j < nk; j += 4) {
    const float* kr[4];
    for (int r = 0; r < 4; ++r) kr[r] = k + std::min(j + r, nk - 1) * D;
    __m512 acc[4][NV];
    for (auto& row : acc)
      for (auto& a : row) a = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; ++d) {
      __m512 qv[NV];
      for (int c = 0; c < NV; ++c) qv[c] = _mm512_load_ps(&w.qt[d][16 * c]);
      for (int r = 0; r < 4; ++r) {
        const __m512 kb = _mm512_set1_ps(kr[r][d]);
        for (int c = 0; c < NV; ++c) acc[r][c] = _mm512_fmadd_ps(kb, qv[c], acc[r][c]);
      }
    }
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < NV; ++c) _mm512_store_ps(&w.st[j + r][16 * c], acc[r][c]);
  }
#else
  for (int64_t j = 0; j < nk; ++j) {
    for (int64_t i = 0; i < BQ; ++i) w.st[j][i] = 0.0f;
    for (int64_t d = 0; d < D; ++d)
      for (int64_t i = 0; i < BQ; ++i) w.st[j][i] += k[j * D + d] * w.qt[d][i];
  }
#endif
}

// Apply the mask and the causal cut to the scores of keys [k0, k0 + nk).
void mask_tile(Work& w, const Mask& m, const Task& t, int64_t k0, int64_t nk) {
  for (int64_t j = 0; j < nk; ++j) {
    float* s = w.st[j];
    const int64_t at = t.b * m.sb + t.h * m.sh + t.q0 * m.sq + (k0 + j) * m.sk;
    if constexpr (VF_MASK == 1) {
      const float* col = static_cast<const float*>(m.p) + at;
      for (int64_t i = 0; i < t.nq; ++i) s[i] += col[i * m.sq];
    } else if constexpr (VF_MASK == 2) {
      const uint8_t* col = static_cast<const uint8_t*>(m.p) + at;
      for (int64_t i = 0; i < t.nq; ++i) s[i] = col[i * m.sq] ? s[i] : NEG_INF;
    }
    if constexpr (VF_CAUSAL)  // key k0 + j is visible from rows q0 + i >= k0 + j only
      for (int64_t i = 0; i < std::min(t.nq, k0 + j - t.q0); ++i) s[i] = NEG_INF;
  }
}

// Online softmax over one K tile, 16 rows per step: st -> probabilities, update m, l, alpha.
// A row that has kept no key yet uses 0 as its max, so exp gives 0 instead of NaN.
void softmax_tile(Work& w, int64_t nk) {
#if defined(__AVX512F__)
  const __m512 neg_inf = _mm512_set1_ps(NEG_INF);
  for (int64_t c = 0; c < BQ; c += 16) {
    const __m512 m_old = _mm512_load_ps(w.m + c);
    __m512 m_new = m_old;
    for (int64_t j = 0; j < nk; ++j) m_new = _mm512_max_ps(m_new, _mm512_load_ps(&w.st[j][c]));
    const __m512 m_use = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(m_new, neg_inf, _CMP_EQ_OQ), m_new,
                                              _mm512_setzero_ps());
    const __m512 alpha = exp512(_mm512_sub_ps(m_old, m_use));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < nk; ++j) {
      const __m512 p = exp512(_mm512_sub_ps(_mm512_load_ps(&w.st[j][c]), m_use));
      _mm512_store_ps(&w.st[j][c], p);
      sum = _mm512_add_ps(sum, p);
    }
    _mm512_store_ps(w.l + c, _mm512_fmadd_ps(_mm512_load_ps(w.l + c), alpha, sum));
    _mm512_store_ps(w.m + c, m_new);
    _mm512_store_ps(w.alpha + c, alpha);
  }
#else
  for (int64_t i = 0; i < BQ; ++i) {
    float m_new = w.m[i];
    for (int64_t j = 0; j < nk; ++j) m_new = std::max(m_new, w.st[j][i]);
    const float m_use = m_new == NEG_INF ? 0.0f : m_new;
    float sum = 0.0f;
    for (int64_t j = 0; j < nk; ++j) sum += (w.st[j][i] = std::exp(w.st[j][i] - m_use));
    w.alpha[i] = std::exp(w.m[i] - m_use);
    w.l[i] = w.l[i] * w.alpha[i] + sum;
    w.m[i] = m_new;
  }
#endif
}

#if defined(__AVX512F__)
// acc[i][c0 : c0 + 16 NC] = alpha[i] acc[i][...] + sum_j p[j][i] v[j][...] for rows [0, nq)
// in blocks of 4 (padded rows have p = 0).
template <int NC>
void pv_chunk(Work& w, const float* v, int64_t nq, int64_t nk, int64_t c0) {
  __mmask16 lanes[NC];
  for (int c = 0; c < NC; ++c) {
    const int64_t n = std::min<int64_t>(16, DV - c0 - 16 * c);
    lanes[c] = n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1);
  }
  for (int64_t i = 0; i < nq; i += 4) {
    __m512 acc[4][NC];
    for (int r = 0; r < 4; ++r) {
      const __m512 a = _mm512_set1_ps(w.alpha[i + r]);
      for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_mul_ps(a, _mm512_load_ps(&w.acc[i + r][c0 + 16 * c]));
    }
    for (int64_t j = 0; j < nk; ++j) {
      __m512 vv[NC];
      for (int c = 0; c < NC; ++c) vv[c] = _mm512_maskz_loadu_ps(lanes[c], v + j * DV + c0 + 16 * c);
      for (int r = 0; r < 4; ++r) {
        const __m512 p = _mm512_set1_ps(w.st[j][i + r]);
        for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_fmadd_ps(p, vv[c], acc[r][c]);
      }
    }
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < NC; ++c) _mm512_store_ps(&w.acc[i + r][c0 + 16 * c], acc[r][c]);
  }
}
#endif

void accumulate_pv(Work& w, const float* v, int64_t nq, int64_t nk) {
#if defined(__AVX512F__)
  constexpr int64_t FULL = DVP / 64, TAIL = (DVP % 64) / 16;
  for (int64_t c = 0; c < FULL; ++c) pv_chunk<4>(w, v, nq, nk, 64 * c);
  if constexpr (TAIL > 0) pv_chunk<TAIL>(w, v, nq, nk, 64 * FULL);
#else
  for (int64_t i = 0; i < nq; ++i)
    for (int64_t c = 0; c < DV; ++c) {
      float a = w.acc[i][c] * w.alpha[i];
      for (int64_t j = 0; j < nk; ++j) a += w.st[j][i] * v[j * DV + c];
      w.acc[i][c] = a;
    }
#endif
}

void load_q(Work& w, const Task& t) {
  for (int64_t d = 0; d < D; ++d)
    for (int64_t i = 0; i < BQ; ++i) w.qt[d][i] = i < t.nq ? t.q[i * D + d] * t.scale : 0.0f;
  std::fill(&w.acc[0][0], &w.acc[0][0] + BQ * DVP, 0.0f);
  std::fill(w.m, w.m + BQ, NEG_INF);
  std::fill(w.l, w.l + BQ, 0.0f);
}

void attend(Work& w, const Mask& mask, const Task& t) {
  load_q(w, t);
  const int64_t kend = VF_CAUSAL ? std::min(t.lk, t.q0 + t.nq) : t.lk;  // later tiles are all masked
  for (int64_t k0 = 0; k0 < kend; k0 += BK) {
    const int64_t nk = std::min(BK, kend - k0);
    scores(w, t.k + k0 * D, nk);
    mask_tile(w, mask, t, k0, nk);
    softmax_tile(w, nk);
    accumulate_pv(w, t.v + k0 * DV, t.nq, nk);
  }
  for (int64_t i = 0; i < t.nq; ++i) {
    const float inv = w.l[i] > 0.0f ? 1.0f / w.l[i] : 0.0f;  // l == 0: no key kept
    float* row = t.out + i * DV;
    const int64_t gi = t.q0 + i;  // macro arguments must be single tokens or postfix expressions
    for (int64_t c = 0; c < DV; ++c) {
      float o = w.acc[i][c] * inv;
      VF_EPILOGUE(o, t.b, t.h, gi, c);
      row[c] = o;
    }
  }
}

}  // namespace VF_NS

// The per-thread allocation, for the Python side to check its own accounting against.
extern "C" int64_t VF_WORKSPACE_NAME() { return sizeof(VF_NS::Work); }

// q [B, H, LQ, D], k [B, HKV, LK, D], v [B, HKV, LK, DV], out [B, H, LQ, DV], all contiguous;
// H % HKV == 0 (grouped-query: head h reads K/V head h / (H / HKV)). mask: see VF_MASK, element
// strides (0 = broadcast). threads <= 0: OpenMP's default.
extern "C" void VF_NAME(const float* q, const float* k, const float* v, const void* mask, float* out, int64_t B,
                        int64_t H, int64_t HKV, int64_t LQ, int64_t LK, float scale, int64_t msb, int64_t msh,
                        int64_t msq, int64_t msk, int64_t threads) {
  using namespace VF_NS;
  const Mask m{mask, msb, msh, msq, msk};
  const int64_t ntiles = (LQ + BQ - 1) / BQ, group = H / HKV;
#pragma omp parallel num_threads(threads > 0 ? threads : omp_get_max_threads())
  {
    Work* w = static_cast<Work*>(std::aligned_alloc(64, sizeof(Work)));
#pragma omp for collapse(3) schedule(dynamic)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t tile = 0; tile < ntiles; ++tile) {
          // Causal: the last tiles have the most keys; start them first for a balanced tail.
          const int64_t q0 = (VF_CAUSAL ? ntiles - 1 - tile : tile) * BQ;
          const int64_t kv = (b * HKV + h / group) * LK;
          const Task t{q + ((b * H + h) * LQ + q0) * D, k + kv * D, v + kv * DV, out + ((b * H + h) * LQ + q0) * DV,
                       b, h, q0, std::min(BQ, LQ - q0), LK, scale};
          attend(*w, m, t);
        }
    std::free(w);
  }
}
