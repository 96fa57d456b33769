"""Retrieval-augmented answers over a small pool of shared documents: questions that
retrieve the same documents, in the same order, reuse their cached tokens.

Run: python examples/rag.py
"""

import radixserve as rs

DOCS = {
    "tides": "Tides are caused mainly by the moon's gravity pulling on the oceans.",
    "bees": "Honey bees make honey from nectar and store it in wax combs.",
    "rust": "Iron rusts when it reacts with oxygen and water over time.",
}


def retrieve(question):  # a stand-in retriever: documents whose key the question mentions
    return sorted(k for k in DOCS if k.rstrip("s") in question.lower()) or sorted(DOCS)


@rs.function
def rag(s, question):
    with s.system():
        s += "Answer from the documents.\n"
        for key in retrieve(question):
            s += f"[{key}] {DOCS[key]}\n"
    s += rs.user(question)
    s += rs.assistant(rs.gen("answer", max_tokens=16, temperature=0))


def main(backend=None):
    backend = backend or rs.Engine("tiny")
    questions = [
        "Why do tides happen?",
        "When are tides highest?",
        "What do bees eat?",
        "How do bees build combs?",
        "Why do bees and tides matter?",
    ]
    states = rag.run_batch([{"question": q} for q in questions], backend=backend)
    for q, st in zip(questions, states, strict=True):
        meta = st.get_meta_info("answer")
        print(f"{q} {meta['cached_tokens']}/{meta['prompt_tokens']} cached: {st['answer']!r}")
    return states


if __name__ == "__main__":
    main()
