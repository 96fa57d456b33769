"""PNG charts of benchmark rows; matplotlib is an optional extra (``radixserve[bench]``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def _pyplot():
    """matplotlib's pyplot, drawing to files only (no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str | Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    _pyplot().close(fig)


def plot_cache_bench(rows: Sequence[dict], path: str | Path) -> None:
    """match_prefix p50 against hit length, one line per tree size, one panel per page size."""
    plt = _pyplot()

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
    _save(fig, path)


def plot_serving_bench(rows: Sequence[dict], sweep: Sequence[dict], path: str | Path) -> None:
    """Requests/s and hit rate (with the optimal) per workload and configuration, and hit
    rate against KV-pool size when a sweep ran."""
    plt = _pyplot()
    import numpy as np

    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    configs = list(dict.fromkeys(r["config"] for r in rows))
    by = {(r["workload"], r["config"]): r for r in rows}
    panels = 3 if sweep else 2
    fig, axes = plt.subplots(1, panels, figsize=(7 * panels, 4.5))
    x = np.arange(len(workloads))
    width = 0.8 / len(configs)
    for i, config in enumerate(configs):
        for ax, key in ((axes[0], "req_s"), (axes[1], "hit_rate")):
            values = [by.get((w, config), {}).get(key, 0.0) for w in workloads]
            ax.bar(x + i * width, values, width, label=config)
    optimal = [by[(w, configs[0])].get("optimal_hit_rate", 0.0) for w in workloads]
    axes[1].scatter(x + 0.4 - width / 2, optimal, marker="_", s=400, c="k", label="optimal")
    for ax, title in ((axes[0], "requests / s"), (axes[1], "token hit rate")):
        ax.set_xticks(x + 0.4 - width / 2, workloads, rotation=30, ha="right", fontsize=8)
        ax.set_title(title)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].legend(fontsize=7)
    axes[1].legend(fontsize=7)
    if sweep:
        ax = axes[2]
        styles = {"radix-lpm": "o-", "block-hash-fcfs": "s--"}
        for i, workload in enumerate(dict.fromkeys(r["workload"] for r in sweep)):
            for config in dict.fromkeys(r["config"] for r in sweep):
                line = sorted(
                    (r for r in sweep if r["workload"] == workload and r["config"] == config),
                    key=lambda r: r["kv_fraction"],
                )
                ax.plot(
                    [r["kv_fraction"] for r in line],
                    [r["hit_rate"] for r in line],
                    styles.get(config, "x:"),
                    color=f"C{i}",
                    label=f"{workload}, {config}",
                )
        ax.set_xlabel("KV pool / the workload's distinct tokens")
        ax.set_title("hit rate as memory shrinks")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    _save(fig, path)


def plot_kernel_bench(rows: Sequence[dict], path: str | Path) -> None:
    """Decode time against context length, torch and native beside the bandwidth limits,
    one panel per dtype and batch size."""
    plt = _pyplot()

    decode = [r for r in rows if r["kernel"] == "decode"]
    dtypes = list(dict.fromkeys(r["dtype"] for r in decode))
    batches = list(dict.fromkeys(int(r["case"].split(" x ")[0]) for r in decode))
    fig, axes = plt.subplots(
        len(dtypes), len(batches), figsize=(4.5 * len(batches), 3.5 * len(dtypes)), squeeze=False
    )
    for row_axes, dtype in zip(axes, dtypes, strict=True):
        for ax, batch in zip(row_axes, batches, strict=True):
            line = [r for r in decode if r["dtype"] == dtype and r["case"].startswith(f"{batch} x")]
            contexts = [int(r["case"].split(" x ")[1]) for r in line]
            for key, label in (
                ("torch_ms", "torch"),
                ("native_ms", "native"),
                ("read_limit_ms", "read-bandwidth limit"),
            ):
                ax.plot(contexts, [r[key] for r in line], marker="o", label=label)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("context tokens")
            ax.set_ylabel("ms per layer")
            ax.set_title(f"decode, batch {batch}, {dtype}")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
    _save(fig, path)


def plot_serve_frontier(rows: Sequence[dict], path: str | Path) -> None:
    """ITL p99 against TTFT p99, one point per configuration: the trade a step's prefill
    budget makes between running and waiting requests."""
    plt = _pyplot()

    fig, ax = plt.subplots(figsize=(8, 5))
    markers = "osD^v<>phX*"
    for i, r in enumerate(rows):
        ax.scatter(
            r["ttft_p99_ms"],
            r["itl_p99_ms"],
            s=50,
            marker=markers[i % len(markers)],
            label=r["config"],
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("TTFT p99 (ms)")
    ax.set_ylabel("inter-token latency p99 (ms)")
    ax.set_title("bench serve: latency of running against waiting requests")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    _save(fig, path)


def plot_structured_bench(rows: Sequence[dict], path: str | Path) -> None:
    """Forward passes and seconds per configuration of the JSON-extraction workload."""
    panels = (("steps", "forward passes"), ("seconds", "seconds (median round)"))
    _bar_panels(rows, panels, "bench structured: JSON extraction under a shared document", path)


def plot_cluster_bench(rows: Sequence[dict], path: str | Path) -> None:
    """Hit rate, throughput and TTFT p99 per router (and one engine alone)."""
    panels = (
        ("hit_rate", "token hit rate"),
        ("req_s", "requests/s"),
        ("ttft_p99_ms", "TTFT p99 (ms)"),
    )
    _bar_panels(rows, panels, "bench cluster: two replicas under a multi-tenant chat load", path)


def _bar_panels(rows: Sequence[dict], panels, title: str, path: str | Path) -> None:
    """One bar chart per ``(key, title)`` panel, a bar per row's ``config``."""
    plt = _pyplot()

    labels = [r["config"] for r in rows]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels) - 1, 3.5), squeeze=False)
    for ax, (key, name) in zip(axes[0], panels, strict=True):
        ax.bar(labels, [r[key] for r in rows], color=[f"C{i}" for i in range(len(rows))])
        ax.set_title(name)
        ax.tick_params(axis="x", labelrotation=20)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(title)
    _save(fig, path)
