// Flash attention backward for CPUs (FlashAttention-2), one instance per head size and mask kind.
//
// vfuse.codegen.cpp.attention.render prepends the configuration: VF_NAME, VF_NS, VF_WORKSPACE_NAME,
// VF_D / VF_DV (q/k and v head sizes), VF_BQ / VF_BK (tile rows of Q / K), VF_CAUSAL, VF_MASK (0 none,
// 1 additive float, 2 boolean keep-mask), VF_VEC / VF_LANES (vector type and lanes) and VF_TILE (register
// tile width), all decided by the schedule; VF_DROPOUT, VF_DROP_THR, VF_DROP_SCALE: the forward's dropout on P,
// its mask drawn again from the seed and stream (the last arguments), vf_attn::Dropout.
//
// Nothing of size LQ x LK is stored: per (K tile, Q tile) the scores are recomputed from Q and K and
// turned into probabilities with the forward's logsumexp, P = exp(S - lse); then dV += P^T dO,
// dP = dO V^T, dS = P (dP - delta) with delta = rowsum(dO * O) (an input), dQ += dS K scale,
// dK += dS^T Q scale. With dropout (Z: the mask times 1 / (1 - p)): dV += (P Z)^T dO, dS = P (dP Z - delta). Score tiles are row-major (s[row][key]): Q and dO rows are read in place, and the
// K / V tile is transposed (K scaled) once for every Q tile and query head that reads it, not once per
// pair. Tasks are (batch, K/V head): a task owns its K/V head's dK and dV, accumulated over
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
static_assert(sizeof(V) == 4 * W && TILE % W == 0 && BQ % 4 == 0 && BK % W == 0,
              "tiles: BQ a multiple of 4, TILE and BK of the vector width");

using vf_attn::at;

// Everything the kernel allocates, once per thread; its size does not depend on LQ or LK.
struct alignas(64) Work {
  float kt[D][BK];    // K tile transposed, times the scale (zero columns past its keys)
  float vt[DV][BK];   // V tile transposed
  float s[BQ][BK];    // scores, then P, of (Q tile, K tile)
  float ds[BQ][BK];   // dP, then dS
  float dq[BQ][DP];   // dS K of this pair
  float dk[BK][DP];   // the K tile's dK over its group's heads and Q tiles (unscaled)
  float dv[BK][DVP];  // the K tile's dV
  float lse[BQ];      // +inf where no key was kept: P = 0 there
};

// Where a gradient's rows go: row (b, h, i) at p + b sb + h sh + i si (its D floats contiguous), so the
// gradients can be stored in the layout their consumer reads (the qkv projection's [B, L, 3, H, D]).
struct Rows {
  float* p;
  int64_t sb, sh, si;
  float* row(int64_t b, int64_t h, int64_t i) const { return p + b * sb + h * sh + i * si; }
};

struct Args {
  const float *dout, *q, *k, *v, *lse, *delta;
  Rows dq, dk, dv;
  float* part;  // dQ of K-tile chunks 1, 2, ... (each B * H * LQ * D, contiguous), when tasks are split
  int64_t B, H, HKV, LQ, LK;
  float scale;
  vf_attn::Dropout drop;  // VF_DROPOUT
};

// The K tile (nk rows from k, times the scale) and V tile transposed, zeros past nk; dK and dV zeroed.
void load_keys(Work& w, const float* k, const float* v, int64_t nk, float scale) {
  vf_attn::transpose_rows<D, BK, BK>(&w.kt[0][0], k, D, nk, scale);
  vf_attn::transpose_rows<DV, BK, BK>(&w.vt[0][0], v, DV, nk, 1.0f);
  std::fill(&w.dk[0][0], &w.dk[0][0] + BK * DP, 0.0f);
  std::fill(&w.dv[0][0], &w.dv[0][0] + BK * DVP, 0.0f);
}

// s = exp(s - lse) for rows [0, nq), keys [0, nk) in whole vectors (keys past nk are never read).
void probabilities(Work& w, const float* lse, int64_t nq, int64_t nk) {
  for (int64_t i = 0; i < nq; ++i) {
    const V l = vs_splat<V>(lse[i] != NEG_INF ? lse[i] : POS_INF);
    for (int64_t j = 0; j < nk; j += W) at<V>(&w.s[i][j]) = vs_exp(at<V>(&w.s[i][j]) - l);
  }
}

// ds = s * (ds - delta) for rows [0, nq), keys [0, nk) in whole vectors.
void score_grads(Work& w, const float* delta, int64_t nq, int64_t nk) {
  for (int64_t i = 0; i < nq; ++i) {
    const V dl = vs_splat<V>(delta[i]);
    for (int64_t j = 0; j < nk; j += W) at<V>(&w.ds[i][j]) = at<V>(&w.s[i][j]) * (at<V>(&w.ds[i][j]) - dl);
  }
}

// Dropout: ds = s * (ds Z - delta), then s = s Z, with Z the forward's mask times its scale; row i's
// keys start at flat index idx + i LK.
void score_grads_dropout(Work& w, const vf_attn::Dropout& d, const float* delta, uint64_t idx, int64_t lk, int64_t nq,
                         int64_t nk) {
  for (int64_t i = 0; i < nq; ++i) {
    const V dl = vs_splat<V>(delta[i]);
    for (int64_t j = 0; j < nk; j += W) {
      const V z = vf_attn::keep_scale<V>(d, idx + i * lk + j, 1), p = at<V>(&w.s[i][j]);
      at<V>(&w.ds[i][j]) = p * (at<V>(&w.ds[i][j]) * z - dl);
      at<V>(&w.s[i][j]) = p * z;
    }
  }
}

// One (K tile, query head, Q tile) pair: dV and dK of the K tile accumulate in w, dQ rows in dq_out.
void pair(Work& w, const Args& a, const vf_attn::Mask& m, const Rows& dq_out, int64_t b, int64_t h, int64_t q0,
          int64_t k0, int64_t nk) {
  const int64_t nq = std::min(BQ, a.LQ - q0), row = (b * a.H + h) * a.LQ + q0;
  const int64_t kv = (b * a.HKV + h / (a.H / a.HKV)) * a.LK + k0;
  const float *q = a.q + row * D, *dout = a.dout + row * DV, *k = a.k + kv * D;
  vf_attn::scores<V, TILE, BK, D>(w.s, w.kt, q, nq);  // S = Q (K scale)^T
  vf_attn::apply_mask_rows<VF_MASK, VF_CAUSAL, BK>(w.s, m, b, h, q0, nq, k0, nk);
  probabilities(w, a.lse + row, nq, nk);
  if constexpr (VF_DROPOUT) {
    vf_attn::scores<V, TILE, BK, DV>(w.ds, w.vt, dout, nq);  // dO V^T, then the mask on it and on P
    score_grads_dropout(w, a.drop, a.delta + row, (uint64_t)row * a.LK + k0, a.LK, nq, nk);
    vf_attn::keys_acc<V, TILE, 1, BK, DV, DVP>(&w.dv[0][0], &w.s[0][0], dout, nk, nq);  // dV += (P Z)^T dO
  } else {
    vf_attn::keys_acc<V, TILE, 1, BK, DV, DVP>(&w.dv[0][0], &w.s[0][0], dout, nk, nq);  // dV += P^T dO
    vf_attn::scores<V, TILE, BK, DV>(w.ds, w.vt, dout, nq);                                // dP = dO V^T
    score_grads(w, a.delta + row, nq, nk);
  }
  vf_attn::rows_acc<V, TILE, 1, BK, D, DP, vf_attn::ZERO>(&w.dq[0][0], &w.ds[0][0], k, nq, nk);  // dS K
  vf_attn::keys_acc<V, TILE, 1, BK, D, DP>(&w.dk[0][0], &w.ds[0][0], q, nk, nq);                // dK += dS^T Q
  for (int64_t i = 0; i < nq; ++i) {
    float* dq = dq_out.row(b, h, q0 + i);
    for (int64_t c = 0; c < D; ++c) dq[c] += w.dq[i][c] * a.scale;
  }
}

// Batch b, K/V head hk, chunk c of `split` over its K tiles: their dK / dV, and their part of dQ for the
// query heads reading them (chunk 0 into dq itself, the others into their part buffers).
void task(Work& w, const Args& a, const vf_attn::Mask& m, int64_t b, int64_t hk, int64_t c, int64_t split) {
  const int64_t group = a.H / a.HKV, h0 = hk * group, tiles = (a.LK + BK - 1) / BK;
  const Rows dq = c == 0 ? a.dq : Rows{a.part + (c - 1) * a.B * a.H * a.LQ * D, a.H * a.LQ * D, a.LQ * D, D};
  for (int64_t h = h0; h < h0 + group; ++h)
    for (int64_t i = 0; i < a.LQ; ++i) std::fill(dq.row(b, h, i), dq.row(b, h, i) + D, 0.0f);
  for (int64_t t = tiles * c / split; t < tiles * (c + 1) / split; ++t) {
    const int64_t k0 = t * BK, nk = std::min(BK, a.LK - k0), kv = (b * a.HKV + hk) * a.LK + k0;
    load_keys(w, a.k + kv * D, a.v + kv * DV, nk, a.scale);
    // Causal: rows before k0 see no key of this tile; a tile past LQ's rows keeps zero gradients.
    const int64_t first = VF_CAUSAL ? k0 / BQ * BQ : 0;
    for (int64_t h = h0; h < h0 + group; ++h)
      for (int64_t q0 = first; q0 < a.LQ; q0 += BQ) pair(w, a, m, dq, b, h, q0, k0, nk);
    for (int64_t j = 0; j < nk; ++j) {
      float *dk = a.dk.row(b, hk, k0 + j), *dv = a.dv.row(b, hk, k0 + j);
      for (int64_t e = 0; e < D; ++e) dk[e] = w.dk[j][e] * a.scale;
      for (int64_t e = 0; e < DV; ++e) dv[e] = w.dv[j][e];
    }
  }
}

}  // namespace VF_NS

extern "C" int64_t VF_WORKSPACE_NAME() { return sizeof(VF_NS::Work); }

// dout [B, H, LQ, DV], q [B, H, LQ, D], k [B, HKV, LK, D], v [B, HKV, LK, DV], lse / delta [B, H, LQ], all
// contiguous; grads: dq, dk, dv shaped as q, k, v (dk and dv summed over the H / HKV query heads of a K/V
// head), contiguous when gsi == 0, else every gradient's row (b, h, i) at b gsb + h gsh + i gsi floats from
// its pointer. mask: see VF_MASK, element strides (0 = broadcast). threads <= 0: OpenMP's default.
// VF_DROPOUT: then the forward's seed and stream.
extern "C" void VF_NAME(const float* dout, const float* q, const float* k, const float* v, const float* lse,
                        const float* delta, const void* mask, float* dq, float* dk, float* dv, int64_t B, int64_t H,
                        int64_t HKV, int64_t LQ, int64_t LK, float scale, int64_t msb, int64_t msh, int64_t msq,
                        int64_t msk, int64_t gsb, int64_t gsh, int64_t gsi, int64_t threads VF_DROPOUT_PARAMS) {
  using namespace VF_NS;
  const int64_t nt = threads > 0 ? threads : omp_get_max_threads(), tasks = B * HKV, tiles = (LK + BK - 1) / BK;
  // Chunks of K tiles per task so that every thread has one; each chunk past the first needs a dQ buffer.
  const int64_t split = std::max<int64_t>(1, std::min(tiles, (nt + tasks - 1) / tasks)), n = B * H * LQ * D;
  float* part = split > 1 ? static_cast<float*>(std::malloc((split - 1) * n * sizeof(float))) : nullptr;
  const int64_t chunks = part != nullptr ? split : 1;  // allocation failed: one chunk per task
  const vf_attn::Mask m{mask, msb, msh, msq, msk};
  const bool dense = gsi == 0;
  const Rows gq = dense ? Rows{dq, H * LQ * D, LQ * D, D} : Rows{dq, gsb, gsh, gsi};
  const Rows gk = dense ? Rows{dk, HKV * LK * D, LK * D, D} : Rows{dk, gsb, gsh, gsi};
  const Rows gv = dense ? Rows{dv, HKV * LK * DV, LK * DV, DV} : Rows{dv, gsb, gsh, gsi};
  const Args a{dout, q, k, v, lse, delta, gq, gk, gv, part, B, H, HKV, LQ, LK, scale, VF_DROPOUT_KEY};
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
      for (int64_t r = 0; r < B * H * LQ; ++r) {
        float* row = gq.row(r / (H * LQ), r / LQ % H, r % LQ);
        for (int64_t e = 0; e < D; ++e) {
          float s = row[e];
          for (int64_t c = 1; c < chunks; ++c) s += part[(c - 1) * n + r * D + e];
          row[e] = s;
        }
      }
    }
  }
  std::free(part);
}
