// A linear layer for a few rows: y = x W^T, the shape of a decode step's projections.
//
// Layouts (row-major, contiguous):
//   x  [rows, in]     float32
//   w  [out, in]      float32 or bfloat16 (as uint16_t bits), the checkpoint's own layout
//   y  [rows, out]    float32
#pragma once

#include <cstdint>

namespace radixserve {

template <typename W>
void linear_rows(const float* x, int64_t rows, int64_t in, const W* w, int64_t out, float* y);

}  // namespace radixserve
