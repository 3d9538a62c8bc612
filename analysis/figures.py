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
    """Write the figure to `path` (its folder made where missing); a path that cannot be written
    (a file where a folder should be, no permission) is one line naming it, not a traceback."""
    fig.tight_layout()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    except OSError as e:
        from . import AnalysisError
        raise AnalysisError(f"{path}: cannot write the figure there ({e.strerror or e})") from None
    finally:
        pyplot().close(fig)


FIGURE_SUFFIXES = (".png", ".pdf", ".svg")


def figure_file(out: Path, default_name: str, option: str = "--out") -> Path:
    """The file a figure given as `out` goes to: `out` itself when it names a PNG, PDF or SVG
    file, `out`/default_name when it is an existing folder. Anything else is refused before any
    work, rather than matplotlib's traceback (x.txt) or its silently added .png (a name with no
    suffix, whose printed path would then be wrong)."""
    if out.is_dir():
        return out / default_name
    if out.suffix.lower() not in FIGURE_SUFFIXES:
        from . import AnalysisError
        raise AnalysisError(f"{option} {out}: expected a figure file ending in "
                            f"{', '.join(FIGURE_SUFFIXES)}, or an existing folder (which receives "
                            f"{default_name})")
    return out


def prefixed(prefix: Path, suffix: str) -> Path:
    """PREFIX + suffix, e.g. results/figure2 -> results/figure2.png (a dot in PREFIX is kept)."""
    return prefix.with_name(prefix.name + suffix)


def plain_log_ticks(axis) -> None:
    """Tick labels of a log-scale axis as plain numbers (200, 250, 300), not 2 x 10^2."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    axis.set_major_locator(LogLocator(base=10, subs=(1, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}" if value >= 1 else f"{value:g}"))
    axis.set_minor_formatter(NullFormatter())
