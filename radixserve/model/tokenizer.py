"""A byte-level BPE tokenizer built offline, for the presets (no hub, no files needed).

It is trained with the ``tokenizers`` library on a seeded synthetic English corpus, so every
machine builds the same one, and wrapped as a transformers fast tokenizer with a ChatML chat
template.
"""

from __future__ import annotations

import functools
import random

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_WORDS = """the a an of to and in is it you that he was for on are with as his they be at one
have this from or had by hot word but what some we can out other were all there when up use
your how said each she which do their time if will way about many then them write would like
so these her long make thing see him two has look more day could go come did number sound no
most people my over know water than call first who may down side been now find any new work
part take get place made live where after back little only round man year came show every
good me give our under name very through just form sentence great think say help low line
differ turn cause much mean before move right boy old too same tell does set three want air
well also play small end put home read hand port large spell add even land here must big high
such follow act why ask men change went light kind off need house picture try us again animal
point mother world near build self earth father head stand own page should country found
answer school grow study still learn plant cover food sun four between state keep eye never
last let thought city tree cross farm hard start might story saw far sea draw left late run
cache prefix tree token model serve request batch memory page slot attention query key value
system user assistant question because reason first second answer explain why how what""".split()  # noqa: SIM905


def corpus(seed: int = 0, lines: int = 4000) -> list[str]:
    """Seeded English-like sentences of this tokenizer's words: its training text, and the
    text benchmarks and tests build prompts from (the same seed, the same lines)."""
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        words = rng.choices(_WORDS, k=rng.randint(4, 16))
        sentence = " ".join(words).capitalize()
        out.append(sentence + rng.choice([".", "?", "!", ",", ":", " 42.", " (1, 2, 3)."]))
    return out


@functools.lru_cache(maxsize=2)
def build_tokenizer(vocab_size: int = 2048):
    """A transformers ``PreTrainedTokenizerFast``; the same on every machine."""
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
    )
