"""The figures the quality scripts write: loss curves per scheme, and a metric against memory."""

from pathlib import Path

from pock_mlir.files import atomic_save


def _figure():
    import matplotlib

    matplotlib.use("Agg")  # no display on the machines these run on
    import matplotlib.pyplot as plt

    return plt, *plt.subplots(figsize=(7, 4))


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


def save_accuracy_memory(points: dict, ylabel: str, title: str, path: Path) -> None:
    """points: {scheme: (device MB, metric)}, one labelled marker each (a star for searched schemes)."""
    plt, fig, ax = _figure()
    for label, (mb, value) in points.items():
        ax.scatter([mb], [value], marker="*" if label.startswith("searched") else "o")
        ax.annotate(label, (mb, value), fontsize=7, xytext=(4, 3), textcoords="offset points")
    ax.set_xlabel("training memory on the device (MB, Trainer.device_bytes)")
    ax.set_ylabel(ylabel)
    _save(plt, fig, ax, title, path)
