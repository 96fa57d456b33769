"""Which requests run each step and how far: admission, chunked prefill, decode, preemption,
and a request's slots and lock in the prefix cache. Torch-free: slot indices and token ids."""
