// A linear layer for a few dozen rows on a weight packed once into column panels:
// y = x W^T, the shape of a decode step's projections and logits.
//
// Layouts (row-major, contiguous, float32):
//   w       [out, in]                     the checkpoint's own layout (packing input)
//   panels  [ceil(out / width), in, width] output columns grouped `width` at a time, so one
//                                          panel is a single stream of memory; the last one
//                                          zero-padded
//   x       [rows, in]
//   y       [rows, out]
// (float32; bfloat16 below)
#pragma once

#include <cstdint>

namespace radixserve {

// Output columns per panel (this build's vector width times the tile's vectors).
int64_t panel_width();

void pack_panels(const float* w, int64_t out, int64_t in, float* panels);

void panel_linear(const float* x, int64_t rows, int64_t in, const float* panels, int64_t out,
                  float* y);

// bfloat16 (as uint16_t bits) where the build has AVX512_BF16's dot products (kBf16Dot):
// panels [ceil(out / width), ceil(in / 2), width, 2] (input positions in pairs), y in bfloat16.
#if defined(__AVX512BF16__)
void pack_panels(const uint16_t* w, int64_t out, int64_t in, uint16_t* panels);
void panel_linear(const uint16_t* x, int64_t rows, int64_t in, const uint16_t* panels,
                  int64_t out, uint16_t* y);
#endif

}  // namespace radixserve
