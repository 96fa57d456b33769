"""A stream's chunks, built from a request as the scheduler thread extends it: each chunk's
tokens come with their logprobs, even when tokens joined the output before their logprobs
were recorded (a verified draft's do), and the prompt's logprobs come with the first."""

import numpy as np

from radixserve.engine.outputs import StreamCursor
from radixserve.engine.req import Req
from radixserve.engine.sampling_params import SamplingParams


def test_tokens_wait_in_the_stream_for_their_logprobs():
    params = SamplingParams(return_logprob=True, top_logprobs_num=1, logprob_start_len=0)
    req = Req("r", np.array([7, 8], dtype=np.int32), params)
    req.logprobs.prompt, req.logprobs.prompt_top = {1: -0.5}, {1: [(-0.5, 8)]}
    cursor = StreamCursor(req, 0)
    req.logprobs.output.append((-0.1, 3))
    req.logprobs.output_top.append([(-0.1, 3)])
    req.output_ids += [3, 4, 5]  # 4 and 5: a draft verified, its logprobs not yet recorded
    first = cursor.chunk(done=False)
    assert first["token_ids"] == [3] and first["output_token_logprobs"] == [(-0.1, 3)]
    assert first["input_token_logprobs"] == [(None, 7), (-0.5, 8)]
    assert first["input_top_logprobs"] == [None, [(-0.5, 8)]]
    assert cursor.chunk(done=False) is None  # nothing whose logprobs are in yet
    req.logprobs.output += [(-0.2, 4), (-0.3, 5)]
    req.logprobs.output_top += [[(-0.2, 4)], [(-0.3, 5)]]
    rest = cursor.chunk(done=True)
    assert rest["token_ids"] == [4, 5] and rest["output_token_logprobs"] == [(-0.2, 4), (-0.3, 5)]
    assert rest["output_top_logprobs"] == [[(-0.2, 4)], [(-0.3, 5)]]
    assert "input_token_logprobs" not in rest


def test_a_stream_without_logprobs_sends_tokens_as_they_join():
    req = Req("r", np.array([7], dtype=np.int32), SamplingParams())
    cursor = StreamCursor(req, 0)
    req.output_ids += [3, 4]
    chunk = cursor.chunk(done=False)
    assert chunk["token_ids"] == [3, 4] and "output_token_logprobs" not in chunk
