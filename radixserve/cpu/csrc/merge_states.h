// Softmax states of batch tokens from several parts of one attention (dense blocks, the paged
// kernel), merged by log-sum-exp. Part p covers n_p tokens `tokens[p]` (each at most once
// within a part): out [n_p, heads, head_dim] and lse [n_p, heads], float32, contiguous; lse is
// the natural log of the softmax sum, -inf where the part saw no key for that token.
// Results: out [num_tokens, heads, head_dim], lse [num_tokens, heads] (-inf, out 0, where no
// part saw anything).
#pragma once

#include <cstdint>
#include <vector>

namespace radixserve {

struct StatePart {
  const int64_t* tokens;
  int64_t n;
  const float* out;
  const float* lse;
};

void merge_states(const std::vector<StatePart>& parts, int64_t num_tokens, int64_t heads,
                  int64_t head_dim, float* out, float* lse);

}  // namespace radixserve
