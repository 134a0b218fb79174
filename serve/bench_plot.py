"""The PNG of `rec bench`: p99 latency against throughput, one panel per request batch size."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers
import matplotlib.pyplot as plt  # noqa: E402


def _series(row: dict) -> str:
    """A line's name: the target, and the request form of a --candidates sweep."""
    return f"{row['target']} {row['form']}" if "form" in row else row["target"]


def plot_results(rows: list[dict], path: Path, title: str | None = None) -> None:
    """Closed-loop sweeps as solid lines (one point per concurrency), open-loop as markers."""
    batches = sorted({r["batch"] for r in rows})
    fig, axes = plt.subplots(1, len(batches), figsize=(6.5 * len(batches), 4.8), squeeze=False)
    for ax, batch in zip(axes[0], batches, strict=True):
        for target in dict.fromkeys(_series(r) for r in rows):
            mine = [r for r in rows if _series(r) == target and r["batch"] == batch and r["ok"]]
            closed = sorted(
                (r for r in mine if not r["offered_rps"]), key=lambda r: r["concurrency"]
            )
            opened = [r for r in mine if r["offered_rps"]]
            x = [r["throughput_samples_per_s"] for r in closed]
            y = [r["latency_ms"]["p99"] for r in closed]
            (line,) = ax.plot(x, y, marker="o", label=f"{target} (closed loop)")
            for r in closed:
                ax.annotate(f"c{r['concurrency']}", (x[closed.index(r)], y[closed.index(r)]),
                            fontsize=7, xytext=(3, 3), textcoords="offset points")  # fmt: skip
            if opened:
                ax.scatter(
                    [r["throughput_samples_per_s"] for r in opened],
                    [r["latency_ms"]["p99"] for r in opened],
                    marker="x", color=line.get_color(), label=f"{target} (fixed rate)",
                )  # fmt: skip
        ax.set_title(f"requests of B={batch} samples")
        ax.set_xlabel("throughput (samples/s)")
        ax.set_ylabel("p99 latency (ms)")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
