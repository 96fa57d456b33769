"""Run the built-in `tiny` model over the paged KV pool: a prompt, then a second request that
reuses the first one's prefix K/V without recomputing it.

Run: python examples/model_forward.py
"""

import numpy as np
import torch

from radixserve.attention import ExtendRequest, ForwardBatch, create_attention_backend
from radixserve.memory import KVSlotAllocator
from radixserve.memory.kv_pool import KVPool
from radixserve.model import load_model

PAGE = 16
loaded = load_model("tiny")
cfg, tok = loaded.config, loaded.tokenizer
allocator = KVSlotAllocator(1024, PAGE)
pool = KVPool(cfg.num_layers, 1024, PAGE, cfg.num_kv_heads, cfg.head_dim)
attn = create_attention_backend(
    "auto", pool, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.head_dim**-0.5
)

system = tok("You are a careful grader. Answer in one word, then explain why.")["input_ids"]
shared = system[: len(system) // PAGE * PAGE]  # whole pages can be shared
first = system + tok(" What is the cache?")["input_ids"]
slots = allocator.alloc(len(first))[: len(first)]
out = loaded.model(ForwardBatch.create([ExtendRequest(first, slots)], PAGE), attn)
print("first request, next token:", tok.decode(int(torch.argmax(out.last[0]))))

# The second request starts from the first one's cached pages: only its tail is computed.
tail = system[len(shared) :] + tok(" Why is it hot?")["input_ids"]
context = np.concatenate([slots[: len(shared)], allocator.alloc(len(tail))[: len(tail)]])
out = loaded.model(ForwardBatch.create([ExtendRequest(tail, context)], PAGE), attn)
print(f"second request: {len(shared)} tokens reused, {len(tail)} computed")
