// Fused elementwise steps of the decoder (see elementwise.cpp). Rows are contiguous; T is
// float, or uint16_t holding bfloat16 bits.
//   add_rms_norm: residual += x (when both are given; else the norm of x alone), then
//                 out = weight * rms_normalised(residual or x)
//   silu_mul:     out = silu(gate) * up, rows of gate/up `gate_stride` apart (halves of one
//                 fused projection, or two tensors)
//   rope_inplace: x [tokens, heads, dim] (tokens `token_stride` apart) rotated by cos/sin
//                 [tokens, dim], pairing each half of a head with the other
//   argmax_rows:  out[r] = the index of row r's largest value (float32 [rows, n]): the first
//                 of equal ones, or of a row holding NaN its first NaN, as torch.argmax
#pragma once

#include <cstdint>

namespace radixserve {

template <typename T>
void add_rms_norm(const T* x, T* residual, const T* weight, int64_t rows, int64_t dim, float eps,
                  T* out);

template <typename T>
void silu_mul(const T* gate, const T* up, int64_t rows, int64_t dim, int64_t gate_stride, T* out);

template <typename T>
void rope_inplace(T* x, int64_t tokens, int64_t heads, int64_t dim, int64_t token_stride,
                  const T* cos, const T* sin);

void argmax_rows(const float* x, int64_t rows, int64_t n, int64_t* out);

}  // namespace radixserve
