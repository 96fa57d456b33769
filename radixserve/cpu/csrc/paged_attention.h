// Paged attention over the KV pool, read in place by slot index.
//
// Layouts (row-major, contiguous):
//   q        [num_tokens, heads, head_dim]      float32
//   k, v     [num_slots, kv_heads, head_dim]    float32 or bfloat16 (as uint16_t bits)
//   out      [num_tokens, heads, head_dim]      float32
//   lse      [num_tokens, heads]                float32, natural log of the softmax sum
// Query head h reads KV head h / (heads / kv_heads).
//
// The work comes as a plan of items. Item i covers `rows` consecutive entries of `q_index`
// (each a token of q) against `num_keys` slots starting at `kv_slots[key_start]`; its r-th row
// sees the first clamp(causal_offset + r, 0, num_keys) of those keys. Every row leaves a
// partial softmax state; `merge_indptr`/`merge_rows` list, per token, the rows to combine.
// A decode, an extend and a shared-prefix (cascade) group are all just sets of items. An item
// marked `block` (every row seeing every key) runs in the block kernel (block_attention.h)
// where the pool is float32, before the others, over every thread.
#pragma once

#include <cstdint>

namespace radixserve {

// row0, rows, key_start, num_keys, causal_offset, block
constexpr int64_t kItemFields = 6;

struct AttentionPlan {
  const int64_t* items;  // [num_items, kItemFields]
  int64_t num_items;
  const int64_t* q_index;  // [num_rows] token of each row
  int64_t num_rows;
  const int64_t* merge_indptr;  // [num_tokens + 1]
  const int64_t* merge_rows;    // [num_rows] rows grouped by token
  int64_t num_tokens;
};

struct AttentionShape {
  int64_t heads;
  int64_t kv_heads;
  int64_t head_dim;
  float scale;
};

template <typename KV>
void paged_attention(const float* q, const KV* k_pool, const KV* v_pool, const int64_t* kv_slots,
                     const AttentionPlan& plan, const AttentionShape& shape, float* out,
                     float* lse);

// Bytes of `a` and `b` that agree, counted in whole `unit`-byte tokens.
int64_t matching_prefix(const char* a, int64_t a_len, const char* b, int64_t b_len, int64_t unit);

}  // namespace radixserve
