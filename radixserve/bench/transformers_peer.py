"""transformers running the same weights as ours: the twin ``bench model`` times forward by
forward, and the batched ``generate`` ``bench serving`` runs a workload on (no reuse across
requests: each batch computes every prompt token)."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable

import numpy as np
import torch

from radixserve.bench.workloads import Workload
from radixserve.model.build import LoadedModel
from radixserve.model.quantized_model import quantized_modules


def transformers_twin(loaded: LoadedModel):
    """transformers' model for the same config, holding the same weights (quantized ones as
    their values in the float dtype)."""
    from transformers import AutoModelForCausalLM

    dtype = next(loaded.model.parameters()).dtype
    hf = AutoModelForCausalLM.from_config(loaded.hf_config, dtype=dtype)
    state = loaded.model.state_dict()
    for name, module in quantized_modules(loaded.model).items():
        state[f"{name}.weight"] = module.quant.dequantize().to(dtype)
    missing, unexpected = hf.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise RuntimeError(f"weights do not line up: {missing[:3]} {unexpected[:3]}")
    hf.tie_weights()
    return hf.eval()


@torch.inference_mode()
def prefill(hf, ids: np.ndarray) -> torch.Tensor:
    """The last token's logits of one prompt from scratch."""
    return hf(torch.from_numpy(ids)[None], logits_to_keep=1, use_cache=False).logits[0, -1]


def decoder(hf, batch: int, context: int) -> Callable[[], None]:
    """One decode step for ``batch`` requests of ``context`` cached tokens: a
    ``DynamicCache`` pre-filled with random K/V (the work does not depend on them)."""
    from transformers import DynamicCache

    cfg = hf.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    shape = (batch, cfg.num_key_value_heads, context, head_dim)
    kv = [(torch.randn(shape, dtype=hf.dtype), torch.randn(shape, dtype=hf.dtype))]
    cache = DynamicCache(kv * cfg.num_hidden_layers)
    # transformers 5 renamed `past_key_values` to `cache`.
    key = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
    token = torch.ones(batch, 1, dtype=torch.long)

    @torch.inference_mode()
    def step() -> None:
        hf(token, use_cache=True, logits_to_keep=1, **{key: cache})

    return step


@torch.inference_mode()
def run_transformers(hf, workload: Workload, batch: int) -> dict:
    """transformers' ``generate``, greedy, batches of similar length, left-padded."""
    start = time.perf_counter()
    for wave in workload.waves:
        ordered = sorted(wave, key=lambda r: len(r.prompt))
        for i in range(0, len(ordered), batch):
            group = ordered[i : i + batch]
            width = max(len(r.prompt) for r in group)
            ids = torch.zeros(len(group), width, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for row, r in enumerate(group):
                ids[row, width - len(r.prompt) :] = torch.from_numpy(r.prompt.astype(np.int64))
                mask[row, width - len(r.prompt) :] = 1
            new = max(r.max_tokens for r in group)
            hf.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=0,
            )
    return workload.row("transformers", time.perf_counter() - start, 0)
