"""The tokens a forward pass gives its requests: for the rows that sample, logit bias, the
grammar's mask, a draw and its logprobs; for the rows that verified drafts, the kept drafts
and the token after them (``speculative.py``), under the grammar's mask at each position."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import replace

from radixserve.engine.req import Req
from radixserve.engine.runner.logprobs import record_logprobs
from radixserve.engine.runner.model_runner import Drafted, ForwardOutput
from radixserve.engine.runner.sampler import Sampler, add_logit_bias
from radixserve.engine.scheduler.batch import ScheduleBatch
from radixserve.engine.speculative.verify import verify
from radixserve.engine.structured.constrained import ConstrainedDecoding


def new_tokens(
    batch: ScheduleBatch,
    out: ForwardOutput,
    masks: Future | None,
    constrained: ConstrainedDecoding,
    sampler: Sampler,
) -> tuple[dict[Req, list[int]], list[Drafted]]:
    """Each request's new tokens, and the drafted rows as verified (masked logits)."""
    out = replace(out, last=add_logit_bias(out.last, out.sampled))
    tokens = sampler.sample(constrained.apply(out.last, masks), out.sampled)
    record_logprobs(batch, out, tokens)
    new = {req: [token] for req, token in zip(out.sampled, tokens, strict=True)}
    drafted = constrained.apply_drafted(out.drafted, masks)
    new |= {d.req: verify(d, sampler) for d in drafted}
    return new, drafted
