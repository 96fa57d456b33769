// Many queries over one block of keys: see block_attention.h for layouts.
//
// Each KV head's keys are packed once into panels of kWidth keys, so a tile of query rows
// meets a panel as an outer product (the columns of panel_linear.cpp): a few key vectors
// loaded, a query element broadcast, rows x vectors multiply-adds. A tile's scores (rows x
// keys) stay in the core's cache through the softmax and the product with V, which runs the
// same way along head_dim (a V row's vectors, a weight broadcast). Tiles are independent, so
// the threads share them out, light and heavy causal ones interleaved.
//
// bfloat16 (with AVX512_BF16) multiplies pairs: q and K in pairs of head_dim positions, the
// weights and V in pairs of keys (V repacked so), each pair one 32-bit lane of vdpbf16ps,
// which adds two products to a float32 sum per lane: twice float32's multiply-adds per
// instruction. The weights are rounded to bfloat16 for their product with V, as torch's
// flash kernel rounds them; scores, softmax and sums stay float32.
#include "block_attention.h"
#include "scratch.h"
#include "vec.h"

#include <ATen/Parallel.h>
#if defined(__AVX512F__) || defined(__AVX__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>

namespace radixserve {
namespace {

#if defined(__AVX512F__)
// 32 vector registers: scores and outputs both in tiles of 6 rows x 4 vectors (24 sums, four
// vectors loaded and one broadcast: 29 registers; 8 x 3 and 4 x 4 ran 5-10% slower here).
using Vec = f16v;
constexpr int kLanes = 16;
constexpr int kRows = 6;
constexpr int kOutRows = 6;
constexpr int kVecs = 4;
#else
// 16 registers: 4 rows x 3 vectors, and 2 rows x 4 vectors.
using Vec = f8;
constexpr int kLanes = 8;
constexpr int kRows = 4;
constexpr int kOutRows = 2;
constexpr int kVecs = 3;
#endif
constexpr int64_t kWidth = kVecs * kLanes;  // keys per panel
constexpr int kOutVecs = 4;                 // head_dim goes kOutVecs vectors at a time
constexpr float kNegInf = -std::numeric_limits<float>::infinity();


// dst[i * ld + j] = src[j][d0 + i] for i, j < kLanes: kLanes keys' words (32 bits each, moved
// as they are) turned into vectors along the keys in registers, a vector load and store per
// key rather than a scalar pair per word: a decode step repacks its shared prefix every layer.
#if defined(__AVX512F__)
inline void transpose(const float* const* src, int64_t d0, float* dst, int64_t ld) {
  __m512 r[16], t[16];
  for (int j = 0; j < 16; ++j) r[j] = _mm512_loadu_ps(src[j] + d0);
  for (int j = 0; j < 16; j += 2) {  // 32-bit pairs of rows j, j + 1
    t[j] = _mm512_unpacklo_ps(r[j], r[j + 1]);
    t[j + 1] = _mm512_unpackhi_ps(r[j], r[j + 1]);
  }
  for (int j = 0; j < 16; j += 4) {  // 64-bit pairs
    for (int u = 0; u < 2; ++u) {
      const __m512d a = _mm512_castps_pd(t[j + u]), b = _mm512_castps_pd(t[j + u + 2]);
      r[j + 2 * u] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
      r[j + 2 * u + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
    }
  }
  for (int j = 0; j < 16; j += 8) {  // 128-bit lanes
    for (int u = 0; u < 4; ++u) {
      t[j + u] = _mm512_shuffle_f32x4(r[j + u], r[j + u + 4], 0x88);
      t[j + u + 4] = _mm512_shuffle_f32x4(r[j + u], r[j + u + 4], 0xdd);
    }
  }
  for (int u = 0; u < 8; ++u) {  // 256-bit halves
    _mm512_storeu_ps(dst + u * ld, _mm512_shuffle_f32x4(t[u], t[u + 8], 0x88));
    _mm512_storeu_ps(dst + (u + 8) * ld, _mm512_shuffle_f32x4(t[u], t[u + 8], 0xdd));
  }
}
#elif defined(__AVX__)
inline void transpose(const float* const* src, int64_t d0, float* dst, int64_t ld) {
  __m256 r[8], t[8];
  for (int j = 0; j < 8; ++j) r[j] = _mm256_loadu_ps(src[j] + d0);
  for (int j = 0; j < 8; j += 2) {
    t[j] = _mm256_unpacklo_ps(r[j], r[j + 1]);
    t[j + 1] = _mm256_unpackhi_ps(r[j], r[j + 1]);
  }
  for (int j = 0; j < 8; j += 4) {
    for (int u = 0; u < 2; ++u) {
      const __m256d a = _mm256_castps_pd(t[j + u]), b = _mm256_castps_pd(t[j + u + 2]);
      r[j + 2 * u] = _mm256_castpd_ps(_mm256_unpacklo_pd(a, b));
      r[j + 2 * u + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(a, b));
    }
  }
  for (int u = 0; u < 4; ++u) {
    _mm256_storeu_ps(dst + u * ld, _mm256_permute2f128_ps(r[u], r[u + 4], 0x20));
    _mm256_storeu_ps(dst + (u + 4) * ld, _mm256_permute2f128_ps(r[u], r[u + 4], 0x31));
  }
}
#endif

// The values of one product step: float32 lanes, or bfloat16 pairs read as 32-bit lanes.
template <typename T>
using Word = std::conditional_t<std::is_same_v<T, float>, float, uint32_t>;

template <typename T>
const Word<T>* words(const T* p) {
  return reinterpret_cast<const Word<T>*>(p);
}

// A vector of words, bits as they are.
template <typename T>
inline Vec load_words(const Word<T>* p) {
  return load_vec<Vec>(reinterpret_cast<const float*>(p));
}

// acc + a * b lane by lane: float32 multiply-adds, or pairwise bfloat16 dot products.
template <typename T>
inline Vec madd(Vec acc, Vec a, Word<T> b) {
  if constexpr (std::is_same_v<T, float>) {
    return acc + a * b;
  } else {
#if defined(__AVX512BF16__)
    return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)_mm512_set1_epi32(static_cast<int>(b)));
#else
    static_assert(!std::is_same_v<T, T>, "bfloat16 blocks need AVX512_BF16");
#endif
  }
}

// Lanes of a product step: head_dim positions (pairs of them for bfloat16) for scores, keys
// (pairs of them) for outputs.
template <typename T>
constexpr int64_t kPer = std::is_same_v<T, float> ? 1 : 2;

template <typename T>
struct Block {
  const BlockInput<T>& in;
  int64_t group, n_panels;
  const Word<T>* panels;  // [kv_heads][n_panels][dim / kPer][kWidth]: K, by panel
  const Word<T>* values;  // bfloat16: [kv_heads][keys / 2][dim] (V by key pairs); else null
  float* out;
  float* lse;

  int64_t depth() const { return in.head_dim / kPer<T>; }
  // Floats between score rows: every panel's keys, and a vector more that the softmax may
  // zero and the bfloat16 rounding may read past the last visible key.
  int64_t ld() const { return n_panels * kWidth + kLanes; }

  // Panel p of KV head h's keys; keys past the end are zeros.
  void pack_panel(int64_t h, int64_t p, Word<T>* panel) const {
    // pool rows are scattered: ask for the next panel's now, while this one is packed
    for (int64_t c = 0; c < kWidth; ++c) {
      const int64_t key = (p + 1) * kWidth + c;
      if (key >= in.keys) break;
      const char* next = reinterpret_cast<const char*>(row(in.k, key) + h * in.head_dim);
      for (int64_t b = 0; b < in.head_dim * int64_t(sizeof(T)); b += 64) {
        __builtin_prefetch(next + b);
      }
    }
    // kLanes keys at a time, each key's row turned into a column; the keys past the end (in
    // the last panel only) read a row of zeros
    Word<T>* zeros = nullptr;
    if ((p + 1) * kWidth > in.keys) {
      zeros = scratch<Word<T>, 23>(depth());
      std::fill(zeros, zeros + depth(), Word<T>{});
    }
    const Word<T>* src[kLanes];
    for (int64_t c0 = 0; c0 < kWidth; c0 += kLanes) {
      for (int j = 0; j < kLanes; ++j) {
        const int64_t key = p * kWidth + c0 + j;
        src[j] = key < in.keys ? words(row(in.k, key) + h * in.head_dim) : zeros;
      }
      int64_t d = 0;
#if defined(__AVX512F__) || defined(__AVX__)
      for (; d + kLanes <= depth(); d += kLanes) {
        transpose(reinterpret_cast<const float* const*>(src), d,
                  reinterpret_cast<float*>(panel + d * kWidth + c0), kWidth);
      }
#endif
      for (; d < depth(); ++d)
        for (int j = 0; j < kLanes; ++j) panel[d * kWidth + c0 + j] = src[j][d];
    }
  }

  // Key pair jp of KV head h's values as [dim] pairs (a missing second key reads zero).
  void pack_values(int64_t h, int64_t jp, Word<T>* dst) const {
    const T* a = row(in.v, 2 * jp) + h * in.head_dim;
    const T* b = 2 * jp + 1 < in.keys ? row(in.v, 2 * jp + 1) + h * in.head_dim : nullptr;
    int64_t d = 0;
#if defined(__AVX512BF16__)
    if constexpr (!std::is_same_v<T, float>) {  // 32 elements of each row a step, interleaved
      const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                          40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33,
                                          1, 32, 0);
      const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
      for (; d + 32 <= in.head_dim; d += 32) {
        const __m512i va = _mm512_loadu_si512(a + d);
        const __m512i vb = b ? _mm512_loadu_si512(b + d) : _mm512_setzero_si512();
        _mm512_storeu_si512(dst + d, _mm512_permutex2var_epi16(va, lo, vb));
        _mm512_storeu_si512(dst + d + 16, _mm512_permutex2var_epi16(va, hi, vb));
      }
    }
#endif
    for (; d < in.head_dim; ++d) {
      const T pair[2] = {a[d], b ? b[d] : T{}};
      std::memcpy(dst + d, pair, sizeof pair);
    }
  }

  // Key `key`'s row of k or v.
  const T* row(const T* base, int64_t key) const {
    return base + (in.key_rows ? in.key_rows[key] : key) * in.kv_stride;
  }

  int64_t visible(int64_t token) const {
    if (in.causal_offset < 0) return in.keys;
    return std::clamp<int64_t>(in.causal_offset + token + 1, 0, in.keys);
  }

  // s[r][key] = scale * qt[r] . k[key] for kRows rows and the first `used` of one KV head's
  // panels.
  void scores(const T* qt, const Word<T>* panel, int64_t used, float* s, int64_t ld) const {
    for (int64_t p = 0; p < used; ++p, panel += depth() * kWidth) {
      Vec acc[kRows][kVecs] = {};
      for (int64_t d = 0; d < depth(); ++d) {
        Vec kv[kVecs];
        for (int v = 0; v < kVecs; ++v) kv[v] = load_words<T>(panel + d * kWidth + v * kLanes);
        for (int r = 0; r < kRows; ++r) {
          const Word<T> qb = words(qt + r * in.head_dim)[d];
          for (int v = 0; v < kVecs; ++v) acc[r][v] = madd<T>(acc[r][v], kv[v], qb);
        }
      }
      for (int r = 0; r < kRows; ++r)
        for (int v = 0; v < kVecs; ++v)
          store_vec(s + r * ld + p * kWidth + v * kLanes, acc[r][v] * in.scale);
    }
  }

  // o[r][d0 : d0 + V * kLanes] = sum over the first n keys of w[r][key] * v_key[same], for R
  // rows: float32 weights against V rows read in place (KV head h's, at v + h * dim), or
  // bfloat16 weight pairs against the packed key pairs.
  template <int R, int V>
  void weigh(const T* w, int64_t ld, int64_t n, int64_t h, int64_t d0, float* o) const {
    const int64_t dim = in.head_dim;
    Vec acc[R][V] = {};
    for (int64_t j = 0; j < n; j += kPer<T>) {
      const Word<T>* vr;
      if constexpr (std::is_same_v<T, float>) {
        vr = words(row(in.v, j) + h * dim) + d0;
      } else {
        vr = values + (h * ((in.keys + 1) / 2) + j / 2) * dim + d0;
      }
      Vec vv[V];
      for (int u = 0; u < V; ++u) vv[u] = load_words<T>(vr + u * kLanes);
      for (int r = 0; r < R; ++r) {
        const Word<T> wb = words(w + r * ld)[j / kPer<T>];
        for (int u = 0; u < V; ++u) acc[r][u] = madd<T>(acc[r][u], vv[u], wb);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int u = 0; u < V; ++u) store_vec(o + r * dim + d0 + u * kLanes, acc[r][u]);
  }

  template <int R>
  void weigh_of(int vecs, const T* w, int64_t ld, int64_t n, int64_t h, int64_t d0,
                float* o) const {
    switch (vecs) {
      case 4: return weigh<R, 4>(w, ld, n, h, d0, o);
      case 3: return weigh<R, 3>(w, ld, n, h, d0, o);
      case 2: return weigh<R, 2>(w, ld, n, h, d0, o);
      default: return weigh<R, 1>(w, ld, n, h, d0, o);
    }
  }

  // Rows [r0, r0 + kRows) of KV head h (row = token * group + query head of the group).
  // `buf`: kRows score rows of n_panels * kWidth floats, kRows output rows, then kRows rows
  // of q and (bfloat16) kRows rows of weights, as T.
  void tile(int64_t h, int64_t r0, float* buf) const {
    const int64_t dim = in.head_dim, ld = this->ld(), rows = in.tokens * group;
    float* s = buf;
    float* o = s + kRows * ld;
    T* qt = reinterpret_cast<T*>(o + kRows * dim);
    int64_t vis[kRows], dst[kRows];
    int64_t most = 0;
    for (int r = 0; r < kRows; ++r) {
      const int64_t row = r0 + r, token = row / group, head = h * group + row % group;
      vis[r] = row < rows ? visible(token) : 0;
      dst[r] = token * in.heads + head;
      most = std::max(most, vis[r]);
      if (vis[r] == 0) {  // past the last token (no q row to read), or seeing no key
        std::fill(qt + r * dim, qt + (r + 1) * dim, T{});
        continue;
      }
      const T* src = in.q + (in.q_rows ? in.q_rows[token] : token) * in.q_stride + head * dim;
      std::memcpy(qt + r * dim, src, dim * sizeof(T));
    }
    const int64_t used = (most + kWidth - 1) / kWidth;
    scores(qt, panels + h * n_panels * depth() * kWidth, used, s, ld);
    std::pair<float, float> soft[kRows];
    for (int r = 0; r < kRows; ++r) soft[r] = exponentiate(s + r * ld, vis[r], most);
    const T* w = weights(s, ld, most, qt + kRows * dim);
    for (int r = 0; r < kRows; r += kOutRows) {
      for (int64_t d0 = 0; d0 < dim; d0 += kOutVecs * kLanes) {
        const int vecs = static_cast<int>(std::min<int64_t>(kOutVecs, (dim - d0) / kLanes));
        weigh_of<kOutRows>(vecs, w + r * ld, ld, most, h, d0, o + r * dim);
      }
    }
    for (int r = 0; r < kRows && r0 + r < rows; ++r) {
      const auto [m, sum] = soft[r];
      const float inv = sum > 0 ? 1.0f / sum : 0.0f;
      for (int64_t d = 0; d < dim; ++d) out[dst[r] * dim + d] = o[r * dim + d] * inv;
      lse[dst[r]] = sum > 0 ? m + std::log(sum) : kNegInf;
    }
  }

  // The weights as the product with V reads them: the scores themselves, or rounded to
  // bfloat16 (`most` rounded up to a whole pair; the scores past it are zeros).
  const T* weights(const float* s, int64_t ld, int64_t most, T* w16) const {
    if constexpr (std::is_same_v<T, float>) {
      return s;
    } else {
#if defined(__AVX512BF16__)
      for (int r = 0; r < kRows; ++r)
        for (int64_t c = 0; c < most + 1; c += kLanes) {
          const __m256bh h = _mm512_cvtneps_pbh(load_vec<Vec>(s + r * ld + c));
          std::memcpy(w16 + r * ld + c, &h, sizeof h);
        }
#endif
      return w16;
    }
  }

  // The row's first n scores become exp(s - max) and the rest up to `zero_to` zeros; returns
  // (max, sum of the exponentials), (-inf, 0) when n is 0.
  static std::pair<float, float> exponentiate(float* row, int64_t n, int64_t zero_to) {
    std::fill(row + n, row + zero_to + 1, 0.0f);  // one on: a pair's second may read it
    if (n == 0) return {kNegInf, 0.0f};
    Vec mv = Vec{} + kNegInf;
    int64_t c = 0;
    for (; c + kLanes <= n; c += kLanes) mv = vmax(mv, load_vec<Vec>(row + c));
    float m = kNegInf;
    for (int i = 0; i < kLanes; ++i) m = std::max(m, mv[i]);
    for (; c < n; ++c) m = std::max(m, row[c]);
    Vec sv = {};
    for (c = 0; c + kLanes <= n; c += kLanes) {
      const Vec e = exp_nonpositive(load_vec<Vec>(row + c) - m);
      store_vec(row + c, e);
      sv += e;
    }
    float sum = 0.0f;
    for (int i = 0; i < kLanes; ++i) sum += sv[i];
    for (; c < n; ++c) sum += row[c] = std::exp(row[c] - m);
    return {m, sum};
  }
};

template <typename T>
void run(const BlockInput<T>& in, float* out, float* lse) {
  const int64_t dim = in.head_dim, n_panels = (in.keys + kWidth - 1) / kWidth;
  const int64_t pairs = std::is_same_v<T, float> ? 0 : (in.keys + 1) / 2;
  Block<T> block{in, in.heads / in.kv_heads, n_panels, nullptr, nullptr, out, lse};
  // every value is written by the packing: no zeroing first
  const std::unique_ptr<Word<T>[]> panels(
      new Word<T>[in.kv_heads * n_panels * block.depth() * kWidth]);
  const std::unique_ptr<Word<T>[]> values(new Word<T>[in.kv_heads * pairs * dim]);
  const int64_t pack_units = n_panels + pairs;
  at::parallel_for(0, in.kv_heads * pack_units, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t h = i / pack_units, u = i % pack_units;
      if (u < n_panels) {
        block.pack_panel(h, u, panels.get() + (h * n_panels + u) * block.depth() * kWidth);
      } else {
        block.pack_values(h, u - n_panels, values.get() + (h * pairs + u - n_panels) * dim);
      }
    }
  });
  block.panels = panels.get();
  block.values = values.get();
  const int64_t tiles = (in.tokens * block.group + kRows - 1) / kRows;
  const int64_t ld = block.ld();
  // scores, outputs, q rows and bfloat16 weights (as floats, rounded up)
  const int64_t buf_floats = kRows * (ld + dim) + kRows * (dim + ld) * sizeof(T) / 4;
  at::parallel_for(0, in.kv_heads * tiles, 1, [&](int64_t begin, int64_t end) {
    float* buf = scratch<float, 22>(buf_floats);
    for (int64_t i = begin; i < end; ++i) {
      // KV head by KV head, so a thread's next tile reads the panels and values already in
      // its cache; within one, first, last, second, second to last, ...: a contiguous share
      // of the work holds causal tiles of every length, not only the short or long ones.
      const int64_t slot = i % tiles;
      const int64_t t = slot % 2 == 0 ? slot / 2 : tiles - 1 - slot / 2;
      block.tile(i / tiles, t * kRows, buf);
    }
  });
}

}  // namespace

int64_t block_attention_dim_multiple() { return kLanes; }

void block_attention(const BlockInput<float>& in, float* out, float* lse) { run(in, out, lse); }

#if defined(__AVX512BF16__)
void block_attention(const BlockInput<uint16_t>& in, float* out, float* lse) {
  run(in, out, lse);
}
#endif

}  // namespace radixserve
