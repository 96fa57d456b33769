"""Speculative decoding: drafts from the tree and n-grams, verified by the model."""
