// Rows of attention scores turned into their softmax in place, for attention computed as two
// matrix products (scores = q k^T, then p v) where the products run faster in a GEMM library
// than in a fused kernel (see dense_blocks.py).
//   softmax_rows: s [rows, cols] (rows `stride` apart), already scaled; each row becomes
//                 exp(s - max) / sum and lse[r] = max + log(sum), the natural log of the
//                 row's softmax denominator (-inf, and a row of zeros, for a row of -inf)
#pragma once

#include <cstdint>

namespace radixserve {

void softmax_rows(float* s, int64_t rows, int64_t cols, int64_t stride, float* lse);

}  // namespace radixserve
