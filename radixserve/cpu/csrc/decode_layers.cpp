// A decode step's decoder layers in one call: per layer, the residual add and RMSNorm, q/k/v
// on the fused weight (panels or quantized), rotary on q and k in place, the new K/V stored at their slots,
// paged attention by plan, o_proj, the second norm, gate/up on panels, SiLU x up and down_proj
// -- the kernels and the order of model/llama.py, without a Python call between them.
#include "decode_layers.h"

#include "elementwise.h"
#include "paged_attention.h"
#include "panel_linear.h"
#include "quant_ops.h"
#include "vec.h"

#include <cstring>

namespace {

template <typename T>
T* ptr(const torch::Tensor& t) {
  return reinterpret_cast<T*>(t.data_ptr());
}

// y [rows, out] = x [rows, in] @ W^T on W's panels, in x's dtype.
template <typename T>
torch::Tensor on_panels(const torch::Tensor& x, const torch::Tensor& panels, int64_t out) {
  auto y = torch::empty({x.size(0), out}, x.options());
  if constexpr (std::is_same_v<T, float>) {
    radixserve::panel_linear(ptr<float>(x), x.size(0), x.size(1), ptr<float>(panels), out,
                             ptr<float>(y));
  } else {
#if defined(__AVX512BF16__)
    radixserve::panel_linear(ptr<uint16_t>(x), x.size(0), x.size(1), ptr<uint16_t>(panels), out,
                             ptr<uint16_t>(y));
#endif
  }
  return y;
}

// A projection's weight: panels, or a quantized matrix (`quantized`).
struct Projection {
  torch::Tensor panels;
  radixserve::QuantMatrix matrix{};
  bool quantized = false;
};

// y [rows, out] = x [rows, in] @ W^T in x's dtype (a quantized W multiplies float32 rows).
template <typename T>
torch::Tensor project(const torch::Tensor& x, const Projection& p, int64_t out) {
  if (!p.quantized) return on_panels<T>(x, p.panels, out);
  auto xf = x.to(torch::kFloat32).contiguous();
  auto y = torch::empty({x.size(0), out}, xf.options());
  radixserve::quant_linear(ptr<float>(xf), x.size(0), p.matrix, ptr<float>(y));
  return y.to(x.scalar_type());
}

template <typename T>
torch::Tensor norm(const torch::Tensor& x, T* residual, const torch::Tensor& weight, float eps) {
  auto out = torch::empty_like(x);
  radixserve::add_rms_norm<T>(ptr<T>(x), residual, ptr<T>(weight), x.size(0), x.size(1), eps,
                              ptr<T>(out));
  return out;
}

template <typename T>
std::vector<torch::Tensor> run(torch::Tensor x, const std::vector<torch::Tensor>& norms,
                               const std::vector<Projection>& projections,
                               const std::vector<torch::Tensor>& k_pools,
                               const std::vector<torch::Tensor>& v_pools, const torch::Tensor& cos,
                               const torch::Tensor& sin, const torch::Tensor& out_slots,
                               const torch::Tensor& kv_slots, const radixserve::AttentionPlan& plan,
                               const radixserve::AttentionShape& shape, int64_t intermediate,
                               float eps) {
  const int64_t rows = x.size(0), hidden = x.size(1), dim = shape.head_dim;
  const int64_t q_width = shape.heads * dim, kv_width = shape.kv_heads * dim;
  const int64_t qkv_width = q_width + 2 * kv_width;
  const int64_t* slots = out_slots.data_ptr<int64_t>();
  torch::Tensor residual;
  // attention's float32 output and softmax sums, reused by every layer (the sums unread)
  auto attn = torch::empty({rows, q_width}, x.options().dtype(torch::kFloat32));
  auto lse = torch::empty({rows, shape.heads}, attn.options());
  for (size_t layer = 0; layer < k_pools.size(); ++layer) {
    const torch::Tensor* n = &norms[layer * 2];
    const Projection* w = &projections[layer * radixserve::kDecodeLayerProjections];
    torch::Tensor h;
    if (layer == 0) {  // the embeddings are the residual stream
      residual = x;
      h = norm<T>(x, nullptr, n[0], eps);
    } else {
      h = norm<T>(x, ptr<T>(residual), n[0], eps);
    }
    auto qkv = project<T>(h, w[0], qkv_width);
    T* q = ptr<T>(qkv);
    // k's heads follow q's in each row: one pass rotates both
    radixserve::rope_inplace<T>(q, rows, shape.heads + shape.kv_heads, dim, qkv_width, ptr<T>(cos),
                                ptr<T>(sin));
    T* k_pool = ptr<T>(k_pools[layer]);
    T* v_pool = ptr<T>(v_pools[layer]);
    for (int64_t t = 0; t < rows; ++t) {
      const T* row = q + t * qkv_width;
      std::memcpy(k_pool + slots[t] * kv_width, row + q_width, kv_width * sizeof(T));
      std::memcpy(v_pool + slots[t] * kv_width, row + q_width + kv_width, kv_width * sizeof(T));
    }
    auto qf = qkv.narrow(1, 0, q_width).to(torch::kFloat32).contiguous();
    radixserve::paged_attention(ptr<float>(qf), k_pool, v_pool, kv_slots.data_ptr<int64_t>(), plan,
                                shape, ptr<float>(attn), ptr<float>(lse));
    x = project<T>(attn.to(x.scalar_type()), w[1], hidden);
    h = norm<T>(x, ptr<T>(residual), n[1], eps);
    auto gate_up = project<T>(h, w[2], 2 * intermediate);
    auto act = torch::empty({rows, intermediate}, x.options());
    radixserve::silu_mul<T>(ptr<T>(gate_up), ptr<T>(gate_up) + intermediate, rows, intermediate,
                            2 * intermediate, ptr<T>(act));
    x = project<T>(act, w[3], hidden);
  }
  return {x, residual};
}

void check_index(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.dtype() == torch::kInt64 && t.is_contiguous() && t.device().is_cpu(), name,
              " must be a contiguous int64 CPU tensor");
}

// Panels packed by pack_panels from an [out, in] weight (panel_linear.h), or a quantized
// weight of that shape.
Projection projection(const radixserve::ProjectionArgs& args, int64_t out, int64_t in,
                      c10::ScalarType dtype) {
  const auto& [weight, scale, offset, group, bits, zero, int8_rows] = args;
  Projection p;
  if (scale) {
    p.panels = weight;  // kept alive by the caller's list; the matrix points into it
    p.matrix = quant_matrix(weight, *scale, offset, group, bits, zero, int8_rows);
    p.quantized = true;
    TORCH_CHECK(p.matrix.out == out && p.matrix.in == in, "a quantized projection must be ", out,
                " x ", in);
    return p;
  }
  const bool bf16 = dtype == torch::kBFloat16;
  const int64_t width = radixserve::panel_width();
  TORCH_CHECK(weight.scalar_type() == dtype && weight.is_contiguous() && weight.device().is_cpu(),
              "panels must be contiguous CPU tensors of x's dtype");
  TORCH_CHECK(weight.dim() == (bf16 ? 4 : 3) && weight.size(0) == (out + width - 1) / width &&
                  weight.size(1) == (bf16 ? (in + 1) / 2 : in) && weight.size(2) == width,
              "panels must come from pack_panels for a weight of ", out, " x ", in);
  p.panels = weight;
  return p;
}

}  // namespace

std::vector<torch::Tensor> decode_layers(
    torch::Tensor x, const std::vector<torch::Tensor>& norms,
    const std::vector<radixserve::ProjectionArgs>& projection_args,
    const std::vector<torch::Tensor>& k_pools, const std::vector<torch::Tensor>& v_pools,
    torch::Tensor cos, torch::Tensor sin, torch::Tensor out_slots, torch::Tensor kv_slots,
    torch::Tensor items, torch::Tensor q_index, torch::Tensor merge_indptr,
    torch::Tensor merge_rows, int64_t heads, int64_t kv_heads, int64_t head_dim,
    int64_t intermediate, double eps, double scale) {
  const auto dtype = x.scalar_type();
  TORCH_CHECK(dtype == torch::kFloat32 || (dtype == torch::kBFloat16 && radixserve::kBf16Dot),
              "decode_layers runs float32, and bfloat16 where the CPU has AVX512_BF16");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.device().is_cpu(),
              "x must be a contiguous CPU [rows, hidden] tensor");
  const size_t layers = k_pools.size();
  TORCH_CHECK(layers > 0 && v_pools.size() == layers && norms.size() == layers * 2 &&
                  projection_args.size() == layers * radixserve::kDecodeLayerProjections,
              "give every layer's K/V pools, its 2 norms and its ",
              radixserve::kDecodeLayerProjections, " projections");
  for (const auto* list : {&norms, &k_pools, &v_pools}) {
    for (const auto& t : *list) {
      TORCH_CHECK(t.scalar_type() == dtype && t.is_contiguous() && t.device().is_cpu(),
                  "norms and pools must be contiguous CPU tensors of x's dtype");
    }
  }
  const int64_t rows = x.size(0), hidden = x.size(1);
  const int64_t qkv_width = (heads + 2 * kv_heads) * head_dim;
  const int64_t shapes[][2] = {{qkv_width, hidden}, {hidden, heads * head_dim},
                               {2 * intermediate, hidden}, {hidden, intermediate}};
  std::vector<Projection> projections;
  for (size_t l = 0; l < layers; ++l) {
    TORCH_CHECK(k_pools[l].sizes() == v_pools[l].sizes() && k_pools[l].dim() == 3 &&
                    k_pools[l].size(1) == kv_heads && k_pools[l].size(2) == head_dim,
                "the pools must be [slots, kv_heads, head_dim]");
    TORCH_CHECK(norms[2 * l].numel() == hidden && norms[2 * l + 1].numel() == hidden,
                "norm weights must be [hidden]");
    for (size_t i = 0; i < radixserve::kDecodeLayerProjections; ++i) {
      const auto& args = projection_args[l * radixserve::kDecodeLayerProjections + i];
      projections.push_back(projection(args, shapes[i][0], shapes[i][1], dtype));
    }
  }
  TORCH_CHECK(cos.sizes() == sin.sizes() && cos.numel() == rows * head_dim &&
                  cos.scalar_type() == dtype && cos.is_contiguous() && sin.is_contiguous(),
              "cos and sin must be contiguous [rows, head_dim] in x's dtype");
  for (auto [t, name] : {std::pair{&out_slots, "out_slots"}, {&kv_slots, "kv_slots"},
                         {&items, "items"}, {&q_index, "q_index"},
                         {&merge_indptr, "merge_indptr"}, {&merge_rows, "merge_rows"}}) {
    check_index(*t, name);
  }
  TORCH_CHECK(out_slots.numel() == rows, "one out slot per row");
  const int64_t num_slots = k_pools[0].size(0);
  const int64_t* s = out_slots.data_ptr<int64_t>();
  TORCH_CHECK(std::all_of(s, s + rows, [&](int64_t v) { return 0 <= v && v < num_slots; }),
              "an out slot lies outside the pool");
  TORCH_CHECK(items.dim() == 2 && items.size(1) == radixserve::kItemFields &&
                  merge_indptr.numel() == rows + 1 && merge_rows.numel() == q_index.numel(),
              "the attention plan does not fit the batch");
  const radixserve::AttentionPlan plan{items.data_ptr<int64_t>(),        items.size(0),
                                       q_index.data_ptr<int64_t>(),      q_index.numel(),
                                       merge_indptr.data_ptr<int64_t>(), merge_rows.data_ptr<int64_t>(),
                                       rows};
  const radixserve::AttentionShape shape{heads, kv_heads, head_dim, static_cast<float>(scale)};
  pybind11::gil_scoped_release no_gil;
  if (dtype == torch::kFloat32) {
    return run<float>(x, norms, projections, k_pools, v_pools, cos, sin, out_slots, kv_slots, plan, shape,
                      intermediate, static_cast<float>(eps));
  }
  return run<uint16_t>(x, norms, projections, k_pools, v_pools, cos, sin, out_slots, kv_slots, plan, shape,
                       intermediate, static_cast<float>(eps));
}
