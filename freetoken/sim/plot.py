"""Miss-rate-versus-capacity curves, one line per policy."""

from __future__ import annotations

from freetoken.sim.replay import ReplayResult


def plot_miss_curves(results: list[ReplayResult], universe: int, title: str, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for name in dict.fromkeys(r.policy for r in results):
        mine = sorted((r for r in results if r.policy == name), key=lambda r: r.slots)
        style = dict(color="black", linestyle="--") if name == "belady" else {}
        ax.plot([r.slots / universe for r in mine], [r.miss_rate for r in mine], marker="o", markersize=3, label=name, **style)
    ax.set_xlabel("cache capacity (fraction of all layer x expert entries)")
    ax.set_ylabel("decode miss rate")
    ax.set_ylim(0, 1.02)
    ax.set_xlim(0, None)
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
