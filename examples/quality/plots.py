"""The loss-curve figure both quality scripts write: one curve per scheme, in one PNG."""

from pathlib import Path

from pock_mlir.files import atomic_save


def save_loss_curves(curves: dict, ylabel: str, title: str, path: Path) -> None:
    """curves: {legend label: sequence of losses per fine-tuning step}."""
    import matplotlib

    matplotlib.use("Agg")  # no display on the machines these run on
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, losses in curves.items():
        ax.plot(losses, label=label)
    ax.set_xlabel("fine-tuning step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    atomic_save(path, lambda f: fig.savefig(f, dpi=120, format="png"))
    plt.close(fig)
