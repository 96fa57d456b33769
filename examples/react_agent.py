"""A ReAct-style tool loop: the trajectory grows by a thought, an action and an
observation per step, and each step's call extends the cached trajectory.

Run: python examples/react_agent.py
"""

import radixserve as rs

TOOLS = {"search": lambda q: f"3 results for {q!r}", "calc": lambda e: "42"}


@rs.function
def agent(s, task, steps=3):
    s += "Use the tools search[query] and calc[expr] to solve the task.\n"
    s += f"Task: {task}\n"
    for i in range(steps):
        s += f"Thought {i + 1}:"
        s += rs.gen(f"thought{i}", max_tokens=12, stop="\n", temperature=0)
        s += f"\nAction {i + 1}: "
        s += rs.select(f"tool{i}", choices=list(TOOLS))
        observation = TOOLS[s[f"tool{i}"]](s[f"thought{i}"].strip())
        s += f"\nObservation {i + 1}: {observation}\n"


def main(backend=None):
    backend = backend or rs.Engine("tiny")
    state = agent.run(task="How tall is the tallest tower in Paris?", backend=backend)
    print(state.text())
    return state


if __name__ == "__main__":
    main()
