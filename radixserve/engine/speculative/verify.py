"""Verifying draft tokens: which of them the model's own next-token choice keeps.

A drafted request's pass gives the distribution after its last token and after each draft
token (``Drafted.logits``). Greedy: drafts are kept while each equals the argmax there, and
the argmax after the last kept one follows, so the tokens are the ones plain decoding picks.
Sampling, with a draft that is one fixed token per position: draft ``d`` is kept with the
target's probability ``p(d)``; a rejection draws from ``p`` without ``d`` (renormalised),
and a fully kept draft draws one more from the last distribution. Each emitted token is then
distributed as ``p`` (speculative sampling; its proof needs only ``q = δ_d``). Logprobs are
those of the emitted tokens, from the same logits a plain step would give.
"""

from __future__ import annotations

import torch

from radixserve.engine.req import Req
from radixserve.engine.runner.logprobs import append_logprobs
from radixserve.engine.runner.model_runner import Drafted
from radixserve.engine.runner.sampler import Sampler, add_logit_bias, argmax, draw


def verify(drafted: Drafted, sampler: Sampler) -> list[int]:
    """The tokens the request emits: its accepted drafts, then one from the model."""
    req, draft = drafted.req, drafted.draft
    rows = len(drafted.logits)
    logits = add_logit_bias(drafted.logits.float().cpu(), [req] * rows)
    made = len(req.output_ids)
    logits = sampler.hold_stops(logits, [req] * rows, [made + j for j in range(rows)])
    if req.params.greedy:
        best = argmax(logits).tolist()
        kept = next((j for j, d in enumerate(draft) if best[j] != d), len(draft))
        return [*draft[:kept], best[kept]]
    probs = sampler.probabilities(logits, [req.params] * len(logits))
    stream = sampler.stream(req)
    out: list[int] = []
    for j, d in enumerate(draft):
        row = probs[j]
        if float(torch.rand(1, generator=stream)) * float(row.sum()) < float(row[d]):
            out.append(d)
            continue
        residual = row.clone()
        residual[d] = 0
        return [*out, int(draw(residual[None], stream)[0])]
    return [*out, int(draw(probs[-1:], stream)[0])]


def record_drafted_logprobs(drafted: Drafted, emitted: int) -> None:
    """Logprobs of the request's first ``emitted`` new tokens (those it kept: a stop may
    end it inside the accepted draft)."""
    req: Req = drafted.req
    if not req.params.return_logprob or emitted <= 0:
        return
    logits = add_logit_bias(drafted.logits[:emitted].float().cpu(), [req] * emitted)
    logp = torch.log_softmax(logits, dim=-1)
    tokens = req.output_ids[len(req.output_ids) - emitted :]
    for row, token in enumerate(tokens):
        append_logprobs(req, logp[row], token)
