"""Model loading (Hugging Face directories and built-in presets) and the decoder."""

from radixserve.model.build import LoadedModel
from radixserve.model.config import SUPPORTED_ARCHITECTURES, ModelConfig
from radixserve.model.llama import LlamaForCausalLM, Logits
from radixserve.model.loader import load_model
from radixserve.model.presets import PRESETS, export_preset

__all__ = [
    "PRESETS",
    "SUPPORTED_ARCHITECTURES",
    "LlamaForCausalLM",
    "LoadedModel",
    "Logits",
    "ModelConfig",
    "export_preset",
    "load_model",
]
