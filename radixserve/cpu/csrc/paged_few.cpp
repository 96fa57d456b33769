// The paged kernel's few-query path: see paged_parts.h and paged_attention.cpp.
#include "paged_parts.h"
#include "scratch.h"

#ifdef __AVX__
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace radixserve::paged {
namespace {

// Vectors along head_dim: sixteen floats with AVX-512, else eight.
#ifdef __AVX512F__
using FV = f16v;
#else
using FV = f8;
#endif
constexpr int64_t kW = sizeof(FV) / sizeof(float);
typedef float FVu __attribute__((vector_size(sizeof(FV)), aligned(4), may_alias));
typedef uint32_t UV __attribute__((vector_size(sizeof(FV))));
typedef uint32_t UVu __attribute__((vector_size(sizeof(FV)), aligned(2), may_alias));

// Lane j of the result: the sum of a[j]'s lanes.
#ifdef __AVX512F__
// A tree of lane-block shuffles, each level halving the vectors and the lanes per key. It
// returns lane L's sum at lane 4 (L % 4) + L / 4 (a 4 x 4 transpose), so it is fed the
// accumulators in that order and returns them in key order.
inline FV halve(FV a, FV b, int level) {
  switch (level) {
    case 0:
      return _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)) +
             _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2));
    case 1:
      return _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)) +
             _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1));
    case 2:
      return _mm512_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)) +
             _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2));
    default:
      return _mm512_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)) +
             _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
  }
}

inline FV key_sums(const FV* a) {
  FV x[16];
  for (int t = 0; t < 16; ++t) x[t] = a[t / 4 + 4 * (t % 4)];
  for (int level = 0, n = 16; n > 1; ++level, n /= 2) {
    for (int t = 0; t < n / 2; ++t) x[t] = halve(x[2 * t], x[2 * t + 1], level);
  }
  return x[0];
}
#elif defined(__AVX__)
inline FV key_sums(const FV* a) {
  const __m256 h01 = _mm256_hadd_ps(a[0], a[1]), h23 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 h45 = _mm256_hadd_ps(a[4], a[5]), h67 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 lo = _mm256_hadd_ps(h01, h23), hi = _mm256_hadd_ps(h45, h67);
  return _mm256_add_ps(_mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31));
}
#else
inline FV key_sums(const FV* a) {
  FV s;
  for (int j = 0; j < kW; ++j) s[j] = hsum(a[j]);
  return s;
}
#endif

inline float hmax(FV v) {
  float m = v[0];
  for (int64_t j = 1; j < kW; ++j) m = std::max(m, v[j]);
  return m;
}

inline float hsum_fv(FV v) {
  float s = 0.0f;
  for (int64_t j = 0; j < kW; ++j) s += v[j];
  return s;
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

  // Keys [begin, stop) of `rows` (the pool slots of a stretch of context), spread over `calls`.
  void start(const int64_t* rows, int64_t begin, int64_t stop, int64_t calls) {
    slots = rows;
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
// products (kW keys' sums folded into one vector by key_sums), and V accumulates along
// head_dim for every query at once, each V vector loaded once. Keys go kFewKeys at a time:
// their scores take one online-softmax update, whose serial chain (max, exp, rescale) would
// otherwise dominate. Float K/V rows are read in place; bfloat16 rows are widened once per
// step for every query (see `chunk`). Needs head_dim % kChunkElems<KV> == 0.
constexpr int64_t kFewQueries = 4;
constexpr int64_t kFewKeys = 32;  // keys per softmax update (a multiple of kW)
constexpr int64_t kBlocks = kFewKeys / kW;

// Chunk c (kW floats) of a K/V row, in "chunk order": a float row's elements kW c .. kW c +
// kW - 1; of a bfloat16 row's 2 kW-element block c / 2, the even elements (c even) or the odd
// ones. A pair of bfloat16 read as one 32-bit lane is the even one's float after a shift and
// the odd one's after a mask, so widening costs one operation per kW values. Dot products and
// accumulations don't care about the order, as long as q and the output share it.
inline FV chunk(const float* row, int64_t c) { return *reinterpret_cast<const FVu*>(row + c * kW); }

inline FV chunk(const uint16_t* row, int64_t c) {
  const UV pairs = *reinterpret_cast<const UVu*>(row + (c / 2) * 2 * kW);
  const UV bits = c % 2 == 0 ? pairs << 16 : pairs & 0xFFFF0000u;
  FV f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Row elements per chunk-order block, and where lane `lane` of chunk c sits in the row.
template <typename KV>
constexpr int64_t kChunkElems = std::is_same_v<KV, float> ? kW : 2 * kW;

template <typename KV>
inline int64_t row_index(int64_t c, int64_t lane) {
  if constexpr (std::is_same_v<KV, float>) return c * kW + lane;
  return (c / 2) * 2 * kW + 2 * lane + c % 2;
}

// One KV head's step of up to kFewKeys keys for its NQ queries: scores, one softmax update
// each, then V into every query's output. k_chunk(j, c) / v_chunk(j, c): key j's chunk c.
template <int NQ, int64_t kC, typename KChunk, typename VChunk, typename Prefetch>
inline void few_step(const FV* q, FV* o, float* m, float* l, const int64_t* valid, int64_t n,
                     int64_t chunks, KChunk k_chunk, VChunk v_chunk, Prefetch& prefetch) {
  const int64_t C = kC ? kC : chunks;  // a constant for the common head sizes
  const FV lane_index = [] {
    FV v;
    for (int64_t j = 0; j < kW; ++j) v[j] = static_cast<float>(j);
    return v;
  }();
  alignas(64) float p[NQ][kFewKeys];
  float correction[NQ];
  for (int i = 0; i < NQ; ++i) {
    FV s[kBlocks];
    FV block_max = splat<FV>(kNone);
    for (int64_t b = 0; b < kBlocks; ++b) {
      const auto live = lane_index < static_cast<float>(valid[i] - b * kW);
      if (valid[i] <= b * kW) {
        s[b] = splat<FV>(kNone);
        continue;
      }
      prefetch.issue();
      FV acc[kW] = {};
      for (int64_t c = 0; c < C; ++c) {
        const FV qc = q[i * C + c];
        for (int64_t j = 0; j < kW; ++j) acc[j] += qc * k_chunk(b * kW + j, c);
      }
      s[b] = live ? key_sums(acc) : splat<FV>(kNone);
      block_max = vmax(block_max, s[b]);
    }
    const float mx = std::max(m[i], hmax(block_max));
    FV sum = {};
    for (int64_t b = 0; b < kBlocks; ++b) {
      const auto live = lane_index < static_cast<float>(valid[i] - b * kW);
      const FV e = live ? exp_nonpositive(s[b] - mx) : FV{};
      *reinterpret_cast<FVu*>(&p[i][b * kW]) = e;
      sum += e;
    }
    correction[i] = exp_nonpositive(splat<FV>(m[i] - mx))[0];
    m[i] = mx;
    l[i] = l[i] * correction[i] + hsum_fv(sum);
  }
  for (int64_t c = 0; c < C; ++c) {
    prefetch.issue();
    FV acc[NQ];
    for (int i = 0; i < NQ; ++i) acc[i] = o[i * C + c] * correction[i];
    for (int64_t j = 0; j < n; ++j) {
      const FV vj = v_chunk(j, c);
      for (int i = 0; i < NQ; ++i) acc[i] += p[i][j] * vj;
    }
    for (int i = 0; i < NQ; ++i) o[i * C + c] = acc[i];
  }
}

template <int64_t kD, int NQ, typename KV>
void run_item_few(const float* q, const Pools<KV>& pools, const Item& it, const int64_t* next,
                  const AttentionPlan& plan, const AttentionShape& shape, float* part_o,
                  float* part_m, float* part_l) {
  const int64_t H = shape.heads, HKV = shape.kv_heads, G = H / HKV;
  const int64_t D = kD ? kD : shape.head_dim, C = D / kW;  // constants for common sizes
  const int64_t* slots = pools.slots + it.key_start;

  // Query (h, i), index h * NQ + i: row i / G, query head h * G + i % G; in chunk order.
  FV* qv = scratch<FV, 0>(HKV * NQ * C);
  FV* ov = scratch<FV, 1>(HKV * NQ * C);
  float* m = scratch<float, 2>(HKV * NQ);
  float* l = scratch<float, 3>(HKV * NQ);
  std::fill(ov, ov + HKV * NQ * C, FV{});
  std::fill(m, m + HKV * NQ, kNone);
  std::fill(l, l + HKV * NQ, 0.0f);
  int64_t visible[NQ], max_seen = 0;
  for (int64_t i = 0; i < NQ; ++i) {
    visible[i] = it.visible(i / G);
    max_seen = std::max(max_seen, visible[i]);
    for (int64_t h = 0; h < HKV; ++h) {
      const float* src = q + (plan.q_index[it.row0 + i / G] * H + h * G + i % G) * D;
      for (int64_t c = 0; c < C; ++c)
        for (int64_t lane = 0; lane < kW; ++lane)
          qv[(h * NQ + i) * C + c][lane] = src[row_index<KV>(c, lane)] * shape.scale;
    }
  }

  KV* zeros = scratch<KV, 4>(D);  // the row of a missing key: a zero score weight, no NaN
  std::fill(zeros, zeros + D, KV{});
  const KV* k_row[kFewKeys];
  const KV* v_row[kFewKeys];
  // Float rows are read in place; bfloat16 rows are widened once per step, for all queries.
  constexpr bool kWiden = !std::is_same_v<KV, float>;
  FV* k_wide = scratch<FV, 5>(kWiden ? kFewKeys * C : 0);
  FV* v_wide = scratch<FV, 6>(kWiden ? kFewKeys * C : 0);
  const auto k_chunk = [&](int64_t j, int64_t c) {
    if constexpr (kWiden) return k_wide[j * C + c];
    return chunk(k_row[j], c);
  };
  const auto v_chunk = [&](int64_t j, int64_t c) {
    if constexpr (kWiden) return v_wide[j * C + c];
    return chunk(v_row[j], c);
  };
  SpreadPrefetch<KV> prefetch{pools, slots};
  const int64_t calls = HKV * (NQ * kBlocks + C);  // prefetch.issue()s in a step
  for (int64_t t0 = 0; t0 < max_seen; t0 += kFewKeys) {
    if (t0 + kFewKeys < max_seen) {  // this item's next keys
      prefetch.start(slots, t0 + kFewKeys, std::min(t0 + 2 * kFewKeys, max_seen), calls);
    } else if (next != nullptr) {  // the last step: the next item's first keys, which would
      // otherwise start it on a wait for memory
      prefetch.start(pools.slots + next[2], 0, std::min(kFewKeys, next[3]), calls);
    } else {
      prefetch.start(slots, 0, 0, calls);
    }
    const int64_t n = std::min(kFewKeys, max_seen - t0);
    int64_t valid[NQ];
    for (int i = 0; i < NQ; ++i) valid[i] = std::clamp<int64_t>(visible[i] - t0, 0, n);
    for (int64_t h = 0; h < HKV; ++h) {
      for (int64_t j = 0; j < kFewKeys; ++j) {
        const int64_t off = slots[t0 + std::min(j, n - 1)] * pools.row_stride + h * D;
        k_row[j] = j < n ? pools.k + off : zeros;
        v_row[j] = j < n ? pools.v + off : zeros;
        if constexpr (kWiden) {
          for (int64_t c = 0; c < C; ++c) {
            k_wide[j * C + c] = chunk(k_row[j], c);
            v_wide[j * C + c] = chunk(v_row[j], c);
          }
        }
      }
      few_step<NQ, kD / kW>(qv + h * NQ * C, ov + h * NQ * C, m + h * NQ, l + h * NQ, valid, n,
                            C, k_chunk, v_chunk, prefetch);
    }
  }

  for (int64_t h = 0; h < HKV; ++h) {
    for (int64_t i = 0; i < NQ; ++i) {
      const int64_t qi = h * NQ + i, row = it.row0 + i / G, hq = h * G + i % G;
      float* dst = part_o + (row * H + hq) * D;
      for (int64_t c = 0; c < C; ++c)
        for (int64_t lane = 0; lane < kW; ++lane)
          dst[row_index<KV>(c, lane)] = ov[qi * C + c][lane];
      part_m[row * H + hq] = m[qi];
      part_l[row * H + hq] = l[qi];
    }
  }
}

template <int64_t kD, typename KV>
void run_few_d(const float* q, const Pools<KV>& pools, const Item& it, const int64_t* next,
               const AttentionPlan& plan, const AttentionShape& shape, float* o, float* m,
               float* l) {
  switch (it.rows * (shape.heads / shape.kv_heads)) {
    case 1:
      return run_item_few<kD, 1, KV>(q, pools, it, next, plan, shape, o, m, l);
    case 2:
      return run_item_few<kD, 2, KV>(q, pools, it, next, plan, shape, o, m, l);
    case 3:
      return run_item_few<kD, 3, KV>(q, pools, it, next, plan, shape, o, m, l);
    default:
      return run_item_few<kD, 4, KV>(q, pools, it, next, plan, shape, o, m, l);
  }
}

}  // namespace

template <typename KV>
bool takes_few(int64_t rows, const AttentionShape& shape) {
  const int64_t nq = rows * (shape.heads / shape.kv_heads);
  return nq >= 1 && nq <= kFewQueries && shape.head_dim % kChunkElems<KV> == 0;
}

template <typename KV>
void run_few(const float* q, const Pools<KV>& pools, const int64_t* item, const int64_t* next,
             const AttentionPlan& plan, const AttentionShape& shape, float* part_o,
             float* part_m, float* part_l) {
  const Item it(item);
  auto run = shape.head_dim == 64    ? run_few_d<64, KV>
             : shape.head_dim == 128 ? run_few_d<128, KV>
                                     : run_few_d<0, KV>;
  run(q, pools, it, next, plan, shape, part_o, part_m, part_l);
}

#define RADIXSERVE_FEW(KV)                                                                  \
  template bool takes_few<KV>(int64_t, const AttentionShape&);                              \
  template void run_few<KV>(const float*, const Pools<KV>&, const int64_t*, const int64_t*, \
                            const AttentionPlan&, const AttentionShape&, float*, float*, float*);
RADIXSERVE_FEW(float)
RADIXSERVE_FEW(uint16_t)

}  // namespace radixserve::paged
