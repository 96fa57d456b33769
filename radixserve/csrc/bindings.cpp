// Python bindings: tensors and bytes in, raw pointers to the kernels.
#include <torch/extension.h>

#include "linear_rows.h"
#include "paged_attention.h"

namespace {

void check_index(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.dtype() == torch::kInt64 && t.is_contiguous() && t.device().is_cpu(), name,
              " must be a contiguous int64 CPU tensor");
}

// Returns (out [tokens, heads, head_dim] float32, lse [tokens, heads] float32).
std::vector<torch::Tensor> paged_attention(torch::Tensor q, torch::Tensor k_pool,
                                           torch::Tensor v_pool, torch::Tensor kv_slots,
                                           torch::Tensor items, torch::Tensor q_index,
                                           torch::Tensor merge_indptr, torch::Tensor merge_rows,
                                           double scale) {
  TORCH_CHECK(q.dim() == 3 && k_pool.dim() == 3 && v_pool.sizes() == k_pool.sizes(),
              "q must be [tokens, heads, head_dim], k/v pools [slots, kv_heads, head_dim]");
  TORCH_CHECK(q.size(2) == k_pool.size(2), "q and the pools disagree on head_dim");
  TORCH_CHECK(q.size(1) % k_pool.size(1) == 0, "query heads must group over KV heads");
  TORCH_CHECK(k_pool.dtype() == v_pool.dtype() && k_pool.is_contiguous() && v_pool.is_contiguous(),
              "k/v pools must be contiguous and of one dtype");
  TORCH_CHECK(k_pool.device().is_cpu(), "the native kernels run on CPU");
  for (auto [t, name] : {std::pair{&kv_slots, "kv_slots"}, {&items, "items"},
                         {&q_index, "q_index"}, {&merge_indptr, "merge_indptr"},
                         {&merge_rows, "merge_rows"}}) {
    check_index(*t, name);
  }
  TORCH_CHECK(items.dim() == 2 && items.size(1) == radixserve::kItemFields, "items must be [n, ",
              radixserve::kItemFields, "]");
  const int64_t tokens = q.size(0);
  TORCH_CHECK(merge_indptr.numel() == tokens + 1, "merge_indptr must have tokens + 1 entries");
  TORCH_CHECK(merge_rows.numel() == q_index.numel(), "merge_rows must list every row once");
  auto qf = q.to(torch::kFloat32).contiguous();
  auto out = torch::empty({tokens, q.size(1), q.size(2)}, qf.options());
  auto lse = torch::empty({tokens, q.size(1)}, qf.options());
  const radixserve::AttentionPlan plan{items.data_ptr<int64_t>(),        items.size(0),
                                       q_index.data_ptr<int64_t>(),      q_index.numel(),
                                       merge_indptr.data_ptr<int64_t>(), merge_rows.data_ptr<int64_t>(),
                                       tokens};
  const radixserve::AttentionShape shape{q.size(1), k_pool.size(1), q.size(2),
                                         static_cast<float>(scale)};
  {
    pybind11::gil_scoped_release no_gil;
    if (k_pool.dtype() == torch::kFloat32) {
      radixserve::paged_attention(qf.data_ptr<float>(), k_pool.data_ptr<float>(),
                                  v_pool.data_ptr<float>(), kv_slots.data_ptr<int64_t>(), plan,
                                  shape, out.data_ptr<float>(), lse.data_ptr<float>());
    } else if (k_pool.dtype() == torch::kBFloat16) {
      radixserve::paged_attention(
          qf.data_ptr<float>(), reinterpret_cast<const uint16_t*>(k_pool.data_ptr()),
          reinterpret_cast<const uint16_t*>(v_pool.data_ptr()), kv_slots.data_ptr<int64_t>(),
          plan, shape, out.data_ptr<float>(), lse.data_ptr<float>());
    } else {
      TORCH_CHECK(false, "the native kernels read float32 or bfloat16 K/V, not ",
                  k_pool.dtype());
    }
  }
  return {out, lse};
}

// x [rows, in] (any float dtype) times w [out, in] (float32 or bfloat16)^T: [rows, out] float32.
torch::Tensor linear_rows(torch::Tensor x, torch::Tensor w) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1),
              "x must be [rows, in] and w [out, in]");
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "the native kernels run on CPU");
  TORCH_CHECK(w.is_contiguous(), "w must be contiguous");
  auto xf = x.to(torch::kFloat32).contiguous();
  auto y = torch::empty({x.size(0), w.size(0)}, xf.options());
  pybind11::gil_scoped_release no_gil;
  if (w.dtype() == torch::kFloat32) {
    radixserve::linear_rows(xf.data_ptr<float>(), x.size(0), x.size(1), w.data_ptr<float>(),
                            w.size(0), y.data_ptr<float>());
  } else if (w.dtype() == torch::kBFloat16) {
    radixserve::linear_rows(xf.data_ptr<float>(), x.size(0), x.size(1),
                            reinterpret_cast<const uint16_t*>(w.data_ptr()), w.size(0),
                            y.data_ptr<float>());
  } else {
    TORCH_CHECK(false, "linear_rows reads float32 or bfloat16 weights, not ", w.dtype());
  }
  return y;
}

// Bytes of key[pos:] and edge that agree, in whole tokens of `unit` bytes.
int64_t matching_prefix(const pybind11::bytes& key, int64_t pos, const pybind11::bytes& edge,
                        int64_t unit) {
  char* kp;
  char* ep;
  Py_ssize_t kn, en;
  PyBytes_AsStringAndSize(key.ptr(), &kp, &kn);
  PyBytes_AsStringAndSize(edge.ptr(), &ep, &en);
  TORCH_CHECK(0 <= pos && pos <= kn, "pos out of range");
  return radixserve::matching_prefix(kp + pos, kn - pos, ep, en, unit);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_attention", &paged_attention, "Paged attention over the KV pool by plan");
  m.def("linear_rows", &linear_rows, "x @ w.T for a few rows of x, float32 out");
  m.def("matching_prefix", &matching_prefix, "Agreeing bytes of key[pos:] and edge");
}
