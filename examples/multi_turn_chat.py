"""A multi-turn chat: each turn sends only the new tokens' worth of work, the rest is cached.

Run: python examples/multi_turn_chat.py
"""

import radixserve as rs


@rs.function
def chat(s, questions):
    s += rs.system("You are a helpful assistant who answers briefly.")
    for i, question in enumerate(questions):
        s += rs.user(question)
        s += rs.assistant(rs.gen(f"answer{i}", max_tokens=16, temperature=0))


def main(backend=None):
    backend = backend or rs.Engine("tiny")
    questions = ["Plan a day in Lisbon.", "Where should I eat lunch?", "And in the evening?"]
    state = chat.run(questions=questions, backend=backend)
    for message in state.messages():
        print(f"{message['role']:>9}: {message['content']!r}")
    for i in range(len(questions)):
        meta = state.get_meta_info(f"answer{i}")
        print(f"turn {i}: {meta['cached_tokens']} of {meta['prompt_tokens']} prompt tokens cached")
    return state


if __name__ == "__main__":
    main()
