// The paged kernel's few-query path: see paged_parts.h and paged_attention.cpp.
#include "paged_parts.h"

#ifdef __AVX__
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

namespace radixserve::paged {
namespace {

// Lane j of the result: the sum of a[j]'s lanes.
inline f8 hsum8(const f8* a) {
#ifdef __AVX__
  const __m256 h01 = _mm256_hadd_ps(a[0], a[1]), h23 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 h45 = _mm256_hadd_ps(a[4], a[5]), h67 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 lo = _mm256_hadd_ps(h01, h23), hi = _mm256_hadd_ps(h45, h67);
  return _mm256_add_ps(_mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31));
#else
  f8 s;
  for (int j = 0; j < kKeys; ++j) s[j] = hsum(a[j]);
  return s;
#endif
}

inline float hmax(f8 v) {
  return std::max(std::max(std::max(v[0], v[4]), std::max(v[1], v[5])),
                  std::max(std::max(v[2], v[6]), std::max(v[3], v[7])));
}

// Cache lines of future rows (K and V, every KV head), handed to the prefetcher a few at a
// time between computations: a burst of hundreds would fill the core's miss buffers and
// stall the arithmetic behind it, so memory and compute would take turns instead of
// overlapping.
template <typename KV>
struct SpreadPrefetch {
  const Pools<KV>& pools;
  const int64_t* slots;
  int64_t key = 0, end = 0, byte = 0, per_call = 0;

  void start(int64_t begin, int64_t stop, int64_t calls) {
    key = begin;
    end = stop;
    byte = 0;
    const int64_t lines = (stop - begin) * pools.row_stride * int64_t(sizeof(KV)) / 64;
    per_call = (std::max<int64_t>(lines, 0) + calls - 1) / std::max<int64_t>(calls, 1);
  }

  void issue() {
    const int64_t row_bytes = pools.row_stride * int64_t(sizeof(KV));
    for (int64_t n = 0; n < per_call && key < end; ++n) {
      const int64_t off = slots[key] * pools.row_stride;
      __builtin_prefetch(reinterpret_cast<const char*>(pools.k + off) + byte);
      __builtin_prefetch(reinterpret_cast<const char*>(pools.v + off) + byte);
      byte += 64;
      if (byte >= row_bytes) {
        byte = 0;
        ++key;
      }
    }
  }
};

// An item with at most kFewQueries queries per KV head (a decode row: one token's query
// heads of a group). Vectors run along head_dim instead: a query's scores come from dot
// products, and V accumulates along head_dim, so no lane idles. Keys go kFewKeys at a time:
// their scores (eight to a vector) take one online-softmax update, whose serial chain
// (max, exp, rescale) would otherwise dominate. Float K/V rows are read in place; bfloat16
// rows are widened once per step (see `chunk`). Needs head_dim % kChunkElems<KV> == 0.
constexpr int64_t kFewQueries = 4;
constexpr int64_t kFewKeys = 32;  // keys per softmax update (a multiple of kKeys)

// Chunk c (eight floats) of a K/V row, in "chunk order": a float row's elements 8c..8c+7; of a
// bfloat16 row's 16-element block c / 2, the even elements (c even) or the odd ones. A pair of
// bfloat16 read as one 32-bit lane is the even one's float after a shift and the odd one's
// after a mask, so widening costs one operation per eight values. Dot products and
// accumulations don't care about the order, as long as q and the output share it.
inline f8 chunk(const float* row, int64_t c) { return load8(row + c * kLanes); }

typedef uint32_t u32x8u __attribute__((vector_size(32), aligned(2), may_alias));
inline f8 chunk(const uint16_t* row, int64_t c) {
  const u32x8 pairs = *reinterpret_cast<const u32x8u*>(row + (c / 2) * 2 * kLanes);
  const u32x8 bits = c % 2 == 0 ? pairs << 16 : pairs & 0xFFFF0000u;
  f8 f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Row elements per chunk-order block, and where lane `lane` of chunk c sits in the row.
template <typename KV>
constexpr int64_t kChunkElems = std::is_same_v<KV, float> ? kLanes : 2 * kLanes;

template <typename KV>
inline int64_t row_index(int64_t c, int64_t lane) {
  if constexpr (std::is_same_v<KV, float>) return c * kLanes + lane;
  return (c / 2) * 2 * kLanes + 2 * lane + c % 2;
}

template <int64_t kD, typename KV>
void run_item_few(const float* q, const Pools<KV>& pools, const int64_t* item,
                  const AttentionPlan& plan, const AttentionShape& shape, float* part_o,
                  float* part_m, float* part_l) {
  const Item it(item);
  const int64_t row0 = it.row0, rows = it.rows;
  const int64_t H = shape.heads, HKV = shape.kv_heads, G = H / HKV;
  const int64_t D = kD ? kD : shape.head_dim;  // a constant for the common head sizes
  const int64_t nq = rows * G, C = D / kLanes;
  const int64_t* slots = pools.slots + it.key_start;

  // Query (h, i), index h * nq + i: row i / G, query head h * G + i % G; in chunk order.
  std::vector<f8> qv(HKV * nq * C), ov(HKV * nq * C);
  std::vector<float> m(HKV * nq, kNone), l(HKV * nq, 0.0f);
  std::vector<int64_t> visible(nq);
  int64_t max_seen = 0;
  for (int64_t i = 0; i < nq; ++i) {
    visible[i] = it.visible(i / G);
    max_seen = std::max(max_seen, visible[i]);
    for (int64_t h = 0; h < HKV; ++h) {
      const float* src = q + (plan.q_index[row0 + i / G] * H + h * G + i % G) * D;
      for (int64_t c = 0; c < C; ++c) {
        for (int64_t lane = 0; lane < kLanes; ++lane)
          qv[(h * nq + i) * C + c][lane] = src[row_index<KV>(c, lane)] * shape.scale;
        ov[(h * nq + i) * C + c] = f8{};
      }
    }
  }

  const std::vector<KV> zeros(D);  // the row of a missing key: a zero score weight, no NaN
  const KV* k_row[kFewKeys];
  const KV* v_row[kFewKeys];
  // Float rows are read in place; bfloat16 rows are widened once per step, for all queries.
  constexpr bool kWiden = !std::is_same_v<KV, float>;
  std::vector<f8> k_wide(kWiden ? kFewKeys * C : 0), v_wide(kWiden ? kFewKeys * C : 0);
  const auto k_chunk = [&](int64_t j, int64_t c) {
    if constexpr (kWiden) return k_wide[j * C + c];
    return chunk(k_row[j], c);
  };
  const auto v_chunk = [&](int64_t j, int64_t c) {
    if constexpr (kWiden) return v_wide[j * C + c];
    return chunk(v_row[j], c);
  };
  const f8 lane_index = {0, 1, 2, 3, 4, 5, 6, 7};
  SpreadPrefetch<KV> prefetch{pools, slots};
  for (int64_t t0 = 0; t0 < max_seen; t0 += kFewKeys) {
    prefetch.start(std::min(t0 + 2 * kFewKeys, max_seen), std::min(t0 + 3 * kFewKeys, max_seen),
                   HKV * nq * (kFewKeys / kKeys + 1));
    const int64_t n = std::min(kFewKeys, max_seen - t0);
    for (int64_t h = 0; h < HKV; ++h) {
      for (int64_t j = 0; j < kFewKeys; ++j) {
        const int64_t off = slots[t0 + std::min(j, n - 1)] * pools.row_stride + h * D;
        k_row[j] = j < n ? pools.k + off : zeros.data();
        v_row[j] = j < n ? pools.v + off : zeros.data();
        if (kWiden && j < n) {
          for (int64_t c = 0; c < C; ++c) {
            k_wide[j * C + c] = chunk(k_row[j], c);
            v_wide[j * C + c] = chunk(v_row[j], c);
          }
        }
      }
      for (int64_t i = 0; i < nq; ++i) {
        const int64_t valid = std::min(visible[i] - t0, n);
        if (valid <= 0) continue;
        const int64_t qi = h * nq + i, blocks = (valid + kKeys - 1) / kKeys;
        const f8* qr = qv.data() + qi * C;
        // Scores of up to kFewKeys keys, eight to a vector, then one softmax update for all.
        f8 s[kFewKeys / kKeys];
        f8 block_max = splat(kNone);
        for (int64_t b = 0; b < blocks; ++b) {
          prefetch.issue();
          f8 acc[kKeys] = {};
          for (int64_t c = 0; c < C; ++c) {
            const f8 qc = qr[c];
            for (int64_t j = 0; j < kKeys; ++j) acc[j] += qc * k_chunk(b * kKeys + j, c);
          }
          const auto live = lane_index < static_cast<float>(valid - b * kKeys);
          s[b] = live ? hsum8(acc) : splat(kNone);
          block_max = vmax(block_max, s[b]);
        }
        const float mx = std::max(m[qi], hmax(block_max));
        f8 sum = {};
        for (int64_t b = 0; b < blocks; ++b) {
          const auto live = lane_index < static_cast<float>(valid - b * kKeys);
          s[b] = live ? exp_nonpositive(s[b] - mx) : f8{};
          sum += s[b];
        }
        const float correction = exp_nonpositive(splat(m[qi] - mx))[0];
        m[qi] = mx;
        l[qi] = l[qi] * correction + hsum(sum);
        f8* o = ov.data() + qi * C;
        prefetch.issue();
        for (int64_t c = 0; c < C; ++c) {
          f8 acc = o[c] * correction;
          for (int64_t b = 0; b < blocks; ++b)
            for (int64_t j = 0; j < kKeys; ++j) acc += s[b][j] * v_chunk(b * kKeys + j, c);
          o[c] = acc;
        }
      }
    }
  }

  for (int64_t h = 0; h < HKV; ++h) {
    for (int64_t i = 0; i < nq; ++i) {
      const int64_t qi = h * nq + i, row = row0 + i / G, hq = h * G + i % G;
      float* dst = part_o + (row * H + hq) * D;
      for (int64_t c = 0; c < C; ++c)
        for (int64_t lane = 0; lane < kLanes; ++lane)
          dst[row_index<KV>(c, lane)] = ov[qi * C + c][lane];
      part_m[row * H + hq] = m[qi];
      part_l[row * H + hq] = l[qi];
    }
  }
}

}  // namespace

template <typename KV>
bool takes_few(int64_t rows, const AttentionShape& shape) {
  return rows * (shape.heads / shape.kv_heads) <= kFewQueries &&
         shape.head_dim % kChunkElems<KV> == 0;
}

template <typename KV>
void run_few(const float* q, const Pools<KV>& pools, const int64_t* item,
             const AttentionPlan& plan, const AttentionShape& shape, float* part_o,
             float* part_m, float* part_l) {
  auto run = shape.head_dim == 64    ? run_item_few<64, KV>
             : shape.head_dim == 128 ? run_item_few<128, KV>
                                     : run_item_few<0, KV>;
  run(q, pools, item, plan, shape, part_o, part_m, part_l);
}

#define RADIXSERVE_FEW(KV)                                                                  \
  template bool takes_few<KV>(int64_t, const AttentionShape&);                              \
  template void run_few<KV>(const float*, const Pools<KV>&, const int64_t*,                 \
                            const AttentionPlan&, const AttentionShape&, float*, float*, float*);
RADIXSERVE_FEW(float)
RADIXSERVE_FEW(uint16_t)

}  // namespace radixserve::paged
