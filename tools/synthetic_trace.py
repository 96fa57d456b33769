"""Write a seeded trace in Mooncake's shape (JSONL: timestamp in ms, input_length,
output_length, hash_ids of 512-token blocks) for ``radixserve simulate``: chats under a few
dozen shared system prompts, each turn extending its conversation, Poisson arrivals.

    python tools/synthetic_trace.py --requests 20000 --out trace.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json
import random

BLOCK = 512


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--systems", type=int, default=24, help="shared system prompts")
    p.add_argument("--rate", type=float, default=5.0, help="arrivals per second")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    rng = random.Random(args.seed)
    ids = itertools.count(1)
    systems = [[next(ids) for _ in range(rng.randint(2, 6))] for _ in range(args.systems)]
    live: list[list[int]] = []  # open conversations, oldest first
    now_ms = 0.0
    with open(args.out, "w") as f:
        for _ in range(args.requests):
            now_ms += 1000 * rng.expovariate(args.rate)
            if live and rng.random() < 0.5:  # a follow-up turn
                blocks = rng.choice(live)
                blocks += [next(ids) for _ in range(rng.randint(1, 3))]
            else:
                blocks = [*rng.choice(systems), *(next(ids) for _ in range(rng.randint(1, 3)))]
                live.append(blocks)
                if len(live) > 200:
                    live.pop(0)
            row = {
                "timestamp": round(now_ms),
                "input_length": BLOCK * (len(blocks) - 1) + rng.randint(1, BLOCK),
                "output_length": rng.randint(10, 400),
                "hash_ids": list(blocks),
            }
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
