"""Which of a model's weights stay quantized, and swapping their modules for quantized ones.

Projections (``*_proj``, ``lm_head``) and token embeddings are what a decode step streams
and what a GGUF file quantizes; norms stay float. ``quantize`` (``--quantize``) says what
happens at load:

- ``auto``: a GGUF file's quantized tensors stay as the file has them, float ones stay float;
- ``none``: every weight is widened to the model's dtype (the reference the tests compare
  with: the file's values as floats);
- ``int8`` / ``int4``: as ``auto``, and every float projection is quantized too
  (``model.quantized.quantize``; embeddings stay as the file has them).
"""

from __future__ import annotations

import torch
from torch import nn

from radixserve.cpu.linear import Linear
from radixserve.cpu.quant_linear import QuantizedEmbedding, QuantizedLinear, QuantMatrix
from radixserve.model.quantized import QUANTIZE_KINDS, QuantizedWeight, quantize

QUANTIZE_CHOICES = ("auto", "none", *QUANTIZE_KINDS)
EMBEDDINGS = "model.embed_tokens.weight"


def check_quantize(quantize: str, device: torch.device | str) -> None:
    if quantize not in QUANTIZE_CHOICES:
        raise ValueError(f"quantize must be one of {QUANTIZE_CHOICES}, not {quantize!r}")
    if quantize in QUANTIZE_KINDS and torch.device(device).type != "cpu":
        raise ValueError(f"quantize={quantize!r} runs on CPU; quantized kernels need one")


def stays_quantized(name: str, quantize: str, device: torch.device | str) -> bool:
    """Whether the parameter ``name``, quantized in its file, is served as it is."""
    if quantize == "none" or torch.device(device).type != "cpu":
        return False
    return name == EMBEDDINGS or name.endswith(("_proj.weight", "lm_head.weight"))


def to_matrix(weight: QuantizedWeight) -> QuantMatrix:
    bits, zero = weight.code_bits
    return QuantMatrix.pack(
        weight.codes, weight.scale, weight.offset, weight.group, bits, zero, weight.source
    )


def install(model: nn.Module, weights: dict[str, QuantMatrix], dtype: torch.dtype) -> None:
    """Put each quantized weight (by parameter name) in place of its module's float one.
    A projection's bias stays a float parameter of the same name, to be loaded as before."""
    for name, matrix in weights.items():
        path = name.removesuffix(".weight")
        parent_name, _, child = path.rpartition(".")
        parent = model.get_submodule(parent_name)
        old = getattr(parent, child)
        if isinstance(old, nn.Embedding):
            new: nn.Module = QuantizedEmbedding(matrix, dtype)
        elif isinstance(old, nn.Linear):
            bias = None if old.bias is None else torch.empty_like(old.bias)
            new = QuantizedLinear(matrix, bias)
        else:
            raise ValueError(f"{name} is neither a projection nor the embeddings")
        if (old.weight.shape[0], old.weight.shape[1]) != matrix.shape:
            raise ValueError(f"{name}: quantized shape {matrix.shape} != {tuple(old.weight.shape)}")
        setattr(parent, child, new)


def quantize_model(model: nn.Module, kind: str) -> int:
    """Quantize every float projection of ``model`` in place (``kind``: int8, int4);
    returns how many."""
    swapped = {}
    for name, module in model.named_modules():
        if isinstance(module, Linear):
            values = module.weight.detach().float().cpu().numpy()
            swapped[name] = (to_matrix(quantize(values, kind)), module.bias)
    for name, (matrix, bias) in swapped.items():
        parent_name, _, child = name.rpartition(".")
        bias = None if bias is None else bias.detach()
        setattr(model.get_submodule(parent_name), child, QuantizedLinear(matrix, bias))
    return len(swapped)


def quantized_modules(model: nn.Module) -> dict[str, QuantizedLinear | QuantizedEmbedding]:
    return {
        name: m
        for name, m in model.named_modules()
        if isinstance(m, QuantizedLinear | QuantizedEmbedding)
    }
