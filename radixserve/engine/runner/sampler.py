"""Turns each request's last-token logits into its next token, the whole batch at once.

Penalties, temperature, top-k, top-p and min-p run as batched tensor ops; only the final
draw of requests that carry their own ``seed`` uses a per-request generator, so a seeded
request samples the same tokens whatever it is batched with.
"""

from __future__ import annotations

from collections.abc import Collection

import torch

from radixserve.cpu.native import load_native
from radixserve.engine.req import Req

# tokens sorted first for top-k/top-p: enough for a nucleus of a trained model's logits
CANDIDATES = 1024


class Sampler:
    def __init__(self, seed: int, eos_token_ids: Collection[int] = ()) -> None:
        self.generator = torch.Generator().manual_seed(seed)
        self.eos_token_ids = tuple(eos_token_ids)
        self._seeded: dict[Req, torch.Generator] = {}

    def sample(self, logits: torch.Tensor, reqs: list[Req]) -> list[int]:
        """logits: [batch, vocab] float32, one row per request in ``reqs``."""
        logits = logits.float().cpu()
        logits = self.hold_stops(logits, reqs, [len(r.output_ids) for r in reqs])
        params = [r.params for r in reqs]
        logits = self._penalise(logits, reqs)
        if all(p.greedy for p in params):
            return argmax(logits).tolist()
        greedy = torch.tensor([p.greedy for p in params])
        probs = self.probabilities(logits, params)
        tokens = argmax(logits)
        shared = [i for i, r in enumerate(reqs) if not greedy[i] and r.params.seed is None]
        if shared:  # one draw for every unseeded row
            rows = torch.tensor(shared)
            tokens[rows] = draw(probs[rows], self.generator)
        for i, req in enumerate(reqs):  # seeded rows draw from their own stream
            if not greedy[i] and req.params.seed is not None:
                tokens[i] = draw(probs[i : i + 1], self._generator(req))[0]
        return tokens.tolist()

    def probabilities(self, logits: torch.Tensor, params: list) -> torch.Tensor:
        """What each row samples from (penalties applied): softmax at its temperature (1
        for a greedy row), then top-k, top-p and min-p."""
        temps = torch.tensor([p.temperature if not p.greedy else 1.0 for p in params])
        probs = torch.softmax(logits / temps[:, None], dim=-1)
        # only rows that truncate pay for sorting (a full-vocabulary sort is costly)
        cut = [i for i, p in enumerate(params) if not p.greedy and p.truncates]
        if cut:
            rows = torch.tensor(cut)
            probs[rows] = self._truncate(probs[rows], [params[i] for i in cut])
        return probs

    def hold_stops(self, logits: torch.Tensor, reqs: list[Req], made: list[int]) -> torch.Tensor:
        """``logits`` with row ``i``'s stop tokens (its ``stop_token_ids``, and EOS unless it
        ignores it) at -inf while ``made[i]``, the outputs its request has before that row's
        token, is short of its ``min_new_tokens``."""
        held = [
            i
            for i, (r, n) in enumerate(zip(reqs, made, strict=True))
            if n < r.params.min_new_tokens
        ]
        if not held:
            return logits
        logits, vocab = logits.clone(), logits.shape[-1]
        for i in held:
            p = reqs[i].params
            stops = [*p.stop_token_ids, *(() if p.ignore_eos else self.eos_token_ids)]
            logits[i, [t for t in stops if t < vocab]] = float("-inf")
        return logits

    def forget(self, req: Req) -> None:
        self._seeded.pop(req, None)

    def stream(self, req: Req) -> torch.Generator:
        """The generator a request draws from: its own with a seed, else the shared one."""
        return self.generator if req.params.seed is None else self._generator(req)

    def _generator(self, req: Req) -> torch.Generator:
        if req not in self._seeded:
            self._seeded[req] = torch.Generator().manual_seed(req.params.seed)
        return self._seeded[req]

    @staticmethod
    def _penalise(logits: torch.Tensor, reqs: list[Req]) -> torch.Tensor:
        rows = [
            i
            for i, r in enumerate(reqs)
            if r.params.repetition_penalty != 1
            or r.params.frequency_penalty
            or r.params.presence_penalty
        ]
        if not rows:
            return logits
        logits = logits.clone()
        vocab = logits.shape[1]
        for i in rows:
            p, req = reqs[i].params, reqs[i]
            if p.repetition_penalty != 1:
                seen = torch.from_numpy(req.seq().astype("int64"))
                seen = seen[seen < vocab].unique()
                values = logits[i, seen]
                logits[i, seen] = torch.where(
                    values > 0, values / p.repetition_penalty, values * p.repetition_penalty
                )
            if (p.frequency_penalty or p.presence_penalty) and req.output_ids:
                counts = torch.bincount(torch.tensor(req.output_ids), minlength=vocab)[:vocab]
                logits[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)
        return logits

    @staticmethod
    def _truncate(probs: torch.Tensor, params) -> torch.Tensor:
        """Apply top-k, top-p and min-p (each a no-op at its default) to softmaxed rows and
        renormalise. Only the largest ``CANDIDATES`` are sorted where every row keeps fewer
        (its top-k, or a nucleus they cover): a full sort of a batch's rows is costly."""
        vocab = probs.shape[1]
        top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params])
        top_p = torch.tensor([p.top_p for p in params])
        min_p = torch.tensor([p.min_p for p in params])
        sorted_probs, order = probs.topk(min(int(top_k.max()), CANDIDATES, vocab), dim=-1)
        covered = (top_k <= sorted_probs.shape[1]) | (sorted_probs.sum(-1) >= top_p)
        if not bool(covered.all()):
            sorted_probs, order = probs.sort(dim=-1, descending=True)
        rank = torch.arange(sorted_probs.shape[1])[None, :]
        before = sorted_probs.cumsum(-1) - sorted_probs  # mass strictly above each token
        keep = (rank < top_k[:, None]) & (before < top_p[:, None])
        keep &= sorted_probs >= min_p[:, None] * sorted_probs[:, :1]
        keep[:, 0] = True
        sorted_probs = sorted_probs * keep
        out = torch.zeros_like(probs).scatter_(1, order, sorted_probs)
        return out / out.sum(-1, keepdim=True)


def add_logit_bias(logits: torch.Tensor, reqs: list[Req]) -> torch.Tensor:
    """``logits`` (one row per request) with each request's ``logit_bias`` added (a copy,
    where any has one): what follows (grammar masks, logprobs, sampling) sees the biased
    distribution."""
    biased = [(i, r.params.logit_bias) for i, r in enumerate(reqs) if r.params.logit_bias]
    if not biased:
        return logits
    logits = logits.clone()
    for i, bias in biased:
        ids = torch.tensor(list(bias), dtype=torch.int64)
        logits[i, ids] += torch.tensor(list(bias.values()), dtype=logits.dtype)
    return logits


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """Each row's argmax (the first of ties), as ``torch.argmax(logits, -1)``: natively where
    the kernels built (faster than torch's on a decode batch's rows)."""
    native = load_native()
    if native is None or logits.shape[-1] == 0:
        return logits.argmax(-1)
    return native.argmax_rows(logits)


def draw(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row of ``probs`` (``[rows, vocab]``, unnormalised), by inverting each
    row's cumulative sum at a uniform draw, far cheaper than ``torch.multinomial`` over a
    large vocabulary. A token of probability zero is never drawn."""
    cdf = probs.cumsum(-1)
    u = torch.rand(len(probs), 1, generator=generator) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True)[:, 0].clamp_(max=probs.shape[1] - 1)
