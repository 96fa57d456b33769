"""Loading checkpoints and presets: sharded files, clear errors, and export round trips."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from radixserve.cli import main
from radixserve.model import PRESETS, export_preset, load_model

from .conftest import save_hf_model
from .paged import PagedRunner


def first_logits(loaded, ids):
    runner = PagedRunner(loaded, page_size=1, num_slots=256)
    return runner.extend([(runner.new(), ids)]).last[0]


def test_sharded_checkpoint_loads(tmp_path):
    hf = save_hf_model(tmp_path / "one", "llama", seed=3)
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    a = first_logits(load_model(tmp_path / "one"), ids)
    b = first_logits(load_model(tmp_path / "sharded"), ids)
    assert torch.equal(a, b)


def test_directory_without_config(tmp_path):
    with pytest.raises(ValueError, match=r"neither a config\.json nor a GGUF file"):
        load_model(tmp_path)


def test_unsupported_architecture_names_the_supported_ones(tmp_path):
    save_hf_model(tmp_path, "llama")
    config = json.loads((tmp_path / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="supports LlamaForCausalLM, MistralForCausalLM"):
        load_model(tmp_path)


def _rewrite_weights(path, change):
    weights = load_file(path / "model.safetensors")
    change(weights)
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})


def test_missing_tensor_is_named(tmp_path):
    save_hf_model(tmp_path, "qwen2")
    _rewrite_weights(tmp_path, lambda w: w.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        load_model(tmp_path)


def test_misshaped_tensor_names_both_shapes(tmp_path):
    save_hf_model(tmp_path, "llama")

    def shrink(w):
        w["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(16, 64)

    _rewrite_weights(tmp_path, shrink)
    with pytest.raises(ValueError, match=r"k_proj.weight.*\(16, 64\).*\(32, 64\)"):
        load_model(tmp_path)


def test_preset_is_deterministic_and_has_a_chat_template():
    a, b = load_model("tiny"), load_model("tiny")
    assert all(
        torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters(), strict=True)
    )
    text = a.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hello"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    ids = a.tokenizer("the cache is hot")["input_ids"]
    assert a.tokenizer.decode(ids) == "the cache is hot"
    assert a.eos_token_ids == (a.tokenizer.convert_tokens_to_ids("<|im_end|>"), 0)


def test_bench_preset_has_the_smollm2_shape():
    from radixserve.model.presets import preset_hf_config

    hf = preset_hf_config("bench-135m")
    assert (hf.hidden_size, hf.num_hidden_layers, hf.num_attention_heads) == (576, 30, 9)
    assert (hf.num_key_value_heads, hf.intermediate_size, hf.vocab_size) == (3, 1536, 49152)
    assert hf.tie_word_embeddings and hf.rope_parameters["rope_theta"] == 100000.0


def test_exported_preset_loads_in_transformers_with_equal_logits(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    export_preset("tiny", tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path).float().eval()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    ids = tokenizer("why is the prefix cache hot?")["input_ids"]
    with torch.no_grad():
        theirs = hf(torch.tensor([ids])).logits[0, -1]
    for loaded in (load_model("tiny"), load_model(tmp_path)):
        assert (first_logits(loaded, ids) - theirs).abs().max() < 1e-4
    assert load_model(tmp_path).eos_token_ids == load_model("tiny").eos_token_ids


def test_export_preset_command(tmp_path, capsys):
    assert main(["export-preset", "tiny", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "model.safetensors").is_file()
    assert (tmp_path / "out" / "tokenizer.json").is_file()
    assert main(["export-preset", "nope", str(tmp_path / "x")]) == 2
    assert "presets: " + ", ".join(PRESETS) in capsys.readouterr().err
