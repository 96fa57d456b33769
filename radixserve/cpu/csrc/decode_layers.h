// A decode step's decoder layers (Llama family, no biases or q/k norms) in one native call.
// Per layer, `norms` holds its input and post-attention norms [hidden], and `projections`
// kDecodeLayerProjections: q/k/v (fused), o_proj, gate/up (fused), down_proj. A projection
// is column panels (pack_panels of the weight; the other fields None and 0) or a quantized
// weight (codes, scales, offsets or None, group, bits, zero, int8_rows: quant_linear.h). x [rows, hidden] are
// the rows' embeddings (float32, or bfloat16 with AVX512_BF16); cos, sin [rows, head_dim] in
// x's dtype. Each row is one token whose K/V go to out_slots; the plan (paged_attention.h)
// attends every row. Returns (the last layer's MLP output, the residual stream before it),
// which the model's final norm adds.
#pragma once

#include <torch/extension.h>

#include <optional>
#include <tuple>
#include <vector>

namespace radixserve {
constexpr size_t kDecodeLayerProjections = 4;
using ProjectionArgs = std::tuple<torch::Tensor, std::optional<torch::Tensor>,
                                  std::optional<torch::Tensor>, int64_t, int64_t, int64_t, int64_t>;
}  // namespace radixserve

std::vector<torch::Tensor> decode_layers(
    torch::Tensor x, const std::vector<torch::Tensor>& norms,
    const std::vector<radixserve::ProjectionArgs>& projections,
    const std::vector<torch::Tensor>& k_pools, const std::vector<torch::Tensor>& v_pools,
    torch::Tensor cos, torch::Tensor sin, torch::Tensor out_slots, torch::Tensor kv_slots,
    torch::Tensor items, torch::Tensor q_index, torch::Tensor merge_indptr,
    torch::Tensor merge_rows, int64_t heads, int64_t kv_heads, int64_t head_dim,
    int64_t intermediate, double eps, double scale);
