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


def plain_log_ticks(axis) -> None:
    """Tick labels of a log-scale axis as plain numbers (200, 250, 300), not 2 x 10^2."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    axis.set_major_locator(LogLocator(base=10, subs=(1, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}" if value >= 1 else f"{value:g}"))
    axis.set_minor_formatter(NullFormatter())
