// The decoder's elementwise steps fused into one pass each: residual add + RMSNorm, SiLU
// times up, rotary embedding in place. torch runs each as several operations, every one a
// pass over memory (and, for a decode step's few rows, a dispatch): RMSNorm alone is seven.
//
// Rounding follows transformers' order in the tensor's dtype: the residual sum is rounded,
// the norm is computed in float32 from it and rounded before the weight multiplies it; SiLU
// is rounded before the product; each rotary product is rounded before the sum. So bfloat16
// results match torch's operation by operation, up to float32 summation order. T is the
// storage type: float, or uint16_t holding bfloat16 bits.
#include "elementwise.h"

#include "vec.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

namespace radixserve {
namespace {

constexpr int64_t kGrain = 16;  // rows per parallel task

// A float rounded to the storage type and back: what an operation in that type keeps.
template <typename T, typename V>
inline V keep(V v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return round_bf16(v);
  }
}

template <typename T>
inline float keep1(float v) {
  return keep<T>(splat(v))[0];
}

template <typename T>
inline void store1(T* p, float v) {
  if constexpr (std::is_same_v<T, float>) {
    *p = v;
  } else {
    uint16_t b[8];
    store8(b, splat(v));
    *p = b[0];
  }
}

// x * sigmoid(x) from t = exp(-|x|), which never overflows: sigmoid is 1 / (1 + t) for
// x >= 0 and t / (1 + t) below, one division either way.
template <typename V>
inline V silu(V x) {
  const V t = exp_nonpositive(vmax(x, -x) * -1.0f);
  return x * ((x >= 0.0f ? splat<V>(1.0f) : t) / (1.0f + t));
}

// SiLU x up's vectors: sixteen floats with AVX-512 (a SiLU is some forty operations a vector,
// so the width halves their count), else eight.
#ifdef __AVX512F__
using SiluVec = f16v;
#else
using SiluVec = f8;
#endif

}  // namespace

template <typename T>
void add_rms_norm(const T* x, T* residual, const T* weight, int64_t rows, int64_t dim, float eps,
                  T* out) {
  at::parallel_for(0, rows, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * dim;
      T* res = residual != nullptr ? residual + r * dim : nullptr;
      f8 acc = {};
      float tail = 0.0f;
      int64_t d = 0;
      if (res != nullptr) {
        for (; d + 8 <= dim; d += 8) {
          const f8 v = keep<T>(load8(res + d) + load8(xr + d));
          store8(res + d, v);
          acc += v * v;
        }
        for (; d < dim; ++d) {
          const float v = keep1<T>(to_float(res[d]) + to_float(xr[d]));
          store1(res + d, v);
          tail += v * v;
        }
      } else {
        for (; d + 8 <= dim; d += 8) acc += load8(xr + d) * load8(xr + d);
        for (; d < dim; ++d) tail += to_float(xr[d]) * to_float(xr[d]);
      }
      const T* src = res != nullptr ? res : xr;
      const float inv = 1.0f / std::sqrt((hsum(acc) + tail) / static_cast<float>(dim) + eps);
      T* o = out + r * dim;
      for (d = 0; d + 8 <= dim; d += 8)
        store8(o + d, load8(weight + d) * keep<T>(load8(src + d) * inv));
      for (; d < dim; ++d) store1(o + d, to_float(weight[d]) * keep1<T>(to_float(src[d]) * inv));
    }
  });
}

template <typename T>
void silu_mul(const T* gate, const T* up, int64_t rows, int64_t dim, int64_t gate_stride,
              T* out) {
  at::parallel_for(0, rows, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* g = gate + r * gate_stride;
      const T* u = up + r * gate_stride;
      T* o = out + r * dim;
      int64_t d = 0;
      using V = SiluVec;
      constexpr int64_t kW = sizeof(V) / sizeof(float);
      for (; d + kW <= dim; d += kW) {
        store_vec(o + d, keep<T>(silu(load_vec<V>(g + d))) * load_vec<V>(u + d));
      }
      for (; d + 8 <= dim; d += 8) store8(o + d, keep<T>(silu(load8(g + d))) * load8(u + d));
      for (; d < dim; ++d) store1(o + d, keep1<T>(silu(splat(to_float(g[d])))[0]) * to_float(u[d]));
    }
  });
}

template <typename T>
void rope_inplace(T* x, int64_t tokens, int64_t heads, int64_t dim, int64_t token_stride,
                  const T* cos, const T* sin) {
  const int64_t half = dim / 2;
  at::parallel_for(0, tokens, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const T* c = cos + t * dim;
      const T* s = sin + t * dim;
      for (int64_t h = 0; h < heads; ++h) {
        T* v = x + t * token_stride + h * dim;
        int64_t i = 0;
        for (; i + 8 <= half; i += 8) {
          const f8 a = load8(v + i), b = load8(v + i + half);
          store8(v + i, keep<T>(a * load8(c + i)) + keep<T>(-b * load8(s + i)));
          store8(v + i + half, keep<T>(b * load8(c + i + half)) + keep<T>(a * load8(s + i + half)));
        }
        for (; i < half; ++i) {
          const float a = to_float(v[i]), b = to_float(v[i + half]);
          store1(v + i, keep1<T>(a * to_float(c[i])) + keep1<T>(-b * to_float(s[i])));
          store1(v + i + half,
                 keep1<T>(b * to_float(c[i + half])) + keep1<T>(a * to_float(s[i + half])));
        }
      }
    }
  });
}

// A greedy step's tokens: torch's argmax keeps an index beside every lane's running maximum;
// a vector max, then a scan for its first occurrence (in cache by then), is two plain passes.
void argmax_rows(const float* x, int64_t rows, int64_t n, int64_t* out) {
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = x + r * n;
      f8 mv = splat(-INFINITY);
      i8 nan = {};
      int64_t i = 0;
      for (; i + 8 <= n; i += 8) {
        const f8 v = load8(row + i);
        mv = vmax(mv, v);
        nan |= v != v;
      }
      float m = -INFINITY;
      bool has_nan = false;
      for (int j = 0; j < 8; ++j) {
        m = std::max(m, mv[j]);
        has_nan |= nan[j] != 0;
      }
      for (; i < n; ++i) {
        m = std::max(m, row[i]);
        has_nan |= std::isnan(row[i]);
      }
      int64_t at = 0;
      if (has_nan) {
        while (!std::isnan(row[at])) ++at;
      } else {
        for (at = 0; at + 8 <= n; at += 8) {
          const i8 hit = load8(row + at) == splat(m);
          bool any = false;
          for (int j = 0; j < 8; ++j) any |= hit[j] != 0;
          if (any) break;
        }
        while (row[at] != m) ++at;
      }
      out[r] = at;
    }
  });
}

#define RADIXSERVE_ELEMENTWISE(T)                                                         \
  template void add_rms_norm<T>(const T*, T*, const T*, int64_t, int64_t, float, T*);    \
  template void silu_mul<T>(const T*, const T*, int64_t, int64_t, int64_t, T*);          \
  template void rope_inplace<T>(T*, int64_t, int64_t, int64_t, int64_t, const T*, const T*);
RADIXSERVE_ELEMENTWISE(float)
RADIXSERVE_ELEMENTWISE(uint16_t)

}  // namespace radixserve
