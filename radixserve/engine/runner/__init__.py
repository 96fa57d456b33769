"""The torch side of a step: the model runner's forward, sampling, logprobs, token picking."""
