// Flash attention for CPUs (FlashAttention-2 schedule), one instance per head size and mask kind.
//
// vfuse.codegen.cpp.attention.render prepends the configuration: VF_NAME, VF_WORKSPACE_NAME, VF_D (q/k head size),
// VF_DV (v head size), VF_BQ / VF_BK (tile rows of Q / K), VF_CAUSAL (0/1), VF_MASK (0 none,
// 1 additive float, 2 boolean keep-mask), VF_LSE (1: each row's logsumexp, [B, H, LQ], follows the output),
// VF_DROPOUT (1: dropout on P with threshold VF_DROP_THR and scale VF_DROP_SCALE, vf_attn::Dropout; the row
// sums and the logsumexp are the undropped softmax's; the kernel takes the seed and stream last),
// VF_VEC / VF_LANES (the fp32 vector type of codegen/cpp/simd.py
// and its lanes), VF_TILE (register tile width: 4 keys x VF_TILE rows of scores, 4 rows x VF_TILE
// columns of P @ V) and VF_EPILOGUE(o, b, h, i, c), a statement applied
// to each output element `o` (a float lvalue) at batch b, head h, row i, column c.
//
// Work: parallel over (batch, head, Q tile); each task streams K/V tiles and keeps a running
// row max m, row sum l and unnormalized output acc (online softmax: when the max grows, l and
// acc are rescaled by exp(m_old - m_new)). Scores are kept transposed (st[key][row]): the Q
// tile is transposed once per task, K rows are read in place (no per-tile packing), and the
// softmax statistics of VF_LANES rows are one vector. One source for every instruction set: vector
// extensions at the schedule's width (AVX-512, AVX2, NEON, SSE2 all from this text). Extra memory
// is one `Work` per thread: O(tile), never the Lq x Lk score matrix. With VF_CAUSAL (top-left aligned, like torch's is_causal) K tiles
// entirely above the diagonal are skipped; a row that keeps no key at all outputs zeros.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>

#include <omp.h>

// A namespace per instance (VF_NS): several kernels can share one translation unit.
namespace VF_NS {

typedef VF_VEC V;
constexpr int64_t D = VF_D, DV = VF_DV, BQ = VF_BQ, BK = VF_BK, W = VF_LANES, TILE = VF_TILE;
constexpr int64_t DVP = (DV + W - 1) / W * W;  // accumulator rows padded to whole vectors
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();
static_assert(sizeof(V) == 4 * W && TILE % W == 0 && BQ % W == 0 && BK % 4 == 0,
              "tiles: BQ and TILE multiples of the vector width, BK of 4");

// Everything the kernel allocates, once per thread; its size does not depend on Lq or Lk.
struct alignas(64) Work {
  float qt[D][BQ];     // Q tile transposed, pre-multiplied by the scale (zero rows past Lq)
  float st[BK][BQ];    // scores, then probabilities, of the current K tile, transposed
  float acc[BQ][DVP];  // unnormalized output rows
  float m[BQ];         // running row max
  float l[BQ];         // running row sum of exp(s - m)
  float alpha[BQ];     // this tile's rescale factor exp(m_old - m_new)
};

using vf_attn::Mask;

struct Task {  // one (batch, head, Q tile)
  const float* q;  // first row of the tile
  const float* k;  // first row of this head's K
  const float* v;
  float* out;
  float* lse;  // VF_LSE: this tile's rows of the logsumexp output, else unused
  int64_t b, h, q0, nq, lk;
  float scale;
  uint64_t idx;  // VF_DROPOUT: the scores' flat index of (row q0, key 0)
};

using vf_attn::at;

// Online softmax over one K tile, W rows per step: st -> probabilities, update m, l, alpha.
// A row that has kept no key yet uses 0 as its max, so exp gives 0 instead of NaN.
void softmax_tile(Work& w, int64_t nk) {
  const V neg_inf = vs_splat<V>(NEG_INF);
  for (int64_t c = 0; c < BQ; c += W) {
    const V m_old = at<V>(w.m + c);
    V m_new = m_old;
    for (int64_t j = 0; j < nk; ++j) m_new = vs_max(m_new, at<V>(&w.st[j][c]));
    const V m_use = m_new == neg_inf ? V{} : m_new;
    const V alpha = vs_exp(m_old - m_use);
    V sum = {};
    for (int64_t j = 0; j < nk; ++j) {
      const V p = vs_exp(at<V>(&w.st[j][c]) - m_use);
      at<V>(&w.st[j][c]) = p;
      sum += p;
    }
    at<V>(w.l + c) = at<V>(w.l + c) * alpha + sum;
    at<V>(w.m + c) = m_new;
    at<V>(w.alpha + c) = alpha;
  }
}

void load_q(Work& w, const Task& t) {
  vf_attn::transpose_rows<D, BQ, BQ>(&w.qt[0][0], t.q, D, t.nq, t.scale);
  std::fill(&w.acc[0][0], &w.acc[0][0] + BQ * DVP, 0.0f);
  std::fill(w.m, w.m + BQ, NEG_INF);
  std::fill(w.l, w.l + BQ, 0.0f);
}

void attend(Work& w, const Mask& mask, const vf_attn::Dropout& drop, const Task& t) {
  load_q(w, t);
  const int64_t kend = VF_CAUSAL ? std::min(t.lk, t.q0 + t.nq) : t.lk;  // later tiles are all masked
  for (int64_t k0 = 0; k0 < kend; k0 += BK) {
    const int64_t nk = std::min(BK, kend - k0);
    vf_attn::scores<V, TILE, BQ, D>(w.st, w.qt, t.k + k0 * D, nk);
    vf_attn::apply_mask<VF_MASK, VF_CAUSAL, BQ>(w.st, mask, t.b, t.h, t.q0, t.nq, k0, nk);
    softmax_tile(w, nk);
    if constexpr (VF_DROPOUT)  // after the row sums: the softmax normalizes over every key
      for (int64_t j = 0; j < nk; ++j)
        for (int64_t c = 0; c < BQ; c += W)
          at<V>(&w.st[j][c]) *= vf_attn::keep_scale<V>(drop, t.idx + c * t.lk + k0 + j, t.lk);
    // acc = alpha acc + P V for rows [0, nq) in blocks of 4 (a block's rows past nq are never stored)
    vf_attn::rows_acc<V, TILE, BQ, 1, DV, DVP, vf_attn::RESCALE>(&w.acc[0][0], &w.st[0][0], t.v + k0 * DV, t.nq, nk,
                                                              w.alpha);
  }
  if constexpr (VF_LSE)  // log of the softmax's denominator, for the backward: -inf where no key was kept
    for (int64_t i = 0; i < t.nq; ++i) t.lse[i] = w.l[i] <= 0.0f ? NEG_INF : w.m[i] + std::log(w.l[i]);  // NaN stays NaN
  for (int64_t i = 0; i < t.nq; ++i) {
    const float inv = w.l[i] <= 0.0f ? 0.0f : 1.0f / w.l[i];  // l == 0: no key kept; NaN stays NaN
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
// strides (0 = broadcast). threads <= 0: OpenMP's default. VF_DROPOUT: then the seed and stream.
extern "C" void VF_NAME(const float* q, const float* k, const float* v, const void* mask, float* out, int64_t B,
                        int64_t H, int64_t HKV, int64_t LQ, int64_t LK, float scale, int64_t msb, int64_t msh,
                        int64_t msq, int64_t msk, int64_t threads VF_DROPOUT_PARAMS) {
  using namespace VF_NS;
  const Mask m{mask, msb, msh, msq, msk};
  const vf_attn::Dropout drop = VF_DROPOUT_KEY;
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
          // VF_LSE: the logsumexp [B, H, LQ] follows the output in the same buffer.
          float* lse = out + B * H * LQ * DV + (b * H + h) * LQ + q0;
          const Task t{q + ((b * H + h) * LQ + q0) * D, k + kv * D, v + kv * DV, out + ((b * H + h) * LQ + q0) * DV,
                       lse, b, h, q0, std::min(BQ, LQ - q0), LK, scale, (uint64_t)((b * H + h) * LQ + q0) * LK};
          attend(*w, m, drop, t);
        }
    std::free(w);
  }
}
