// Attention of many queries over one block of keys held side by side (gathered from the pool,
// or a prompt's own new K/V): a prefix group's members over their shared path, or a prompt
// over itself, causally. The shape where the paged kernel's per-query vectors leave the
// machine's multiply-add rate unused and two GEMM calls with a softmax between them write
// every score to memory and read it back twice.
//
// Layouts (each row's heads and head_dim contiguous, rows any stride apart; out and lse float32):
//   q     [rows, heads, head_dim]      token t's queries: row q_rows[t] (row t without it)
//   k, v  [rows, kv_heads, head_dim]   key j: row key_rows[j] of each (row j without it)
//   out   [tokens, heads, head_dim]    contiguous
//   lse   [tokens, heads]              natural log of each row's softmax sum over scaled scores
// So a pool's slots and a batch's tokens are read in place, with no gather. Query head h
// reads KV head h / (heads / kv_heads). Token t sees every key when causal_offset < 0, else
// the first min(keys, causal_offset + t + 1) (none: out 0, lse -inf).
#pragma once

#include <cstdint>

namespace radixserve {

// head_dim must be a multiple of this (the build's float vector width).
int64_t block_attention_dim_multiple();

// T: float, or bfloat16 (as uint16_t bits) where the build has AVX512_BF16 (bf16_dot()).
template <typename T>
struct BlockInput {
  const T* q;
  int64_t q_stride;       // values between q rows
  const int64_t* q_rows;  // [tokens] or null
  int64_t tokens, heads;
  const T* k;
  const T* v;
  int64_t kv_stride;        // values between k (and v) rows
  const int64_t* key_rows;  // [keys] or null
  int64_t keys, kv_heads, head_dim;
  float scale;
  int64_t causal_offset;
};

void block_attention(const BlockInput<float>& in, float* out, float* lse);
#if defined(__AVX512BF16__)
void block_attention(const BlockInput<uint16_t>& in, float* out, float* lse);
#endif

}  // namespace radixserve
