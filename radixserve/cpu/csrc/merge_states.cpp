// Merging softmax states: see merge_states.h. Three passes, each parallel over a part's rows
// (a part names each token at most once, so no two threads write one token): the largest
// lse per (token, head); then each part's output weighted by exp(lse - largest) summed into
// the result, with the weights' sum; then the division by that sum.
#include "merge_states.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace radixserve {

void merge_states(const std::vector<StatePart>& parts, int64_t num_tokens, int64_t heads,
                  int64_t head_dim, float* out, float* lse) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int64_t H = heads, D = head_dim;
  std::fill(lse, lse + num_tokens * H, kNegInf);
  std::fill(out, out + num_tokens * H * D, 0.0f);
  for (const StatePart& p : parts) {
    at::parallel_for(0, p.n, 64, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        float* top = lse + p.tokens[i] * H;
        for (int64_t h = 0; h < H; ++h) top[h] = std::max(top[h], p.lse[i * H + h]);
      }
    });
  }
  std::vector<float> total(num_tokens * H, 0.0f);
  for (const StatePart& p : parts) {
    at::parallel_for(0, p.n, 64, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t t = p.tokens[i];
        for (int64_t h = 0; h < H; ++h) {
          const float l = p.lse[i * H + h];
          if (l == kNegInf) continue;  // this part saw nothing for this head
          const float w = std::exp(l - lse[t * H + h]);
          total[t * H + h] += w;
          const float* src = p.out + (i * H + h) * D;
          float* dst = out + (t * H + h) * D;
          for (int64_t d = 0; d < D; ++d) dst[d] += w * src[d];
        }
      }
    });
  }
  at::parallel_for(0, num_tokens, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        const float sum = total[t * H + h];
        if (sum == 0.0f) continue;  // out stays 0, lse -inf
        float* dst = out + (t * H + h) * D;
        const float inv = 1.0f / sum;
        for (int64_t d = 0; d < D; ++d) dst[d] *= inv;
        lse[t * H + h] += std::log(sum);
      }
    }
  });
}

}  // namespace radixserve
