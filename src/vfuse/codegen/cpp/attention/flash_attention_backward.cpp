// Flash attention backward for CPUs (FlashAttention-2), one instance per head size and mask kind.
//
// vfuse.codegen.cpp.attention.render prepends the configuration: VF_NAME, VF_NS, VF_WORKSPACE_NAME,
// VF_D / VF_DV (q/k and v head sizes), VF_BQ / VF_BK (tile rows of Q / K), VF_CAUSAL, VF_MASK (0 none,
// 1 additive float, 2 boolean keep-mask), VF_VEC / VF_LANES (vector type and lanes) and VF_TILE (register
// tile width), all decided by the schedule.
//
// Nothing of size LQ x LK is stored: per (K tile, Q tile) the scores are recomputed from Q and K and
// turned into probabilities with the forward's logsumexp, P = exp(S - lse); then dV += P^T dO,
// dP = dO V^T, dS = P (dP - delta) with delta = rowsum(dO * O) (an input), dQ += dS K scale,
// dK += dS^T Q scale. Tasks are (batch, K/V head): a task owns its K/V head's dK and dV, accumulated over
// the query heads of its group (grouped-query attention) in a K tile's accumulators, and those heads'
// dQ rows, so no two threads write one element. With fewer tasks than threads each task's K tiles are
// split into chunks, each adding its dQ part into a buffer of its own (O(LQ) each), summed in a fixed
// order at the end. With VF_CAUSAL the Q tiles above a K tile are skipped.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>

#include <omp.h>

namespace VF_NS {

typedef VF_VEC V;
constexpr int64_t D = VF_D, DV = VF_DV, BQ = VF_BQ, BK = VF_BK, W = VF_LANES, TILE = VF_TILE;
constexpr int64_t DP = (D + W - 1) / W * W, DVP = (DV + W - 1) / W * W;  // accumulator rows: whole vectors
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();
constexpr float POS_INF = std::numeric_limits<float>::infinity();
static_assert(sizeof(V) == 4 * W && TILE % W == 0 && BQ % TILE == 0 && BK % 4 == 0,
              "tiles: BQ a multiple of TILE, TILE of the vector width, BK of 4");
using vf_attn::at;

// Everything the kernel allocates, once per thread; its size does not depend on LQ or LK.
struct alignas(64) Work {
  float qt[D][BQ];    // Q tile transposed, times the scale
  float dot[DV][BQ];  // dO tile transposed
  float st[BK][BQ];   // scores, then P, of (K tile, Q tile), transposed
  float dst[BK][BQ];  // dP, then dS
  float dq[BQ][DP];   // dS K of this pair
  float dk[BK][DP];   // the K tile's dK over its group's heads and Q tiles (unscaled)
  float dv[BK][DVP];  // the K tile's dV
  float lse[BQ];      // +inf past the tile's rows and where no key was kept: P = 0 there
  float delta[BQ];
};

struct Args {
  const float *dout, *q, *k, *v, *lse, *delta;
  float *dq, *dk, *dv;
  float* part;  // dQ of K-tile chunks 1, 2, ... (each B * H * LQ * D), when tasks are split
  int64_t B, H, HKV, LQ, LK;
  float scale;
};

// The tile's rows of Q (scaled) and dO, transposed, and its lse / delta; zeros past nq.
void load_rows(Work& w, const float* q, const float* dout, const float* lse, const float* delta, int64_t nq,
               float scale) {
  for (int64_t d = 0; d < D; ++d)
    for (int64_t i = 0; i < BQ; ++i) w.qt[d][i] = i < nq ? q[i * D + d] * scale : 0.0f;
  for (int64_t c = 0; c < DV; ++c)
    for (int64_t i = 0; i < BQ; ++i) w.dot[c][i] = i < nq ? dout[i * DV + c] : 0.0f;
  for (int64_t i = 0; i < BQ; ++i) {
    w.lse[i] = i < nq && lse[i] != NEG_INF ? lse[i] : POS_INF;
    w.delta[i] = i < nq ? delta[i] : 0.0f;
  }
}

// st = exp(st - lse) for keys [0, nk), W rows per step.
void probabilities(Work& w, int64_t nk) {
  for (int64_t c = 0; c < BQ; c += W) {
    const V l = at<V>(w.lse + c);
    for (int64_t j = 0; j < nk; ++j) at<V>(&w.st[j][c]) = vs_exp(at<V>(&w.st[j][c]) - l);
  }
}

// dst = st * (dst - delta) for keys [0, nk).
void score_grads(Work& w, int64_t nk) {
  for (int64_t c = 0; c < BQ; c += W) {
    const V dl = at<V>(w.delta + c);
    for (int64_t j = 0; j < nk; ++j) at<V>(&w.dst[j][c]) = at<V>(&w.st[j][c]) * (at<V>(&w.dst[j][c]) - dl);
  }
}

// One (K tile, query head, Q tile) pair: dV and dK of the K tile accumulate in w, dQ rows in dq_out.
void pair(Work& w, const Args& a, const vf_attn::Mask& m, float* dq_out, int64_t b, int64_t h, int64_t q0, int64_t k0,
          int64_t nk) {
  const int64_t nq = std::min(BQ, a.LQ - q0), row = (b * a.H + h) * a.LQ + q0;
  const int64_t kv = (b * a.HKV + h / (a.H / a.HKV)) * a.LK + k0;
  const float *q = a.q + row * D, *dout = a.dout + row * DV, *k = a.k + kv * D, *v = a.v + kv * DV;
  load_rows(w, q, dout, a.lse + row, a.delta + row, nq, a.scale);
  vf_attn::scores<V, TILE, BQ, D>(w.st, w.qt, k, nk);
  vf_attn::apply_mask<VF_MASK, VF_CAUSAL, BQ>(w.st, m, b, h, q0, nq, k0, nk);
  probabilities(w, nk);
  vf_attn::keys_acc<V, TILE, BQ, DV, DVP>(&w.dv[0][0], w.st, dout, nk, nq);  // dV += P^T dO
  vf_attn::scores<V, TILE, BQ, DV>(w.dst, w.dot, v, nk);                    // dP = dO V^T
  score_grads(w, nk);
  vf_attn::rows_acc<V, TILE, BQ, D, DP, vf_attn::ZERO>(&w.dq[0][0], w.dst, k, nq, nk);  // dS K
  vf_attn::keys_acc<V, TILE, BQ, D, DP>(&w.dk[0][0], w.dst, q, nk, nq);       // dK += dS^T Q
  float* dq = dq_out + row * D;
  for (int64_t i = 0; i < nq; ++i)
    for (int64_t c = 0; c < D; ++c) dq[i * D + c] += w.dq[i][c] * a.scale;
}

// Batch b, K/V head hk, chunk c of `split` over its K tiles: their dK / dV, and their part of dQ for the
// query heads reading them (chunk 0 into dq itself, the others into their part buffers).
void task(Work& w, const Args& a, const vf_attn::Mask& m, int64_t b, int64_t hk, int64_t c, int64_t split) {
  const int64_t group = a.H / a.HKV, h0 = hk * group, tiles = (a.LK + BK - 1) / BK;
  float* dq = c == 0 ? a.dq : a.part + (c - 1) * a.B * a.H * a.LQ * D;
  std::fill(dq + (b * a.H + h0) * a.LQ * D, dq + (b * a.H + h0 + group) * a.LQ * D, 0.0f);
  for (int64_t t = tiles * c / split; t < tiles * (c + 1) / split; ++t) {
    const int64_t k0 = t * BK, nk = std::min(BK, a.LK - k0);
    std::fill(&w.dk[0][0], &w.dk[0][0] + BK * DP, 0.0f);
    std::fill(&w.dv[0][0], &w.dv[0][0] + BK * DVP, 0.0f);
    // Causal: rows before k0 see no key of this tile; a tile past LQ's rows keeps zero gradients.
    const int64_t first = VF_CAUSAL ? k0 / BQ * BQ : 0;
    for (int64_t h = h0; h < h0 + group; ++h)
      for (int64_t q0 = first; q0 < a.LQ; q0 += BQ) pair(w, a, m, dq, b, h, q0, k0, nk);
    const int64_t kv = (b * a.HKV + hk) * a.LK + k0;
    for (int64_t j = 0; j < nk; ++j) {
      for (int64_t e = 0; e < D; ++e) a.dk[(kv + j) * D + e] = w.dk[j][e] * a.scale;
      for (int64_t e = 0; e < DV; ++e) a.dv[(kv + j) * DV + e] = w.dv[j][e];
    }
  }
}

}  // namespace VF_NS

extern "C" int64_t VF_WORKSPACE_NAME() { return sizeof(VF_NS::Work); }

// dout [B, H, LQ, DV], q [B, H, LQ, D], k [B, HKV, LK, D], v [B, HKV, LK, DV], lse / delta [B, H, LQ], all
// contiguous; grads: dq, dk, dv shaped as q, k, v (dk and dv summed over the H / HKV query heads of a K/V
// head). mask: see VF_MASK, element strides (0 = broadcast). threads <= 0: OpenMP's default.
extern "C" void VF_NAME(const float* dout, const float* q, const float* k, const float* v, const float* lse,
                        const float* delta, const void* mask, float* dq, float* dk, float* dv, int64_t B, int64_t H,
                        int64_t HKV, int64_t LQ, int64_t LK, float scale, int64_t msb, int64_t msh, int64_t msq,
                        int64_t msk, int64_t threads) {
  using namespace VF_NS;
  const int64_t nt = threads > 0 ? threads : omp_get_max_threads(), tasks = B * HKV, tiles = (LK + BK - 1) / BK;
  // Chunks of K tiles per task so that every thread has one; each chunk past the first needs a dQ buffer.
  const int64_t split = std::max<int64_t>(1, std::min(tiles, (nt + tasks - 1) / tasks)), n = B * H * LQ * D;
  float* part = split > 1 ? static_cast<float*>(std::malloc((split - 1) * n * sizeof(float))) : nullptr;
  const int64_t chunks = part != nullptr ? split : 1;  // allocation failed: one chunk per task
  const vf_attn::Mask m{mask, msb, msh, msq, msk};
  const Args a{dout, q, k, v, lse, delta, dq, dk, dv, part, B, H, HKV, LQ, LK, scale};
#pragma omp parallel num_threads(nt)
  {
    Work* w = static_cast<Work*>(std::aligned_alloc(64, sizeof(Work)));
#pragma omp for collapse(3) schedule(dynamic)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t hk = 0; hk < HKV; ++hk)
        for (int64_t c = 0; c < chunks; ++c) task(*w, a, m, b, hk, c, chunks);
    std::free(w);
    if (chunks > 1) {
#pragma omp for schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        float s = dq[i];
        for (int64_t c = 1; c < chunks; ++c) s += part[(c - 1) * n + i];
        dq[i] = s;
      }
    }
  }
  std::free(part);
}
