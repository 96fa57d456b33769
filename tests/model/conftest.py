import pytest
import torch

ARCHS = {
    "llama": ("LlamaConfig", {"tie_word_embeddings": True}),
    "mistral": ("MistralConfig", {"sliding_window": None}),
    "qwen2": ("Qwen2Config", {"use_sliding_window": False, "tie_word_embeddings": False}),
    "qwen3": ("Qwen3Config", {"use_sliding_window": False}),
}

COMMON = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
)


def save_hf_model(directory, arch: str, seed: int = 0, **overrides):
    """A random small transformers model of ``arch``, saved as a HF directory; returns it."""
    import transformers

    config_cls, extra = ARCHS[arch]
    config = getattr(transformers, config_cls)(**{**COMMON, **extra, **overrides})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model = model.float().eval()
    model.save_pretrained(directory)
    return model


@pytest.fixture(scope="session")
def hf_models(tmp_path_factory):
    """One saved random model per architecture: ``{arch: (hf_model, directory)}``."""
    out = {}
    for arch in ARCHS:
        directory = tmp_path_factory.mktemp(arch)
        out[arch] = (save_hf_model(directory, arch), directory)
    return out
