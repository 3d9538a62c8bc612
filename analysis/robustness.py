"""[SB] SM Tables 14-16 from the robustness_test.json files `rank.py RUN --robustness` writes.

Per run: SM Table 14 (Algorithm 1: Press rank and error after each SVD reconstruction of the
rank-10 truncation), SM Table 15 (Algorithm 2: Press rank against the noise scale c) and SM
Table 16 (the same with the epsilon-effective ranks), each with [SB]'s values (MoS on PTB's
first 10,000 test contexts; analysis/published.py, ROBUSTNESS) beside the measured ones, and a
figure of the Press rank against c for all runs.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from . import AnalysisError
from .figures import prefixed, pyplot, save
from .published import ROBUSTNESS, dataset_label, same_value
from .runs import head_label, markdown_table, read_json
from .tables import read_run, run_file_note

FILE = "robustness_test.json"
ERROR_UNIT = 1e-28                     # SM Table 14 prints "Error x 10^-28"


def load(run_dirs: Sequence[Path]) -> tuple[list[tuple[str, dict]], list[str]]:
    """(label, result) per run with a robustness file, and a note per run without one."""
    found, missing = [], []
    for run_dir in run_dirs:
        result = read_json(run_dir / FILE)
        if result is None:
            other = (f"; its robustness_valid.json is of the validation split, [SB]'s tables of the test "
                     f"split" if (run_dir / "robustness_valid.json").is_file() else "")
            missing.append(f"{run_dir}: no {FILE}{other} (run python rank.py {run_dir} --robustness)")
            continue
        if note := run_file_note(run_dir, FILE, result):
            missing.append(f"{run_dir}: left out: {note}")
            continue
        for key in ("head", "dataset", "contexts", "keep", "original", "reconstruction", "noise"):
            if key not in result:
                raise AnalysisError(f"{run_dir / FILE}: no {key!r}: not written by rank.py --robustness")
        seed = read_run(run_dir).seed
        found.append((f"{head_label(result['head'])}, {dataset_label(result['dataset'])}"
                      + (f", seed {seed}" if seed is not None else ""), result))
    if not found:
        raise AnalysisError("no robustness results found: " + "; ".join(missing))
    return found, missing


def paper_value(table: dict, c: float):
    return next((value for key, value in table.items() if same_value(key, c)), None)


def show(value) -> str:
    return "—" if value is None else f"{value:,}"


def reconstruction_table(result: dict) -> str:
    """SM Table 14's layout: iterations as columns, measured and [SB] rows."""
    records = [r for r in result["reconstruction"] if r["iteration"] > 0]
    paper = {i: (rank, error) for i, rank, error in ROBUSTNESS.reconstruction}
    header = ["Iteration", *[str(r["iteration"]) for r in records]]
    rows = [["Press rank", *[show(r["press_rank"]) for r in records]],
            ["[SB] Press rank", *[show(paper.get(r["iteration"], (None,))[0]) for r in records]],
            ["Error ×1e-28", *[f"{r['error'] / ERROR_UNIT:.2f}" for r in records]],
            ["[SB] Error ×1e-28", *[f"{paper[r['iteration']][1]:.2f}" if r["iteration"] in paper else "—"
                                    for r in records]]]
    return markdown_table(header, rows)


def noise_table(result: dict) -> str:
    """SM Table 15: Press rank against c."""
    rows = [[f"{r['c']:.0e}", show(r["press_rank"]), show(paper_value(ROBUSTNESS.noise_press_rank, r["c"]))]
            for r in result["noise"]]
    return markdown_table(["c", "Press rank", "[SB] Press rank"], rows)


def effective_rank_table(result: dict) -> str:
    """SM Table 16: Press rank and epsilon-effective ranks against c."""
    epsilons = list(result["noise"][0]["effective_rank"]) if result["noise"] else []
    header = ["c", "Press rank", "[SB]", *[f"eps {float(e):g}" for e in epsilons], "[SB] eps 1e-3 / 1e-4 / 1e-5"]
    rows = []
    for r in result["noise"]:
        paper = paper_value(ROBUSTNESS.noise_effective_rank, r["c"])
        rows.append([f"{r['c']:.0e}", show(r["press_rank"]), show(paper_value(ROBUSTNESS.noise_press_rank, r["c"])),
                     *[show(r["effective_rank"][e]) for e in epsilons],
                     " / ".join(map(str, paper)) if paper else "—"])
    return markdown_table(header, rows)


def plot(found: Sequence[tuple[str, dict]], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for label, result in found:
        records = sorted(result["noise"], key=lambda r: r["c"])
        ax.plot([r["c"] for r in records], [r["press_rank"] for r in records], "o-",
                label=f"{label}: {result['contexts']:,} contexts, top {result['keep']} kept")
    paper = sorted(ROBUSTNESS.noise_press_rank.items())
    ax.plot([c for c, _ in paper], [rank for _, rank in paper], "s--", color="tab:red", markerfacecolor="none",
            label=f"[SB] SM Table 15: MoS, PTB, {ROBUSTNESS.contexts:,} contexts, top {ROBUSTNESS.keep} kept")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set(title="Press rank of a rank-10 matrix plus N(0, c / n²) noise ([SB] SM Algorithm 2)",
           xlabel="noise scale c (the noise variance is c / n², n the number of singular values)",
           ylabel="Press rank")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3, which="both")
    save(fig, path)


def write_robustness(run_dirs: Sequence[Path], out_prefix: Path) -> str:
    """Write PREFIX.md and PREFIX.png; return the Markdown."""
    found, missing = load(run_dirs)
    parts = ["# [SB] SM Tables 14-16: robustness of the Press rank\n",
             f"[SB]: MoS on the first {ROBUSTNESS.contexts:,} contexts of PTB's test set, whose "
             f"log-P matrix has Press rank {ROBUSTNESS.press_rank:,} (the SM does not name its precision; "
             "[SB]'s Press ranks count with float32's epsilon, its algorithms' errors are float64's); top "
             f"{ROBUSTNESS.keep} singular values kept. Error: mean squared entry difference from the rank-10 matrix.\n"]
    for label, result in found:
        original = result["original"]
        float32 = result.get("original_float32")
        parts.append(f"## {label}\n\n{result['contexts']:,} contexts, {original['shape'][0]:,} x "
                     f"{original['shape'][1]:,} log-P matrix in {original['dtype']}: Press rank "
                     f"{original['press_rank']:,}"
                     + (f" (from a float32 model pass, in float32: {float32['press_rank']:,})" if float32 else "")
                     + f"; top {result['keep']} singular values kept.\n")
        parts.append("### SM Table 14: robustness to SVD reconstruction errors (Algorithm 1)\n\n"
                     + reconstruction_table(result))
        parts.append("### SM Table 15: robustness to Gaussian additive noise (Algorithm 2)\n\n" + noise_table(result))
        parts.append("### SM Table 16: Press rank and epsilon-effective rank under the noise\n\n"
                     + effective_rank_table(result))
    if missing:
        parts.append("## Missing\n\n" + "\n".join(f"- {note}" for note in missing) + "\n")
    plot(found, prefixed(out_prefix, ".png"))
    text = "\n".join(parts)
    prefixed(out_prefix, ".md").write_text(text, encoding="utf-8")
    return text
