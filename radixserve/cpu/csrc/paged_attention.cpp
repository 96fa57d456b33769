// Paged attention kernels: see paged_attention.h for layouts and the plan.
//
// The inner loops are vectorised across *queries*, not across keys or head_dim: an item's
// queries for one KV head (rows x group heads) are packed eight to a vector, transposed once
// ([head_dim] vectors of 8 lanes). A key then contributes to eight scores with head_dim
// multiply-adds of a broadcast K element, and V is accumulated the same way into a
// transposed output. So K/V rows are read straight from the pool, once per item, with no
// gather, no transpose of K and no horizontal sums; the softmax is online (running max and
// sum per lane). Written with the compiler's vector extensions, so it builds for any x86 or
// ARM target and uses its widest float vectors up to 256 bits (see vec.h). Items of a decode
// row's few queries take the path in paged_few.cpp; block items, the block kernel's
// (block_attention.h). What the paths share: paged_parts.h.
#include "block_attention.h"
#include "paged_parts.h"
#include "scratch.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace radixserve {
namespace {
using namespace paged;

constexpr int64_t kAhead = 32;  // keys between a prefetch and its use

// Up to kKeys keys' rows of one KV head, packed as float rows ([kKeys][head_dim] from
// k_base()/v_base(), one base address for loops that broadcast single elements), so a
// bfloat16 element is widened once per step however many queries use it. Missing keys read
// zeros.
template <typename KV>
struct KeyStep {
  f8* k_buf;
  f8* v_buf;
  KV* zeros;

  explicit KeyStep(int64_t D)
      : k_buf(scratch<f8, 10>(kKeys * D / kLanes + 1)),
        v_buf(scratch<f8, 11>(kKeys * D / kLanes + 1)),
        zeros(scratch<KV, 12>(D)) {
    std::fill(zeros, zeros + D, KV{});
  }

  float* k_base() { return reinterpret_cast<float*>(k_buf); }
  float* v_base() { return reinterpret_cast<float*>(v_buf); }

  void load(const Pools<KV>& pools, const int64_t* slots, int64_t n, int64_t head, int64_t D) {
    for (int64_t j = 0; j < kKeys; ++j) {
      const int64_t off = slots[std::min(j, n - 1)] * pools.row_stride + head * D;
      pack(j < n ? pools.k + off : zeros, k_base() + j * D, D);
      pack(j < n ? pools.v + off : zeros, v_base() + j * D, D);
    }
  }

  static void pack(const KV* src, float* dst, int64_t D) {
    int64_t d = 0;
    for (; d + kLanes <= D; d += kLanes) *reinterpret_cast<f8u*>(dst + d) = load8(src + d);
    for (; d < D; ++d) dst[d] = to_float(src[d]);
  }
};

template <typename KV>
void prefetch_rows(const Pools<KV>& pools, const int64_t* slots, int64_t begin, int64_t end) {
  for (int64_t j = begin; j < end; ++j) {
    const char* kr = reinterpret_cast<const char*>(pools.k + slots[j] * pools.row_stride);
    const char* vr = reinterpret_cast<const char*>(pools.v + slots[j] * pools.row_stride);
    for (int64_t byte = 0; byte < pools.row_stride * int64_t(sizeof(KV)); byte += 64) {
      __builtin_prefetch(kr + byte);
      __builtin_prefetch(vr + byte);
    }
  }
}

// Query vectors of the many-query path: sixteen queries to a vector with AVX-512, whose 32
// registers also hold four such vectors' accumulators beside a step's broadcasts, so each
// K/V element loaded feeds four times the multiply-adds of one 8-wide vector (AVX2: eight
// queries a vector, two vectors a step, in its 16 registers).
#ifdef __AVX512F__
typedef f16v QV;
constexpr int64_t kQLanes = 16;
constexpr bool kWideStep = true;
#else
typedef f8 QV;
constexpr int64_t kQLanes = 8;
constexpr bool kWideStep = false;
#endif

// One step of kKeys packed keys ([kKeys][D] K and V) for NV adjacent query vectors (their
// transposed queries and outputs D vectors apart). Each broadcast K or V element feeds NV
// multiply-adds, and keys go four at a time, so the accumulators stay in registers.
template <int NV>
inline void attend_step(const QV* qv, QV* ov, QV* m, QV* l, const QV* seen, const float* kb,
                        const float* vb, int64_t t0, int64_t D) {
  QV s[NV][kKeys];
  for (int64_t j0 = 0; j0 < kKeys; j0 += 4) {
    QV acc[NV][4] = {};
    for (int64_t d = 0; d < D; ++d) {
      QV qd[NV];
      for (int n = 0; n < NV; ++n) qd[n] = qv[n * D + d];
      for (int64_t j = 0; j < 4; ++j) {
        const float kd = kb[(j0 + j) * D + d];
        for (int n = 0; n < NV; ++n) acc[n][j] += qd[n] * kd;
      }
    }
    for (int n = 0; n < NV; ++n)
      for (int64_t j = 0; j < 4; ++j) s[n][j0 + j] = acc[n][j];
  }
  QV p[NV][kKeys], correction[NV];
  for (int n = 0; n < NV; ++n) {
    QV mx = m[n];
    for (int64_t j = 0; j < kKeys; ++j) {
      s[n][j] = seen[n] > static_cast<float>(t0 + j) ? s[n][j] : splat<QV>(kNone);
      mx = vmax(mx, s[n][j]);
    }
    correction[n] = exp_nonpositive(m[n] - mx);
    QV sum = {};
    for (int64_t j = 0; j < kKeys; ++j) {
      p[n][j] = seen[n] > static_cast<float>(t0 + j) ? exp_nonpositive(s[n][j] - mx) : QV{};
      sum += p[n][j];
    }
    m[n] = mx;
    l[n] = l[n] * correction[n] + sum;
  }
  for (int64_t j0 = 0; j0 < kKeys; j0 += 4) {
    for (int64_t d = 0; d < D; ++d) {
      QV acc[NV];
      for (int n = 0; n < NV; ++n) acc[n] = j0 == 0 ? ov[n * D + d] * correction[n] : ov[n * D + d];
      for (int64_t j = 0; j < 4; ++j) {
        const float vd = vb[(j0 + j) * D + d];
        for (int n = 0; n < NV; ++n) acc[n] += p[n][j0 + j] * vd;
      }
      for (int n = 0; n < NV; ++n) ov[n * D + d] = acc[n];
    }
  }
}

// One item: a softmax state per (row, head) in (part_o, part_m, part_l), over its keys.
template <int64_t kD, typename KV>
void run_item(const float* q, const Pools<KV>& pools, const int64_t* item,
              const AttentionPlan& plan, const AttentionShape& shape, float* part_o,
              float* part_m, float* part_l) {
  const Item it(item);
  const int64_t row0 = it.row0, rows = it.rows;
  const int64_t H = shape.heads, HKV = shape.kv_heads, G = H / HKV;
  const int64_t D = kD ? kD : shape.head_dim;  // a constant for the common head sizes
  const int64_t nq = rows * G, nvec = (nq + kQLanes - 1) / kQLanes;
  const int64_t* slots = pools.slots + it.key_start;

  // Vector (h, vec), index h * nvec + vec, holds queries i = vec * kQLanes + lane of KV head h:
  // row i / G, query head h * G + i % G.
  QV* qt = scratch<QV, 13>(HKV * nvec * D);
  QV* ot = scratch<QV, 14>(HKV * nvec * D);
  QV* m = scratch<QV, 15>(HKV * nvec);
  QV* l = scratch<QV, 16>(HKV * nvec);
  QV* seen = scratch<QV, 17>(HKV * nvec);
  int64_t* seen_max = scratch<int64_t, 18>(HKV * nvec);
  int64_t max_seen = 0;
  for (int64_t h = 0; h < HKV; ++h) {
    for (int64_t vec = 0; vec < nvec; ++vec) {
      const int64_t hv = h * nvec + vec;
      QV vis = {};
      int64_t vis_max = 0;
      for (int64_t lane = 0; lane < kQLanes; ++lane) {
        const int64_t i = vec * kQLanes + lane;
        int64_t visible = 0;
        const float* src = nullptr;
        if (i < nq) {
          visible = it.visible(i / G);
          src = q + (plan.q_index[row0 + i / G] * H + h * G + i % G) * D;
        }
        for (int64_t d = 0; d < D; ++d) qt[hv * D + d][lane] = src ? src[d] * shape.scale : 0;
        vis[lane] = static_cast<float>(visible);
        vis_max = std::max(vis_max, visible);
      }
      seen[hv] = vis;
      seen_max[hv] = vis_max;
      max_seen = std::max(max_seen, vis_max);
      m[hv] = splat<QV>(kNone);
      l[hv] = QV{};
      for (int64_t d = 0; d < D; ++d) ot[hv * D + d] = QV{};
    }
  }

  // Keys step by step, every KV head of a slot in turn: a slot's row is one contiguous read
  // (and a page of slots a contiguous block), with the next step's rows prefetched.
  KeyStep<KV> step(D);
  const float* kb = step.k_base();
  const float* vb = step.v_base();
  for (int64_t t0 = 0; t0 < max_seen; t0 += kKeys) {
    prefetch_rows(pools, slots, std::min(t0 + kAhead, max_seen),
                  std::min(t0 + kAhead + kKeys, max_seen));
    for (int64_t h = 0; h < HKV; ++h) {
      step.load(pools, slots + t0, std::min(kKeys, max_seen - t0), h, D);
      for (int64_t vec = 0; vec < nvec; vec += 2) {
        const int64_t hv = h * nvec + vec;
        if (kWideStep && vec + 4 <= nvec && seen_max[hv + 3] > t0 && seen_max[hv] > t0) {
          attend_step<4>(qt + hv * D, ot + hv * D, &m[hv], &l[hv], &seen[hv], kb, vb, t0, D);
          vec += 2;
          continue;
        }
        const bool first = seen_max[hv] > t0;
        const bool second = vec + 1 < nvec && seen_max[hv + 1] > t0;
        const int64_t one = first ? hv : hv + 1;
        if (first && second) {
          attend_step<2>(qt + hv * D, ot + hv * D, &m[hv], &l[hv], &seen[hv], kb, vb, t0, D);
        } else if (first || second) {
          attend_step<1>(qt + one * D, ot + one * D, &m[one], &l[one], &seen[one], kb, vb, t0,
                         D);
        }
      }
    }
  }

  for (int64_t h = 0; h < HKV; ++h) {
    for (int64_t i = 0; i < nq; ++i) {
      const int64_t hv = h * nvec + i / kQLanes, lane = i % kQLanes;
      const int64_t row = row0 + i / G, hq = h * G + i % G;
      float* dst = part_o + (row * H + hq) * D;
      for (int64_t d = 0; d < D; ++d) dst[d] = ot[hv * D + d][lane];
      part_m[row * H + hq] = m[hv][lane];
      part_l[row * H + hq] = l[hv][lane];
    }
  }
}

// Combine every row of a token, per head, by log-sum-exp.
void merge_token(int64_t token, const AttentionPlan& plan, const AttentionShape& shape,
                 const float* part_o, const float* part_m, const float* part_l, float* out,
                 float* lse) {
  const int64_t H = shape.heads, D = shape.head_dim;
  const int64_t begin = plan.merge_indptr[token], end = plan.merge_indptr[token + 1];
  for (int64_t h = 0; h < H; ++h) {
    float mx = kNegInf;
    for (int64_t i = begin; i < end; ++i) mx = std::max(mx, part_m[plan.merge_rows[i] * H + h]);
    float* ov = out + (token * H + h) * D;
    std::fill(ov, ov + D, 0.0f);
    float total = 0.0f;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t row = plan.merge_rows[i];
      const float l = part_l[row * H + h];
      if (l == 0.0f) continue;
      const float w = std::exp(part_m[row * H + h] - mx);
      total += l * w;
      const float* src = part_o + (row * H + h) * D;
      for (int64_t d = 0; d < D; ++d) ov[d] += w * src[d];
    }
    const float inv = total > 0.0f ? 1.0f / total : 0.0f;
    for (int64_t d = 0; d < D; ++d) ov[d] *= inv;
    lse[token * H + h] = total > 0.0f ? mx + std::log(total) : kNegInf;
  }
}

// Runs block item `f` in the block kernel into its rows' partial states (the kernel's
// normalised output and log-sum-exp, which merge_token reads as m = lse, l = 1); false where
// the item is no block item or the kernel cannot take it (bfloat16 without AVX512_BF16).
template <typename KV>
bool run_block(const float* q, const Pools<KV>& pools, const int64_t* f, const AttentionPlan& plan,
               const AttentionShape& shape, float* part_o, float* part_m, float* part_l) {
  const Item it(f);
  const int64_t H = shape.heads, D = shape.head_dim;
  if (!it.block || it.causal_offset < it.num_keys || D % block_attention_dim_multiple() != 0 ||
      (!std::is_same_v<KV, float> && !kBf16Dot)) {
    return false;
  }
  BlockInput<KV> in{};
  std::vector<KV> q16;  // bfloat16: the kernel takes queries in the pool's type
  if constexpr (std::is_same_v<KV, float>) {
    in.q = q;
    in.q_stride = H * D;
    in.q_rows = plan.q_index + it.row0;
  } else {
    q16.resize(it.rows * H * D);
    at::parallel_for(0, it.rows, 16, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const float* src = q + plan.q_index[it.row0 + r] * H * D;
        for (int64_t i = 0; i < H * D; i += 8) store8(q16.data() + r * H * D + i, load8(src + i));
      }
    });
    in.q = q16.data();
    in.q_stride = H * D;
  }
  in.tokens = it.rows;
  in.heads = H;
  in.k = pools.k;
  in.v = pools.v;
  in.kv_stride = pools.row_stride;
  in.key_rows = pools.slots + it.key_start;
  in.keys = it.num_keys;
  in.kv_heads = shape.kv_heads;
  in.head_dim = D;
  in.scale = shape.scale;
  in.causal_offset = -1;  // every key visible
  if constexpr (std::is_same_v<KV, float>) {
    block_attention(in, part_o + it.row0 * H * D, part_m + it.row0 * H);
  } else {
#if defined(__AVX512BF16__)  // else kBf16Dot is false and this is never reached
    block_attention(in, part_o + it.row0 * H * D, part_m + it.row0 * H);
#endif
  }
  for (int64_t i = it.row0 * H; i < (it.row0 + it.rows) * H; ++i) {
    part_l[i] = std::isinf(part_m[i]) ? 0.0f : 1.0f;
  }
  return true;
}

}  // namespace

template <typename KV>
void paged_attention(const float* q, const KV* k_pool, const KV* v_pool, const int64_t* kv_slots,
                     const AttentionPlan& plan, const AttentionShape& shape, float* out,
                     float* lse) {
  const int64_t H = shape.heads, D = shape.head_dim;
  std::vector<float> part_o(plan.num_rows * H * D), part_m(plan.num_rows * H),
      part_l(plan.num_rows * H);
  const Pools<KV> pools{k_pool, v_pool, kv_slots, shape.kv_heads * D};
  // The block kernel's items first, each over every thread.
  std::vector<char> done(plan.num_items, 0);
  for (int64_t i = 0; i < plan.num_items; ++i) {
    done[i] = run_block(q, pools, plan.items + i * kItemFields, plan, shape, part_o.data(),
                        part_m.data(), part_l.data());
  }
  // Items differ in size (a long context's chunks, a short suffix): each thread takes the
  // next unclaimed item, rather than a fixed share of the list. It claims one item ahead, so
  // that a few-query item can fetch the first keys of the one its thread runs next.
  std::atomic<int64_t> next{0};
  const auto claim = [&] {
    int64_t i = next++;
    while (i < plan.num_items && done[i]) i = next++;
    return i;
  };
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    for (int64_t i = claim(); i < plan.num_items;) {
      const int64_t after = claim();
      const int64_t* item = plan.items + i * kItemFields;
      if (takes_few<KV>(item[1], shape)) {
        run_few<KV>(q, pools, item, after < plan.num_items ? plan.items + after * kItemFields
                                                           : nullptr,
                    plan, shape, part_o.data(), part_m.data(), part_l.data());
      } else {
        auto run = shape.head_dim == 64    ? run_item<64, KV>
                   : shape.head_dim == 128 ? run_item<128, KV>
                                           : run_item<0, KV>;
        run(q, pools, item, plan, shape, part_o.data(), part_m.data(), part_l.data());
      }
      i = after;
    }
  });
  at::parallel_for(0, plan.num_tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      merge_token(t, plan, shape, part_o.data(), part_m.data(), part_l.data(), out, lse);
    }
  });
}

template void paged_attention<float>(const float*, const float*, const float*, const int64_t*,
                                     const AttentionPlan&, const AttentionShape&, float*, float*);
template void paged_attention<uint16_t>(const float*, const uint16_t*, const uint16_t*,
                                        const int64_t*, const AttentionPlan&,
                                        const AttentionShape&, float*, float*);

}  // namespace radixserve
