"""transformers' batched ``generate`` on a workload: the baseline with no reuse across
requests, for ``bench serving``."""

from __future__ import annotations

import time

import numpy as np
import torch

from radixserve.bench.workloads import Workload


@torch.inference_mode()
def run_transformers(hf, workload: Workload, batch: int) -> dict:
    """transformers' ``generate``, greedy, batches of similar length, left-padded; no reuse
    across requests (each batch computes every prompt token)."""
    start = time.perf_counter()
    done = 0
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
            done += len(group)
    seconds = time.perf_counter() - start
    prompt = workload.prompt_tokens
    outputs = sum(r.max_tokens for r in workload.requests)
    return {
        "workload": workload.name,
        "config": "transformers",
        "requests": done,
        "seconds": seconds,
        "req_s": done / seconds,
        "tok_s": (prompt + outputs) / seconds,
        "hit_rate": 0.0,
        "prefill_tokens": prompt,
    }
