"""Tree of thought: branches fork from a shared question and from each other's thoughts,
so each level's calls reuse everything above them.

Run: python examples/tree_of_thought.py
"""

import radixserve as rs


@rs.function
def tree_of_thought(s, question, width=2, depth=2):
    s += rs.system("Think step by step; propose one idea per step.")
    s += rs.user(question)
    frontier = [s]
    for level in range(depth):
        children = []
        for node in frontier:
            for branch in node.fork(width):
                branch += f"\nStep {level + 1}: "
                branch += rs.gen(f"step{level}", max_tokens=12, temperature=0.8)
                children.append(branch)
        frontier = children
    return [leaf.text() for leaf in frontier]


def main(backend=None):
    backend = backend or rs.Engine("tiny")
    state = tree_of_thought.run(question="How can a city cut traffic?", backend=backend)
    for branch in state.children:
        print("branch:", repr(branch["step0"]))
    return state


if __name__ == "__main__":
    main()
