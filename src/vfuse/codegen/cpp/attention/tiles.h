// Register-tiled pieces shared by the flash-attention forward and backward templates.
//
// The forward keeps score-like tiles transposed, t[key][row] (BQ query rows contiguous), so that softmax
// statistics of W rows are one vector; the backward keeps them row-major, t[row][key], so that Q and dO
// rows are read in place and only the K / V tile is transposed, once for all its Q tiles. Element
// (key j, row r) of t is at t[j SJ + r SR]. Three products cover both passes:
//   scores:   t[j][r]    = sum_d y[j][d] zt[d][r]   (S = Q K^T, dP = dO V^T; y read in place; the
//                                                    backward passes rows as j and keys as r)
//   rows_acc: acc[r][c] += sum_j t(j, r) x[j][c]   (the forward's P V, after its rescale; dQ += dS K)
//   keys_acc: acc[j][c] += sum_r t(j, r) x[r][c]   (dV += P^T dO, dK += dS^T Q)
// Vectors are the simd prelude's (codegen/cpp/simd.py) at the schedule's width W; register tiles
// are 4 rows x TILE columns (then one narrower tile for the rest). Everything is a template on the sizes:
// one text, any instance.
#ifndef VF_ATTN_TILES_H
#define VF_ATTN_TILES_H
#include <algorithm>
#include <cstdint>
#include <limits>

namespace vf_attn {

template <class T> static inline T& at(float* p) { return *reinterpret_cast<T*>(p); }
template <class T> static inline const T& at(const float* p) { return *reinterpret_cast<const T*>(p); }

// n < W floats of a row's end, zeros after them.
template <class V> static inline V load_part(const float* p, int64_t n) {
  V r = {};
  for (int64_t q = 0; q < n; ++q) r[q] = p[q];
  return r;
}

// The W floats of a DD-long row at column c (only its valid ones at a row's end).
template <class V, int64_t DD> static inline V load_cols(const float* row, int64_t c) {
  constexpr int64_t W = sizeof(V) / sizeof(float);
  return DD % W == 0 || c + W <= DD ? vs_loadu<V>(row + c) : load_part<V>(row + c, DD - c);
}

template <class V, int64_t DD> static inline void store_cols(float* row, int64_t c, V x) {
  constexpr int64_t W = sizeof(V) / sizeof(float);
  if (DD % W == 0 || c + W <= DD) {
    vs_storeu<V>(row + c, x);
  } else {
    for (int64_t q = 0; q < DD - c; ++q) row[c + q] = x[q];
  }
}

// t[j][c0 : c0 + W NC] = y[j] . zt[:][c0 : ...] for rows j in [0, nk) of y (DD floats each) in blocks of 4; a
// block's rows past nk repeat the last row (never read).
template <class V, int NC, int64_t BQ, int64_t DD>
void scores_chunk(float (*t)[BQ], const float (*zt)[BQ], const float* y, int64_t nk, int64_t c0) {
  constexpr int64_t W = sizeof(V) / sizeof(float);
  for (int64_t j = 0; j < nk; j += 4) {
    const float* yr[4];
    for (int r = 0; r < 4; ++r) yr[r] = y + std::min(j + r, nk - 1) * DD;
    V acc[4][NC] = {};
    for (int64_t d = 0; d < DD; ++d) {
      V zv[NC];
#pragma GCC unroll 16
      for (int c = 0; c < NC; ++c) {
        zv[c] = at<V>(&zt[d][c0 + W * c]);
        vs_keep(zv[c]);
      }
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) {
        const V yb = vs_splat<V>(yr[r][d]);
#pragma GCC unroll 16
        for (int c = 0; c < NC; ++c) acc[r][c] += yb * zv[c];
      }
    }
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < NC; ++c) at<V>(&t[j + r][c0 + W * c]) = acc[r][c];
  }
}

// t[j][:] = y[j] . zt for rows j in [0, nk): the BQ columns (whole vectors) by register tiles of TILE,
// then the remaining vectors.
template <class V, int64_t TILE, int64_t BQ, int64_t DD>
void scores(float (*t)[BQ], const float (*zt)[BQ], const float* y, int64_t nk) {
  constexpr int64_t W = sizeof(V) / sizeof(float), FULL = BQ / TILE, TAIL = (BQ % TILE) / W;
  static_assert(BQ % W == 0, "score columns are whole vectors");
  for (int64_t c = 0; c < FULL; ++c) scores_chunk<V, TILE / W, BQ, DD>(t, zt, y, nk, TILE * c);
  if constexpr (TAIL > 0) scores_chunk<V, TAIL, BQ, DD>(t, zt, y, nk, TILE * FULL);
}

// dst[c][r] = src[r][c] * scale for r < n rows of src (SS floats apart), c < DD, and 0 for rows [n, NR):
// a tile transposed into DS-float rows. 8 x 8 blocks go through registers on AVX (unpack, shuffle,
// permute of 128-bit halves); the rest, and every other tier, element by element (g++ would gather).
template <int64_t DD, int64_t NR, int64_t DS>
void transpose_rows(float* dst, const float* src, int64_t ss, int64_t n, float scale) {
  int64_t r0 = 0, c0 = 0;
#if defined(__AVX__)
  const __m256 f = _mm256_set1_ps(scale);
  for (; r0 + 8 <= n; r0 += 8) {
    for (c0 = 0; c0 + 8 <= DD; c0 += 8) {
      __m256 x[8], y[8];
      for (int r = 0; r < 8; ++r) x[r] = _mm256_mul_ps(_mm256_loadu_ps(src + (r0 + r) * ss + c0), f);
      for (int r = 0; r < 8; r += 2) {
        y[r] = _mm256_unpacklo_ps(x[r], x[r + 1]);
        y[r + 1] = _mm256_unpackhi_ps(x[r], x[r + 1]);
      }
      for (int r = 0; r < 8; r += 4) {
        x[r] = _mm256_shuffle_ps(y[r], y[r + 2], 0x44);
        x[r + 1] = _mm256_shuffle_ps(y[r], y[r + 2], 0xEE);
        x[r + 2] = _mm256_shuffle_ps(y[r + 1], y[r + 3], 0x44);
        x[r + 3] = _mm256_shuffle_ps(y[r + 1], y[r + 3], 0xEE);
      }
      // x[0..3]: columns 0, 1, 2, 3 of rows 0-3 (low half) and 4-7 of rows 0-3 (high); x[4..7]: rows 4-7.
      for (int c = 0; c < 4; ++c) {
        _mm256_storeu_ps(dst + (c0 + c) * DS + r0, _mm256_permute2f128_ps(x[c], x[c + 4], 0x20));
        _mm256_storeu_ps(dst + (c0 + c + 4) * DS + r0, _mm256_permute2f128_ps(x[c], x[c + 4], 0x31));
      }
    }
    for (int64_t c = c0; c < DD; ++c)
      for (int64_t r = r0; r < r0 + 8; ++r) dst[c * DS + r] = src[r * ss + c] * scale;
  }
#endif
  for (int64_t c = 0; c < DD; ++c)
    for (int64_t r = r0; r < NR; ++r) dst[c * DS + r] = r < n ? src[r * ss + c] * scale : 0.0f;
}

// How rows_acc starts a row: from acc, from 0, or from acc times the row's factor (the forward's
// online-softmax rescale).
enum Init { ADD = 0, ZERO = 1, RESCALE = 2 };

// acc[r][c0 : c0 + W NC] = init + sum_{j < nk} t(j, r) x[j][...] for rows [0, nr) in blocks of 4
// (acc and `scale` have whole blocks).
template <class V, int NC, int64_t SJ, int64_t SR, int64_t DD, int64_t STRIDE, Init INIT>
void rows_chunk(float* acc, const float* t, const float* x, int64_t nr, int64_t nk, int64_t c0, const float* scale) {
  constexpr int64_t W = sizeof(V) / sizeof(float);
  for (int64_t i = 0; i < nr; i += 4) {
    V a[4][NC];
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      const V f = INIT == RESCALE ? vs_splat<V>(scale[i + r]) : V{};
#pragma GCC unroll 16
      for (int c = 0; c < NC; ++c) {
        if constexpr (INIT == ZERO) {
          a[r][c] = V{};
        } else if constexpr (INIT == RESCALE) {
          a[r][c] = f * at<V>(acc + (i + r) * STRIDE + c0 + W * c);
        } else {
          a[r][c] = at<V>(acc + (i + r) * STRIDE + c0 + W * c);
        }
      }
    }
    for (int64_t j = 0; j < nk; ++j) {
      V xv[NC];
#pragma GCC unroll 16
      for (int c = 0; c < NC; ++c) {
        xv[c] = load_cols<V, DD>(x + j * DD, c0 + W * c);
        vs_keep(xv[c]);
      }
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) {
        const V p = vs_splat<V>(t[j * SJ + (i + r) * SR]);
#pragma GCC unroll 16
        for (int c = 0; c < NC; ++c) a[r][c] += p * xv[c];
      }
    }
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < NC; ++c) at<V>(acc + (i + r) * STRIDE + c0 + W * c) = a[r][c];
  }
}

// acc[j][c0 : c0 + W NC] += sum_{r < nr} t(j, r) x[r][...] for rows j in [0, nk) in blocks of 4.
template <class V, int NC, int64_t SJ, int64_t SR, int64_t DD, int64_t STRIDE>
void keys_chunk(float* acc, const float* t, const float* x, int64_t nk, int64_t nr, int64_t c0) {
  constexpr int64_t W = sizeof(V) / sizeof(float);
  for (int64_t j = 0; j < nk; j += 4) {
    V a[4][NC];
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r)
#pragma GCC unroll 16
      for (int c = 0; c < NC; ++c) a[r][c] = at<V>(acc + (j + r) * STRIDE + c0 + W * c);
    for (int64_t i = 0; i < nr; ++i) {
      V xv[NC];
#pragma GCC unroll 16
      for (int c = 0; c < NC; ++c) {
        xv[c] = load_cols<V, DD>(x + i * DD, c0 + W * c);
        vs_keep(xv[c]);
      }
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) {
        const V p = vs_splat<V>(t[(j + r) * SJ + i * SR]);
#pragma GCC unroll 16
        for (int c = 0; c < NC; ++c) a[r][c] += p * xv[c];
      }
    }
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < NC; ++c) at<V>(acc + (j + r) * STRIDE + c0 + W * c) = a[r][c];
  }
}

// The column chunks of DD (padded to whole vectors) by TILE, then the remaining vectors.
template <class V, int64_t TILE, int64_t SJ, int64_t SR, int64_t DD, int64_t STRIDE, Init INIT>
void rows_acc(float* acc, const float* t, const float* x, int64_t nr, int64_t nk, const float* scale = nullptr) {
  constexpr int64_t W = sizeof(V) / sizeof(float), DDP = (DD + W - 1) / W * W;
  constexpr int64_t FULL = DDP / TILE, TAIL = (DDP % TILE) / W;
  for (int64_t c = 0; c < FULL; ++c)
    rows_chunk<V, TILE / W, SJ, SR, DD, STRIDE, INIT>(acc, t, x, nr, nk, TILE * c, scale);
  if constexpr (TAIL > 0) rows_chunk<V, TAIL, SJ, SR, DD, STRIDE, INIT>(acc, t, x, nr, nk, TILE * FULL, scale);
}

template <class V, int64_t TILE, int64_t SJ, int64_t SR, int64_t DD, int64_t STRIDE>
void keys_acc(float* acc, const float* t, const float* x, int64_t nk, int64_t nr) {
  constexpr int64_t W = sizeof(V) / sizeof(float), DDP = (DD + W - 1) / W * W;
  constexpr int64_t FULL = DDP / TILE, TAIL = (DDP % TILE) / W;
  for (int64_t c = 0; c < FULL; ++c) keys_chunk<V, TILE / W, SJ, SR, DD, STRIDE>(acc, t, x, nk, nr, TILE * c);
  if constexpr (TAIL > 0) keys_chunk<V, TAIL, SJ, SR, DD, STRIDE>(acc, t, x, nk, nr, TILE * FULL);
}

struct Mask {  // element (b, h, i, j) at p + b*sb + h*sh + i*sq + j*sk; strides 0 broadcast
  const void* p;
  int64_t sb, sh, sq, sk;
};

// The mask (KIND 1: additive float, 2: bool keep-mask) and the causal cut (top-left aligned: key
// k0 + j is visible from rows q0 + i >= k0 + j) on the scores t of keys [k0, k0 + nk), rows [q0, q0 + nq).
template <int KIND, bool CAUSAL, int64_t BQ>
void apply_mask(float (*t)[BQ], const Mask& m, int64_t b, int64_t h, int64_t q0, int64_t nq, int64_t k0, int64_t nk) {
  constexpr float NEG_INF = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < nk; ++j) {
    float* s = t[j];
    const int64_t off = b * m.sb + h * m.sh + q0 * m.sq + (k0 + j) * m.sk;
    if constexpr (KIND == 1) {
      const float* col = static_cast<const float*>(m.p) + off;
      for (int64_t i = 0; i < nq; ++i) s[i] += col[i * m.sq];
    } else if constexpr (KIND == 2) {
      const uint8_t* col = static_cast<const uint8_t*>(m.p) + off;
      for (int64_t i = 0; i < nq; ++i) s[i] = col[i * m.sq] ? s[i] : NEG_INF;
    }
    if constexpr (CAUSAL)
      for (int64_t i = 0; i < std::min(nq, k0 + j - q0); ++i) s[i] = NEG_INF;
  }
}

// The same on row-major scores s[row][key] (the backward's): rows [0, nq), keys [0, nk).
template <int KIND, bool CAUSAL, int64_t BK>
void apply_mask_rows(float (*s)[BK], const Mask& m, int64_t b, int64_t h, int64_t q0, int64_t nq, int64_t k0,
                     int64_t nk) {
  constexpr float NEG_INF = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < nq; ++i) {
    float* row = s[i];
    const int64_t off = b * m.sb + h * m.sh + (q0 + i) * m.sq + k0 * m.sk;
    if constexpr (KIND == 1) {
      const float* p = static_cast<const float*>(m.p) + off;
      for (int64_t j = 0; j < nk; ++j) row[j] += p[j * m.sk];
    } else if constexpr (KIND == 2) {
      const uint8_t* p = static_cast<const uint8_t*>(m.p) + off;
      for (int64_t j = 0; j < nk; ++j) row[j] = p[j * m.sk] ? row[j] : NEG_INF;
    }
    if constexpr (CAUSAL)
      for (int64_t j = std::max<int64_t>(0, q0 + i - k0 + 1); j < nk; ++j) row[j] = NEG_INF;
  }
}


// Dropout on probabilities, the mask drawn from vfuse's counter RNG (ir/defs/rng.py): score element
// idx (its flat index in [B, H, LQ, LK]) is kept when uniform(seed, stream, idx) >= p, i.e. when
// mix32(mix32(lo(idx) ^ key.lo) ^ hi(idx) ^ key.hi) >> 8 >= thr with thr = ceil(p 2^24) (p as fp32,
// as the reference compares); kept values are scaled by 1 / (1 - p). The forward and the backward
// draw the same bits, so nothing of the mask is stored.
struct Dropout {
  uint32_t lo, hi, thr;
  float scale;
};

static inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16; return x;
}

static inline Dropout dropout_key(int64_t seed, int64_t stream, uint32_t thr, float scale) {
  const uint64_t s = (uint64_t)seed, st = (uint64_t)stream;
  return {mix32((uint32_t)(s + st * 0x9E3779B9ull)), mix32((uint32_t)((s >> 32) ^ st)), thr, scale};
}

// uint32 vectors as wide as a float vector (a vector_size on a dependent size is not one in g++).
template <int BYTES> struct U32Vec;
template <> struct U32Vec<16> { typedef uint32_t T __attribute__((vector_size(16))); };
template <> struct U32Vec<32> { typedef uint32_t T __attribute__((vector_size(32))); };
template <> struct U32Vec<64> { typedef uint32_t T __attribute__((vector_size(64))); };

template <class U> static inline U mix32v(U x) {
  x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16; return x;
}

// The dropout factors (scale or 0) of the W score elements idx0 + lane * step.
template <class V> static inline V keep_scale(const Dropout& d, uint64_t idx0, uint64_t step) {
  constexpr int W = sizeof(V) / sizeof(float);
  typedef typename U32Vec<sizeof(V)>::T U;
  V out;
  if ((idx0 >> 32) == ((idx0 + (W - 1) * step) >> 32)) {  // one high word for all lanes (nearly always)
    U lane;
    for (int q = 0; q < W; ++q) lane[q] = (uint32_t)q;
    const U x = (uint32_t)idx0 + lane * (uint32_t)step;  // low words wrap as the indices' do
    U h = mix32v<U>(x ^ d.lo);
    h = mix32v<U>(h ^ ((uint32_t)(idx0 >> 32) ^ d.hi));
    out = (h >> 8) >= d.thr ? vs_splat<V>(d.scale) : V{};
  } else {
    for (int q = 0; q < W; ++q) {
      const uint64_t i = idx0 + q * step;
      const uint32_t h = mix32(mix32((uint32_t)i ^ d.lo) ^ (uint32_t)(i >> 32) ^ d.hi);
      out[q] = (h >> 8) >= d.thr ? d.scale : 0.0f;
    }
  }
  return out;
}

}  // namespace vf_attn

#endif  // VF_ATTN_TILES_H
