"""PNG charts of benchmark rows; matplotlib is an optional extra (``radixserve[bench]``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def plot_cache_bench(rows: Sequence[dict], path: str | Path) -> None:
    """match_prefix p50 against hit length, one line per tree size, one panel per page size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    page_sizes = sorted({r["page_size"] for r in rows})
    fig, axes = plt.subplots(1, len(page_sizes), figsize=(6 * len(page_sizes), 4), squeeze=False)
    for ax, page_size in zip(axes[0], page_sizes, strict=True):
        matches = [r for r in rows if r["page_size"] == page_size and r["op"] == "match"]
        for group in dict.fromkeys(r["group"] for r in matches):
            line = sorted((r for r in matches if r["group"] == group), key=lambda r: r["hit_len"])
            ax.plot(
                [r["hit_len"] for r in line],
                [r["p50_us"] for r in line],
                marker="o",
                label=group,
            )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens matched")
        ax.set_ylabel("match_prefix p50 (µs)")
        ax.set_title(f"page size {page_size}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
