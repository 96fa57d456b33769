"""Draft several answers in parallel branches, then have the model pick the best one.

Run: python examples/judge.py
"""

import radixserve as rs


@rs.function
def judge(s, question, n=3):
    s += rs.system("You are a careful grader.")
    s += rs.user(question)
    drafts = s.fork(n)
    for d in drafts:
        d += rs.assistant(rs.gen("draft", max_tokens=24, temperature=0.8))
    s += rs.user("Pick the best draft:\n" + "\n".join(d["draft"] for d in drafts))
    s += rs.assistant(rs.select("best", choices=[str(i) for i in range(n)]))


def main(backend=None):
    backend = backend or rs.Engine("tiny")
    state = judge.run(question="What is 2+2?", backend=backend)
    print("best draft:", state["best"])
    print(state.text())
    return state


if __name__ == "__main__":
    main()
