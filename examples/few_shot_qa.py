"""Few-shot question answering: every question reuses the cached examples.

Run: python examples/few_shot_qa.py
"""

import radixserve as rs

EXAMPLES = [
    ("What is the capital of France?", "Paris"),
    ("How many legs does a spider have?", "Eight"),
    ("What colour is the sky on a clear day?", "Blue"),
    ("What is 3 times 4?", "Twelve"),
    ("Which planet is closest to the sun?", "Mercury"),
]


@rs.function
def few_shot(s, question):
    s += "Answer each question in one word.\n\n"
    for q, a in EXAMPLES:
        s += f"Question: {q}\nAnswer: {a}\n\n"
    s += f"Question: {question}\nAnswer:"
    s += rs.gen("answer", max_tokens=8, stop="\n", temperature=0)


def main(backend=None):
    backend = backend or rs.Engine("tiny")
    questions = ["What is 2 plus 2?", "Who wrote Hamlet?", "What do bees make?"]
    states = few_shot.run_batch([{"question": q} for q in questions], backend=backend)
    for q, st in zip(questions, states, strict=True):
        print(f"{q} -> {st['answer']!r} ({st.get_meta_info('answer')['cached_tokens']} cached)")
    return states


if __name__ == "__main__":
    main()
