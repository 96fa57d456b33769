"""What a loaded model is (``LoadedModel``) and how its decoder is built empty, for every
source to fill: presets, checkpoints and GGUF files alike."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from radixserve.cpu.quant_linear import QuantMatrix
from radixserve.model.config import ModelConfig
from radixserve.model.llama import LlamaForCausalLM
from radixserve.model.quantized_model import install, quantized_modules


@dataclass
class LoadedModel:
    model: LlamaForCausalLM
    config: ModelConfig
    hf_config: Any
    tokenizer: Any
    eos_token_ids: tuple[int, ...]
    # tensors by the format the file stores them in (a GGUF's "Q4_1", "F32"...), before
    # they were widened to the model's dtype; empty where the source does not say
    file_formats: dict[str, int] = field(default_factory=dict)
    file_bytes: int | None = None  # of the file's tensors; None where the source does not say

    def weights(self) -> dict:
        """The weights as served (dtype of the float ones, bytes of all, tensors kept
        quantized by format) and as the file stored them."""
        params = list(self.model.parameters())
        quantized = quantized_modules(self.model).values()
        return {
            "dtype": str(params[0].dtype).removeprefix("torch."),
            "bytes": sum(p.numel() * p.element_size() for p in params)
            + sum(m.quant.nbytes for m in quantized),
            "quantized": dict(Counter(m.quant.source for m in quantized)),
            "file_formats": self.file_formats,
            "file_bytes": self.file_bytes,
        }


def build_model(
    hf_config: Any,
    dtype: torch.dtype,
    device: torch.device | str,
    quantized: dict[str, QuantMatrix] | None = None,
) -> LlamaForCausalLM:
    """An uninitialised model (storage allocated, values arbitrary) of ``hf_config``'s shape,
    with the ``quantized`` weights (by parameter name) in place and no float storage for them."""
    cfg = ModelConfig.from_hf(hf_config)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg, hf_config)
    if quantized:
        install(model, quantized, dtype)
    return model.to_empty(device=device).to(dtype).eval()
