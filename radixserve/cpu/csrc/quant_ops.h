// The quantized kernels' torch entry points (quant_linear.h for the layouts).
#pragma once

#include <torch/extension.h>

#include <optional>

#include "quant_linear.h"

// The weight those tensors hold, checked against quant_linear.h's layouts (raises if not).
radixserve::QuantMatrix quant_matrix(const torch::Tensor& codes, const torch::Tensor& scale,
                                     const std::optional<torch::Tensor>& offset, int64_t group,
                                     int64_t bits, int64_t zero, int64_t int8_rows = 0);

// x [rows, in] (any float dtype) times the quantized weight^T: [rows, out] float32 (x
// rounded to int8 where rows <= int8_rows and the weight is 4-bit).
torch::Tensor quant_linear(torch::Tensor x, torch::Tensor codes, torch::Tensor scale,
                           std::optional<torch::Tensor> offset, int64_t group, int64_t bits,
                           int64_t zero, int64_t int8_rows);

// The float32 values of the weight's rows `rows` (None: all of them): [n, in].
torch::Tensor dequantize_rows(torch::Tensor codes, torch::Tensor scale,
                              std::optional<torch::Tensor> offset, int64_t group, int64_t bits,
                              int64_t zero, std::optional<torch::Tensor> rows);
