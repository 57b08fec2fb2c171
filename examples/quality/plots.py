"""The figures the quality scripts write: loss curves per scheme, and a metric against memory."""

from pathlib import Path

from pock_mlir.files import atomic_save


def _figure(figsize=(7, 4)):
    import matplotlib

    matplotlib.use("Agg")  # no display on the machines these run on
    import matplotlib.pyplot as plt

    return plt, *plt.subplots(figsize=figsize)


def _save(plt, fig, ax, title: str, path: Path) -> None:
    ax.set_title(title)
    fig.tight_layout()
    atomic_save(path, lambda f: fig.savefig(f, dpi=120, format="png"))
    plt.close(fig)


def save_loss_curves(curves: dict, ylabel: str, title: str, path: Path) -> None:
    """curves: {legend label: sequence of losses per fine-tuning step}."""
    plt, fig, ax = _figure()
    for label, losses in curves.items():
        ax.plot(losses, label=label)
    ax.set_xlabel("fine-tuning step")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    _save(plt, fig, ax, title, path)


def save_against_memory(points: dict, ylabel: str, title: str, path: Path) -> None:
    """points: {scheme: (device MB, metric)}, one marker each in the legend (a star for searched
    schemes), the legend beside the plot so that it hides no point."""
    plt, fig, ax = _figure(figsize=(11, 4.5))
    colors = plt.get_cmap("tab20").colors  # a colour per scheme for up to 20 of them
    for i, (label, (mb, value)) in enumerate(points.items()):
        ax.scatter(
            [mb],
            [value],
            marker="*" if "searched" in label else "o",
            s=90 if "searched" in label else 60,
            color=colors[i % len(colors)],
            label=label,
        )
    ax.set_xlabel("training memory on the device (MB, Trainer.device_bytes)")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _save(plt, fig, ax, title, path)
