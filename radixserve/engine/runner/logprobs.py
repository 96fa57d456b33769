"""Log-probabilities of generated tokens (and, when asked, of prompt tokens), taken from the
model's distribution (with a request's ``logit_bias`` added, as OpenAI reports them): before
temperature, penalties and truncation."""

from __future__ import annotations

import torch

from radixserve.engine.req import Req
from radixserve.engine.runner.model_runner import ForwardOutput
from radixserve.engine.scheduler.batch import ScheduleBatch


def record_logprobs(batch: ScheduleBatch, out: ForwardOutput, tokens: list[int]) -> None:
    wanted = [i for i, r in enumerate(out.sampled) if r.params.return_logprob]
    if wanted:
        logp = torch.log_softmax(out.last[wanted].float(), dim=-1)
        for row, i in enumerate(wanted):
            append_logprobs(out.sampled[i], logp[row], tokens[i])
    if out.all is None:
        return
    offset = 0
    for item in batch.work:
        req, n = item.req, item.end - item.start
        start = req.params.logprob_start_len
        if req.params.prompt_logprobs:
            # Row r holds the distribution of the token at position item.start + r + 1.
            targets = range(item.start + 1, min(item.end + 1, len(req.input_ids)))
            picked = [t for t in targets if t >= start and t not in req.logprobs.prompt]
            if picked:
                rows = torch.tensor([offset + t - 1 - item.start for t in picked])
                ids = torch.from_numpy(req.input_ids[picked].astype("int64"))
                logp = torch.log_softmax(out.all[rows].float(), dim=-1)
                values = logp.gather(1, ids[:, None])[:, 0].tolist()
                req.logprobs.prompt.update(zip(picked, values, strict=True))
                if req.params.top_logprobs_num:
                    req.logprobs.prompt_top.update(zip(picked, _top(logp, req), strict=True))
        offset += n


def append_logprobs(req: Req, logp: torch.Tensor, token: int) -> None:
    """Record a generated token's logprob (and the top alternatives, when asked) from the
    log-softmaxed distribution ``logp`` it was drawn from."""
    req.logprobs.output.append((float(logp[token]), token))
    if req.params.top_logprobs_num:
        req.logprobs.output_top.append(_top(logp[None], req)[0])


def _top(logp: torch.Tensor, req: Req) -> list[list[tuple[float, int]]]:
    """The request's top alternatives, ``(logprob, token id)`` best first, of each row."""
    top = logp.topk(req.params.top_logprobs_num, dim=-1)
    values, indices = top.values.tolist(), top.indices.tolist()
    return [list(zip(v, i, strict=True)) for v, i in zip(values, indices, strict=True)]
