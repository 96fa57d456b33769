// A decode step's decoder layers (Llama family, every projection on column panels, no biases
// or q/k norms) in one native call. Per layer, `weights` holds kDecodeLayerWeights tensors:
// input norm [hidden], q/k/v panels, o_proj panels, post-attention norm [hidden], gate/up
// panels, down_proj panels (pack_panels of the fused or single weight). x [rows, hidden] are
// the rows' embeddings (float32, or bfloat16 with AVX512_BF16); cos, sin [rows, head_dim] in
// x's dtype. Each row is one token whose K/V go to out_slots; the plan (paged_attention.h)
// attends every row. Returns (the last layer's MLP output, the residual stream before it),
// which the model's final norm adds.
#pragma once

#include <torch/extension.h>

#include <vector>

namespace radixserve {
constexpr size_t kDecodeLayerWeights = 6;
}

std::vector<torch::Tensor> decode_layers(
    torch::Tensor x, const std::vector<torch::Tensor>& weights,
    const std::vector<torch::Tensor>& k_pools, const std::vector<torch::Tensor>& v_pools,
    torch::Tensor cos, torch::Tensor sin, torch::Tensor out_slots, torch::Tensor kv_slots,
    torch::Tensor items, torch::Tensor q_index, torch::Tensor merge_indptr,
    torch::Tensor merge_rows, int64_t heads, int64_t kv_heads, int64_t head_dim,
    int64_t intermediate, double eps, double scale);
