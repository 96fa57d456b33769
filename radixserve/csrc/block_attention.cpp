// Many queries over one block of keys: see block_attention.h for layouts.
//
// Each KV head's keys are packed once into panels of kWidth keys ([head_dim][kWidth]), so a
// tile of query rows meets a panel as an outer product (the columns of panel_linear.cpp): a
// few key vectors loaded, a query element broadcast, rows x vectors multiply-adds. A tile's
// scores (rows x keys) stay in the core's cache through the softmax and the product with V,
// which runs the same way along head_dim (V rows as they are, a weight broadcast). Tiles are
// independent, so the threads share them out, light and heavy causal ones interleaved.
#include "block_attention.h"
#include "vec.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace radixserve {
namespace {

#if defined(__AVX512F__)
// 32 vector registers: scores in tiles of 8 rows x 3 vectors, outputs in 4 rows x 4 vectors.
using Vec = f16v;
constexpr int kLanes = 16;
constexpr int kRows = 8;
constexpr int kOutRows = 4;
#else
// 16 registers: 4 rows x 3 vectors, and 2 rows x 4 vectors.
using Vec = f8;
constexpr int kLanes = 8;
constexpr int kRows = 4;
constexpr int kOutRows = 2;
#endif
constexpr int kVecs = 3;
constexpr int64_t kWidth = kVecs * kLanes;  // keys per panel
constexpr int kOutVecs = 4;                 // head_dim goes kOutVecs vectors at a time
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

typedef float VecU __attribute__((vector_size(sizeof(Vec)), aligned(4), may_alias));
inline Vec loadv(const float* p) { return *reinterpret_cast<const VecU*>(p); }
inline void storev(float* p, Vec v) { *reinterpret_cast<VecU*>(p) = v; }

// Keys [p * kWidth, (p + 1) * kWidth) of KV head h as a panel [dim][kWidth]; keys past the
// end are zeros.
void pack_panel(const BlockInput& in, int64_t h, int64_t p, float* panel) {
  const int64_t dim = in.head_dim;
  for (int64_t c = 0; c < kWidth; ++c) {
    const int64_t key = p * kWidth + c;
    if (key >= in.keys) {
      for (int64_t d = 0; d < dim; ++d) panel[d * kWidth + c] = 0.0f;
      continue;
    }
    const int64_t row = in.key_rows ? in.key_rows[key] : key;
    const float* src = in.k + row * in.kv_stride + h * dim;
    for (int64_t d = 0; d < dim; ++d) panel[d * kWidth + c] = src[d];
  }
}

// s[r][key] = qt[r] . k[key] for kRows rows and the first n_panels panels.
void scores(const float* qt, int64_t dim, const float* panels, int64_t n_panels, float* s,
            int64_t ld) {
  for (int64_t p = 0; p < n_panels; ++p) {
    const float* w = panels + p * dim * kWidth;
    Vec acc[kRows][kVecs] = {};
    for (int64_t d = 0; d < dim; ++d) {
      Vec kv[kVecs];
      for (int v = 0; v < kVecs; ++v) kv[v] = loadv(w + d * kWidth + v * kLanes);
      for (int r = 0; r < kRows; ++r) {
        const Vec qb = Vec{} + qt[r * dim + d];
        for (int v = 0; v < kVecs; ++v) acc[r][v] += kv[v] * qb;
      }
    }
    for (int r = 0; r < kRows; ++r)
      for (int v = 0; v < kVecs; ++v) storev(s + r * ld + p * kWidth + v * kLanes, acc[r][v]);
  }
}

// The row's first n scores become exp(s - max) and the rest up to `zero_to` zeros; returns
// (max, sum of the exponentials), (-inf, 0) when n is 0.
std::pair<float, float> exponentiate(float* row, int64_t n, int64_t zero_to) {
  std::fill(row + n, row + zero_to, 0.0f);
  if (n == 0) return {kNegInf, 0.0f};
  Vec mv = Vec{} + kNegInf;
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) mv = vmax(mv, loadv(row + c));
  float m = kNegInf;
  for (int i = 0; i < kLanes; ++i) m = std::max(m, mv[i]);
  for (; c < n; ++c) m = std::max(m, row[c]);
  Vec sv = {};
  for (c = 0; c + kLanes <= n; c += kLanes) {
    const Vec e = exp_nonpositive(loadv(row + c) - m);
    storev(row + c, e);
    sv += e;
  }
  float sum = 0.0f;
  for (int i = 0; i < kLanes; ++i) sum += sv[i];
  for (; c < n; ++c) sum += row[c] = std::exp(row[c] - m);
  return {m, sum};
}

// o[r][d0 : d0 + V * kLanes] = sum over the first n keys of p[r][key] * v_key[same], for R
// rows; key j's values for this KV head start at v + rows[j] * stride (v + j * stride when
// rows is null).
template <int R, int V>
void weigh_values(const float* p, int64_t ld, int64_t n, const float* v, const int64_t* rows,
                  int64_t stride, int64_t d0, float* o, int64_t dim) {
  Vec acc[R][V] = {};
  for (int64_t j = 0; j < n; ++j) {
    const float* vr = v + (rows ? rows[j] : j) * stride + d0;
    Vec vv[V];
    for (int u = 0; u < V; ++u) vv[u] = loadv(vr + u * kLanes);
    for (int r = 0; r < R; ++r) {
      const Vec pb = Vec{} + p[r * ld + j];
      for (int u = 0; u < V; ++u) acc[r][u] += vv[u] * pb;
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < V; ++u) storev(o + r * dim + d0 + u * kLanes, acc[r][u]);
}

template <int R>
void weigh_values_of(int vecs, const float* p, int64_t ld, int64_t n, const float* v,
                     const int64_t* rows, int64_t stride, int64_t d0, float* o, int64_t dim) {
  switch (vecs) {
    case 4: return weigh_values<R, 4>(p, ld, n, v, rows, stride, d0, o, dim);
    case 3: return weigh_values<R, 3>(p, ld, n, v, rows, stride, d0, o, dim);
    case 2: return weigh_values<R, 2>(p, ld, n, v, rows, stride, d0, o, dim);
    default: return weigh_values<R, 1>(p, ld, n, v, rows, stride, d0, o, dim);
  }
}

struct Block {
  const BlockInput& in;
  int64_t group;
  const float* panels;  // [kv_heads][n_panels][dim][kWidth]
  int64_t n_panels;
  float* out;
  float* lse;

  int64_t visible(int64_t token) const {
    if (in.causal_offset < 0) return in.keys;
    return std::clamp<int64_t>(in.causal_offset + token + 1, 0, in.keys);
  }

  // Rows [r0, r0 + kRows) of KV head h (row = token * group + query head of the group);
  // `buf` holds kRows score rows of n_panels * kWidth, then kRows rows of q and of output.
  void tile(int64_t h, int64_t r0, float* buf) const {
    const int64_t dim = in.head_dim, ld = n_panels * kWidth, rows = in.tokens * group;
    float* s = buf;
    float* qt = s + kRows * ld;
    float* o = qt + kRows * dim;
    int64_t vis[kRows], dst[kRows];
    int64_t most = 0;
    for (int r = 0; r < kRows; ++r) {
      const int64_t row = r0 + r, token = row / group, head = h * group + row % group;
      vis[r] = row < rows ? visible(token) : 0;
      dst[r] = token * in.heads + head;
      most = std::max(most, vis[r]);
      if (vis[r] == 0) {
        std::fill(qt + r * dim, qt + (r + 1) * dim, 0.0f);
        continue;
      }
      const float* src = in.q + (in.q_rows ? in.q_rows[token] : token) * in.q_stride + head * dim;
      for (int64_t d = 0; d < dim; ++d) qt[r * dim + d] = src[d] * in.scale;
    }
    const int64_t used = (most + kWidth - 1) / kWidth;
    scores(qt, dim, panels + h * n_panels * dim * kWidth, used, s, ld);
    std::pair<float, float> soft[kRows];
    for (int r = 0; r < kRows; ++r) soft[r] = exponentiate(s + r * ld, vis[r], most);
    for (int r = 0; r < kRows; r += kOutRows) {
      for (int64_t d0 = 0; d0 < dim; d0 += kOutVecs * kLanes) {
        const int vecs = static_cast<int>(std::min<int64_t>(kOutVecs, (dim - d0) / kLanes));
        weigh_values_of<kOutRows>(vecs, s + r * ld, ld, most, in.v + h * dim, in.key_rows,
                                  in.kv_stride, d0, o + r * dim, dim);
      }
    }
    for (int r = 0; r < kRows && r0 + r < rows; ++r) {
      const auto [m, sum] = soft[r];
      const float inv = sum > 0 ? 1.0f / sum : 0.0f;
      for (int64_t d = 0; d < dim; ++d) out[dst[r] * dim + d] = o[r * dim + d] * inv;
      lse[dst[r]] = sum > 0 ? m + std::log(sum) : kNegInf;
    }
  }
};

}  // namespace

int64_t block_attention_dim_multiple() { return kLanes; }

void block_attention(const BlockInput& in, float* out, float* lse) {
  const int64_t dim = in.head_dim, n_panels = (in.keys + kWidth - 1) / kWidth;
  std::vector<float> panels(in.kv_heads * n_panels * dim * kWidth);
  at::parallel_for(0, in.kv_heads * n_panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      pack_panel(in, i / n_panels, i % n_panels, panels.data() + i * dim * kWidth);
    }
  });
  const Block block{in, in.heads / in.kv_heads, panels.data(), n_panels, out, lse};
  const int64_t tiles = (in.tokens * block.group + kRows - 1) / kRows;
  const int64_t buf_floats = kRows * (n_panels * kWidth + 2 * dim);
  at::parallel_for(0, in.kv_heads * tiles, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> buf(buf_floats);
    for (int64_t i = begin; i < end; ++i) {
      // First, last, second, second to last, ...: a contiguous share of the work holds
      // causal tiles of every length, not only the short or the long ones.
      const int64_t slot = i / in.kv_heads;
      const int64_t t = slot % 2 == 0 ? slot / 2 : tiles - 1 - slot / 2;
      block.tile(i % in.kv_heads, t * kRows, buf.data());
    }
  });
}

}  // namespace radixserve
