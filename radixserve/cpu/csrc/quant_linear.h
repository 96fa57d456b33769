// Linear layers on quantized weights, read as they are stored.
//
// A quantized weight [out, in] is codes plus, per group of `group` consecutive values of a
// row, a float32 scale and (optionally) offset: value = scale * (code - zero) + offset.
// Layouts (row-major, contiguous):
//   codes   bits 8: int8 [out, in], one code a byte
//           bits 4: uint8 [out, in / 2]; within each group, byte i holds value i in its low
//                   nibble and value i + group / 2 in its high nibble (GGUF's Q4 layout)
//   scale   float32 or float16 [out, in / group] (float16 where every value is one: GGUF's
//           Q4_0/Q4_1/Q8_0 store theirs so, K-quants' folded ones need float32)
//   offset  [out, in / group] in scale's type, or null for symmetric formats
//   x       float32 [rows, in];  y float32 [rows, out]
// Activations stay float32 (the product is the float product of the dequantized weight, in
// another order of additions), or, for few rows of a 4-bit weight, are rounded to int8.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace radixserve {

struct QuantMatrix {
  const uint8_t* codes;
  const void* scale;
  const void* offset;  // null: none
  int64_t out, in;
  int group;  // 16 or 32 with 8-bit codes, 32 with 4-bit ones
  int bits;   // 8 or 4
  int zero;   // subtracted from every code
  // rows up to which a 4-bit product rounds x to int8 per group of 32 and multiplies in
  // integers (quant_int8.h); 0: never, x stays float32
  int64_t int8_rows = 0;
  bool half = false;  // scale and offset hold float16 bits
};

// Entry i of a scale or offset array, float16 (H) or float32.
template <bool H>
inline float group_value(const void* p, int64_t i) {
  if constexpr (H) {
    return _cvtsh_ss(static_cast<const uint16_t*>(p)[i]);
  } else {
    return static_cast<const float*>(p)[i];
  }
}

inline float group_value(const QuantMatrix& w, const void* p, int64_t i) {
  return w.half ? group_value<true>(p, i) : group_value<false>(p, i);
}

bool quant_shape_supported(int group, int bits);

void quant_linear(const float* x, int64_t rows, const QuantMatrix& w, float* y);

// The float32 values of weight rows `rows` (null: every row, n = out) into y [n, in].
void dequantize_rows(const QuantMatrix& w, const int64_t* rows, int64_t n, float* y);

}  // namespace radixserve
