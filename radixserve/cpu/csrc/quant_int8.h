// 4-bit quantized weights (quant_linear.h, groups of 32) times activations rounded to int8
// per group of 32: integer dot products, for a decode step's few rows.
#pragma once

#include <cstdint>

#include "quant_linear.h"

namespace radixserve {

// Whether this build has the integer path (x86 with AVX2).
bool int8_dot_supported();

// y [rows, out] = round8(x) [rows, in] @ w^T for a 4-bit w with groups of 32.
void quant_linear_int8(const float* x, int64_t rows, const QuantMatrix& w, float* y);

}  // namespace radixserve
