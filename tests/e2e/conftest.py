import pytest
import torch

from radixserve.model import export_preset
from tests.e2e.engine_runs import workload


@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    """transformers' greedy continuation of each prompt, on the exported tiny preset."""
    from transformers import AutoModelForCausalLM

    path = tmp_path_factory.mktemp("tiny")
    export_preset("tiny", path)
    hf = AutoModelForCausalLM.from_pretrained(path).float().eval()
    out = []
    with torch.no_grad():
        for ids in workload():
            gen = hf.generate(
                torch.tensor([ids]), max_new_tokens=12, min_new_tokens=12, do_sample=False
            )
            out.append(gen[0, len(ids) :].tolist())
    return out
