"""What every figure of report.py shares: matplotlib without a display, and saving a readable PNG."""
from __future__ import annotations

from pathlib import Path


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend (imported only when a figure is drawn)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot().close(fig)


def prefixed(prefix: Path, suffix: str) -> Path:
    """PREFIX + suffix, e.g. results/figure2 -> results/figure2.png (a dot in PREFIX is kept)."""
    return prefix.with_name(prefix.name + suffix)
