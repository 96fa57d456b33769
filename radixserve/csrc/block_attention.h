// Attention of many queries over one block of keys held side by side (gathered from the pool,
// or a prompt's own new K/V): a prefix group's members over their shared path, or a prompt
// over itself, causally. The shape where the paged kernel's per-query vectors leave the
// machine's multiply-add rate unused and two GEMM calls with a softmax between them write
// every score to memory and read it back twice.
//
// Layouts (row-major, contiguous, float32):
//   q     [tokens, heads, head_dim]
//   k, v  [keys, kv_heads, head_dim]
//   out   [tokens, heads, head_dim]
//   lse   [tokens, heads]   natural log of each row's softmax sum over scaled scores
// Query head h reads KV head h / (heads / kv_heads). Token t sees every key when
// causal_offset < 0, else the first min(keys, causal_offset + t + 1) (none: out 0, lse -inf).
#pragma once

#include <cstdint>

namespace radixserve {

// head_dim must be a multiple of this (the build's float vector width).
int64_t block_attention_dim_multiple();

void block_attention(const float* q, int64_t tokens, int64_t heads, const float* k,
                     const float* v, int64_t keys, int64_t kv_heads, int64_t head_dim,
                     float scale, int64_t causal_offset, float* out, float* lse);

}  // namespace radixserve
