// Python bindings: tensors and bytes in, raw pointers to the kernels.
#include <torch/extension.h>

#include "block_attention.h"
#include "decode_layers.h"
#include "elementwise.h"
#include "linear_rows.h"
#include "merge_states.h"
#include "panel_linear.h"
#include "paged_attention.h"
#include "quant_int8.h"
#include "quant_ops.h"
#include "vec.h"

namespace {

void check_index(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.dtype() == torch::kInt64 && t.is_contiguous() && t.device().is_cpu(), name,
              " must be a contiguous int64 CPU tensor");
}

template <typename T>
T* ptr(const torch::Tensor& t) {
  return reinterpret_cast<T*>(t.data_ptr());
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

// Rows of an int64 index into a dimension of `size` (None: none), checked.
const int64_t* rows_of(const std::optional<torch::Tensor>& rows, int64_t size, const char* name) {
  if (!rows) return nullptr;
  check_index(*rows, name);
  const int64_t* r = rows->data_ptr<int64_t>();
  TORCH_CHECK(std::all_of(r, r + rows->numel(), [&](int64_t x) { return 0 <= x && x < size; }),
              name, " names a row outside its tensor");
  return r;
}

// q [rows, heads, head_dim] (tokens: q_rows, or every row) over k, v [rows, kv_heads,
// head_dim] (keys: key_rows, or every row), read in place, float32 or (with AVX512_BF16)
// bfloat16: (out [tokens, heads, head_dim], lse [tokens, heads]) float32. causal_offset < 0:
// every key visible; else token t sees the first causal_offset + t + 1 (block_attention.h).
std::vector<torch::Tensor> block_attention(torch::Tensor q, std::optional<torch::Tensor> q_rows,
                                           torch::Tensor k, torch::Tensor v,
                                           std::optional<torch::Tensor> key_rows, double scale,
                                           int64_t causal_offset) {
  const auto dtype = q.scalar_type();
  TORCH_CHECK(dtype == torch::kFloat32 || (dtype == torch::kBFloat16 && radixserve::kBf16Dot),
              "block_attention takes float32, and bfloat16 where the CPU has AVX512_BF16");
  for (auto [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}}) {
    TORCH_CHECK(t->dim() == 3 && t->scalar_type() == dtype && t->device().is_cpu() &&
                    t->stride(2) == 1 && t->stride(1) == t->size(2),
                name, " must be a CPU tensor [rows, heads, head_dim] of q's dtype whose rows "
                "are contiguous");
  }
  TORCH_CHECK(k.sizes() == v.sizes() && k.strides() == v.strides() && q.size(2) == k.size(2) &&
                  k.size(1) > 0 && q.size(1) % k.size(1) == 0,
              "q must be [rows, heads, head_dim], k and v [rows, kv_heads, head_dim] alike, "
              "heads a multiple of kv_heads");
  TORCH_CHECK(q.size(2) % radixserve::block_attention_dim_multiple() == 0, "head_dim must be a ",
              "multiple of ", radixserve::block_attention_dim_multiple(), " here");
  const int64_t* qr = rows_of(q_rows, q.size(0), "q_rows");
  const int64_t* kr = rows_of(key_rows, k.size(0), "key_rows");
  const int64_t tokens = q_rows ? q_rows->numel() : q.size(0);
  auto out = torch::empty({tokens, q.size(1), q.size(2)}, q.options().dtype(torch::kFloat32));
  auto lse = torch::empty({tokens, q.size(1)}, out.options());
  auto run = [&](auto zero) {
    using T = decltype(zero);
    const radixserve::BlockInput<T> in{
        ptr<T>(q), q.stride(0), qr, tokens, q.size(1), ptr<T>(k), ptr<T>(v), k.stride(0), kr,
        key_rows ? key_rows->numel() : k.size(0), k.size(1), k.size(2),
        static_cast<float>(scale), causal_offset};
    pybind11::gil_scoped_release no_gil;
    radixserve::block_attention(in, out.data_ptr<float>(), lse.data_ptr<float>());
  };
  if (dtype == torch::kFloat32) {
    run(float{});
  } else {
#if defined(__AVX512BF16__)
    run(uint16_t{});
#endif
  }
  return {out, lse};
}

// Softmax states of parts of one attention, merged per token: (out, lse) as paged_attention's.
std::vector<torch::Tensor> merge_states(const std::vector<torch::Tensor>& tokens,
                                        const std::vector<torch::Tensor>& outs,
                                        const std::vector<torch::Tensor>& lses,
                                        int64_t num_tokens) {
  TORCH_CHECK(!outs.empty() && tokens.size() == outs.size() && lses.size() == outs.size(),
              "give each part's tokens, out and lse");
  const int64_t heads = outs[0].size(1), head_dim = outs[0].size(2);
  std::vector<radixserve::StatePart> parts;
  for (size_t i = 0; i < outs.size(); ++i) {
    check_index(tokens[i], "tokens");
    const int64_t n = tokens[i].numel();
    TORCH_CHECK(outs[i].scalar_type() == torch::kFloat32 && outs[i].is_contiguous() &&
                    outs[i].dim() == 3 && outs[i].size(0) == n && outs[i].size(1) == heads &&
                    outs[i].size(2) == head_dim,
                "each out must be contiguous float32 [tokens, heads, head_dim]");
    TORCH_CHECK(lses[i].scalar_type() == torch::kFloat32 && lses[i].is_contiguous() &&
                    lses[i].dim() == 2 && lses[i].size(0) == n && lses[i].size(1) == heads,
                "each lse must be contiguous float32 [tokens, heads]");
    const int64_t* t = tokens[i].data_ptr<int64_t>();
    TORCH_CHECK(std::all_of(t, t + n, [&](int64_t x) { return 0 <= x && x < num_tokens; }),
                "a part names a token outside the batch");
    parts.push_back({t, n, outs[i].data_ptr<float>(), lses[i].data_ptr<float>()});
  }
  auto opts = outs[0].options();
  auto out = torch::empty({num_tokens, heads, head_dim}, opts);
  auto lse = torch::empty({num_tokens, heads}, opts);
  {
    pybind11::gil_scoped_release no_gil;
    radixserve::merge_states(parts, num_tokens, heads, head_dim, out.data_ptr<float>(),
                             lse.data_ptr<float>());
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

// w [out, in] -> its panels (panel_linear.h): float32, or bfloat16 where bf16_dot().
torch::Tensor pack_panels(torch::Tensor w) {
  TORCH_CHECK(w.dim() == 2 && w.device().is_cpu(), "w must be a CPU [out, in] tensor");
  const int64_t width = radixserve::panel_width();
  const int64_t n_panels = (w.size(0) + width - 1) / width;
  w = w.contiguous();
  if (w.scalar_type() == torch::kFloat32) {
    auto panels = torch::empty({n_panels, w.size(1), width}, w.options());
    radixserve::pack_panels(w.data_ptr<float>(), w.size(0), w.size(1), panels.data_ptr<float>());
    return panels;
  }
  TORCH_CHECK(w.scalar_type() == torch::kBFloat16 && radixserve::kBf16Dot,
              "panels hold float32 weights, and bfloat16 ones where the CPU has AVX512_BF16; "
              "not ", w.scalar_type(), " here");
#if defined(__AVX512BF16__)
  auto panels = torch::empty({n_panels, (w.size(1) + 1) / 2, width, 2}, w.options());
  radixserve::pack_panels(reinterpret_cast<const uint16_t*>(w.data_ptr()), w.size(0), w.size(1),
                          reinterpret_cast<uint16_t*>(panels.data_ptr()));
  return panels;
#else
  return torch::Tensor();
#endif
}

// x [rows, in] @ W^T for W [out, in] packed by pack_panels, in x's dtype.
torch::Tensor panel_linear(torch::Tensor x, torch::Tensor panels, int64_t out) {
  const int64_t width = radixserve::panel_width();
  const bool bf16 = x.scalar_type() == torch::kBFloat16;
  TORCH_CHECK(x.dim() == 2 && x.device().is_cpu() && x.scalar_type() == panels.scalar_type() &&
                  (bf16 || x.scalar_type() == torch::kFloat32),
              "x must be a CPU [rows, in] tensor of the panels' dtype");
  const int64_t depth = bf16 ? (x.size(1) + 1) / 2 : x.size(1);
  TORCH_CHECK(panels.dim() == (bf16 ? 4 : 3) && panels.is_contiguous() &&
                  panels.size(1) == depth && panels.size(2) == width &&
                  panels.size(0) == (out + width - 1) / width,
              "panels must come from pack_panels for a weight of ", out, " x ", x.size(1));
  x = x.contiguous();
  auto y = torch::empty({x.size(0), out}, x.options());
  pybind11::gil_scoped_release no_gil;
  if (!bf16) {
    radixserve::panel_linear(x.data_ptr<float>(), x.size(0), x.size(1), panels.data_ptr<float>(),
                             out, y.data_ptr<float>());
  }
#if defined(__AVX512BF16__)
  if (bf16) {
    radixserve::panel_linear(reinterpret_cast<const uint16_t*>(x.data_ptr()), x.size(0),
                             x.size(1), reinterpret_cast<const uint16_t*>(panels.data_ptr()),
                             out, reinterpret_cast<uint16_t*>(y.data_ptr()));
  }
#endif
  return y;
}

void check_rows(const torch::Tensor& t, const char* name, c10::ScalarType dtype) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == dtype, name, " must be a CPU tensor of ",
              dtype);
  TORCH_CHECK(t.dim() >= 1 && t.stride(-1) == 1, name, "'s last dimension must be contiguous");
}

// Calls f(T{}) with T the storage type of dtype: float, or uint16_t for bfloat16's bits.
template <typename F>
void with_dtype(c10::ScalarType dtype, F&& f) {
  if (dtype == torch::kFloat32) {
    f(float{});
  } else if (dtype == torch::kBFloat16) {
    f(uint16_t{});
  } else {
    TORCH_CHECK(false, "the fused elementwise kernels take float32 or bfloat16, not ", dtype);
  }
}

// weight * rms_norm(x), or, given residual: residual += x in place, then its norm.
torch::Tensor add_rms_norm(torch::Tensor x, std::optional<torch::Tensor> residual,
                           torch::Tensor weight, double eps) {
  x = x.contiguous();
  const auto dtype = x.scalar_type();
  check_rows(weight, "weight", dtype);
  const int64_t dim = x.size(-1), rows = x.numel() / dim;
  TORCH_CHECK(weight.numel() == dim, "weight must have the last dimension's size");
  if (residual) {
    check_rows(*residual, "residual", dtype);
    TORCH_CHECK(residual->is_contiguous() && residual->sizes() == x.sizes(),
                "residual must be contiguous and of x's shape");
  }
  auto out = torch::empty_like(x);
  with_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    radixserve::add_rms_norm<T>(ptr<T>(x), residual ? ptr<T>(*residual) : nullptr,
                                ptr<T>(weight.contiguous()), rows, dim,
                                static_cast<float>(eps), ptr<T>(out));
  });
  return out;
}

// silu(gate) * up for [rows, dim] views whose rows may be apart (two halves of one tensor).
torch::Tensor silu_mul(torch::Tensor gate, torch::Tensor up) {
  const auto dtype = gate.scalar_type();
  check_rows(gate, "gate", dtype);
  check_rows(up, "up", dtype);
  TORCH_CHECK(gate.dim() == 2 && gate.sizes() == up.sizes() && gate.stride(0) == up.stride(0),
              "gate and up must be [rows, dim] with one row stride");
  auto out = torch::empty(gate.sizes(), gate.options());
  with_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    radixserve::silu_mul<T>(ptr<T>(gate), ptr<T>(up), gate.size(0), gate.size(1),
                            gate.stride(0), ptr<T>(out));
  });
  return out;
}

// Each row's argmax, as torch.argmax(x, -1), for float32 [rows, n] (n >= 1).
torch::Tensor argmax_rows(torch::Tensor x) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) > 0 && x.scalar_type() == torch::kFloat32 &&
                  x.device().is_cpu(),
              "argmax_rows takes a float32 CPU [rows, n] tensor with n >= 1");
  x = x.contiguous();
  auto out = torch::empty({x.size(0)}, x.options().dtype(torch::kInt64));
  radixserve::argmax_rows(ptr<float>(x), x.size(0), x.size(1), out.data_ptr<int64_t>());
  return out;
}

// x [tokens, heads, dim] rotated in place by cos/sin [tokens, dim].
void rope_inplace(torch::Tensor x, torch::Tensor cos, torch::Tensor sin) {
  const auto dtype = x.scalar_type();
  check_rows(x, "x", dtype);
  TORCH_CHECK(x.dim() == 3 && x.stride(1) == x.size(2), "x must be [tokens, heads, dim], heads "
              "contiguous");
  TORCH_CHECK(x.size(2) % 2 == 0, "head_dim must be even");
  cos = cos.to(dtype).reshape({x.size(0), x.size(2)}).contiguous();
  sin = sin.to(dtype).reshape({x.size(0), x.size(2)}).contiguous();
  with_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    radixserve::rope_inplace<T>(ptr<T>(x), x.size(0), x.size(1), x.size(2), x.stride(0),
                                ptr<T>(cos), ptr<T>(sin));
  });
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
  m.def("block_attention", &block_attention, "many queries over K/V held side by side");
  m.def("block_dim_multiple", &radixserve::block_attention_dim_multiple,
        "block_attention's head_dim must be a multiple of this");
  m.def("merge_states", &merge_states, "softmax states of attention parts merged by lse");
  m.def("linear_rows", &linear_rows, "x @ w.T for a few rows of x, float32 out");
  m.def("quant_linear", &quant_linear, "x @ w.T for a quantized w, float32 out",
        pybind11::arg("x"), pybind11::arg("codes"), pybind11::arg("scale"),
        pybind11::arg("offset"), pybind11::arg("group"), pybind11::arg("bits"),
        pybind11::arg("zero"), pybind11::arg("int8_rows") = 0);
  m.def("int8_dot", &radixserve::int8_dot_supported, "whether 4-bit products can round x to int8");
  m.def("dequantize_rows", &dequantize_rows, "a quantized weight's rows as float32");
  m.def("pack_panels", &pack_panels, "a float32 or bfloat16 weight packed for panel_linear");
  m.def("panel_linear", &panel_linear, "x @ w.T on w's panels, for a few dozen rows");
  m.def("bf16_dot", [] { return radixserve::kBf16Dot; },
        "whether bfloat16 panels and blocks run here (AVX512_BF16)");
  m.def("add_rms_norm", &add_rms_norm, "residual += x (if given), then weight * rms_norm");
  m.def("silu_mul", &silu_mul, "silu(gate) * up");
  m.def("rope_inplace", &rope_inplace, "rotary embedding applied in place");
  m.def("argmax_rows", &argmax_rows, "each row's argmax (first of ties, first NaN)");
  m.def("decode_layers", &decode_layers, "a decode step's decoder layers in one call");
  m.def("matching_prefix", &matching_prefix, "Agreeing bytes of key[pos:] and edge");
}
