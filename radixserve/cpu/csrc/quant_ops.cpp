// Checks a quantized weight's tensors against quant_linear.h's layouts and calls the kernels.
#include "quant_ops.h"

radixserve::QuantMatrix quant_matrix(const torch::Tensor& codes, const torch::Tensor& scale,
                                     const std::optional<torch::Tensor>& offset, int64_t group,
                                     int64_t bits, int64_t zero, int64_t int8_rows) {
  TORCH_CHECK(radixserve::quant_shape_supported(group, bits),
              "quantized weights take groups of 16 or 32 with 8-bit codes, 32 with 4-bit ones; "
              "not ", group, " with ", bits);
  TORCH_CHECK(codes.dim() == 2 && codes.is_contiguous() && codes.device().is_cpu() &&
                  codes.element_size() == 1,
              "codes must be a contiguous CPU [out, bytes] tensor of bytes");
  const int64_t out = codes.size(0), in = codes.size(1) * 8 / bits;
  TORCH_CHECK(in % group == 0, "a row of ", in, " values is not whole groups of ", group);
  const bool half = scale.dtype() == torch::kFloat16;
  for (const torch::Tensor* t : {&scale, offset ? &*offset : nullptr}) {
    if (t == nullptr) continue;
    TORCH_CHECK((t->dtype() == torch::kFloat32 || t->dtype() == torch::kFloat16) &&
                    t->dtype() == scale.dtype() && t->is_contiguous() && t->device().is_cpu() &&
                    t->dim() == 2 && t->size(0) == out && t->size(1) == in / group,
                "scales and offsets must be contiguous [", out, ", ", in / group,
                "], both float32 or both float16");
  }
  return {reinterpret_cast<const uint8_t*>(codes.data_ptr()),
          scale.data_ptr(),
          offset ? offset->data_ptr() : nullptr,
          out,
          in,
          static_cast<int>(group),
          static_cast<int>(bits),
          static_cast<int>(zero),
          int8_rows,
          half};
}

torch::Tensor quant_linear(torch::Tensor x, torch::Tensor codes, torch::Tensor scale,
                           std::optional<torch::Tensor> offset, int64_t group, int64_t bits,
                           int64_t zero, int64_t int8_rows) {
  const auto w = quant_matrix(codes, scale, offset, group, bits, zero, int8_rows);
  TORCH_CHECK(x.dim() == 2 && x.size(1) == w.in && x.device().is_cpu(),
              "x must be a CPU [rows, ", w.in, "] tensor");
  auto xf = x.to(torch::kFloat32).contiguous();
  auto y = torch::empty({x.size(0), w.out}, xf.options());
  pybind11::gil_scoped_release no_gil;
  radixserve::quant_linear(xf.data_ptr<float>(), x.size(0), w, y.data_ptr<float>());
  return y;
}

torch::Tensor dequantize_rows(torch::Tensor codes, torch::Tensor scale,
                              std::optional<torch::Tensor> offset, int64_t group, int64_t bits,
                              int64_t zero, std::optional<torch::Tensor> rows) {
  const auto w = quant_matrix(codes, scale, offset, group, bits, zero);
  const int64_t* index = nullptr;
  int64_t n = w.out;
  if (rows) {
    TORCH_CHECK(rows->dtype() == torch::kInt64 && rows->is_contiguous() && rows->device().is_cpu(),
                "rows must be a contiguous int64 CPU tensor");
    index = rows->data_ptr<int64_t>();
    n = rows->numel();
    TORCH_CHECK(std::all_of(index, index + n, [&](int64_t r) { return 0 <= r && r < w.out; }),
                "a row index lies outside the weight's ", w.out, " rows");
  }
  auto y = torch::empty({n, w.in}, scale.options().dtype(torch::kFloat32));
  pybind11::gil_scoped_release no_gil;
  radixserve::dequantize_rows(w, index, n, y.data_ptr<float>());
  return y;
}
