// Row-wise softmax in place with each row's log-sum-exp (see softmax_rows.h). One pass for
// the maximum and one that exponentiates, sums and scales while the row (a few KiB) is in
// the core's cache: torch's softmax and logsumexp take one pass each over the scores and
// another to apply the lse.
#include "softmax_rows.h"

#include "vec.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace radixserve {
namespace {

#ifdef __AVX512F__
using V = f16v;
#else
using V = f8;
#endif
constexpr int64_t kLanesV = sizeof(V) / sizeof(float);
constexpr int64_t kGrain = 8;  // rows per parallel task
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

typedef float Vu __attribute__((vector_size(sizeof(V)), aligned(4), may_alias));
inline V loadv(const float* p) { return *reinterpret_cast<const Vu*>(p); }
inline void storev(float* p, V v) { *reinterpret_cast<Vu*>(p) = v; }

void softmax_row(float* row, int64_t cols, float* lse) {
  V mv = splat<V>(kNegInf);
  int64_t c = 0;
  for (; c + kLanesV <= cols; c += kLanesV) mv = vmax(mv, loadv(row + c));
  float m = kNegInf;
  for (int64_t i = 0; i < kLanesV; ++i) m = std::max(m, mv[i]);
  for (; c < cols; ++c) m = std::max(m, row[c]);
  if (m == kNegInf) {  // nothing visible: no weights, and a state that merges as empty
    std::fill(row, row + cols, 0.0f);
    *lse = kNegInf;
    return;
  }
  V sv = {};
  c = 0;
  for (; c + kLanesV <= cols; c += kLanesV) {
    const V e = exp_nonpositive(loadv(row + c) - m);
    storev(row + c, e);
    sv += e;
  }
  float sum = 0.0f;
  for (int64_t i = 0; i < kLanesV; ++i) sum += sv[i];
  for (; c < cols; ++c) {
    row[c] = std::exp(row[c] - m);
    sum += row[c];
  }
  const float inv = 1.0f / sum;
  c = 0;
  for (; c + kLanesV <= cols; c += kLanesV) storev(row + c, loadv(row + c) * inv);
  for (; c < cols; ++c) row[c] *= inv;
  *lse = m + std::log(sum);
}

}  // namespace

void softmax_rows(float* s, int64_t rows, int64_t cols, int64_t stride, float* lse) {
  at::parallel_for(0, rows, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) softmax_row(s + r * stride, cols, lse + r);
  });
}

}  // namespace radixserve
