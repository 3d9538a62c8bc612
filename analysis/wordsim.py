"""Word similarity of the learned input embeddings ([SB] Figure 4 and SM Table 3).

For every benchmark file (lines `word1 word2 score`, tab or space separated) the cosine
similarity of the two words' rows of the input embedding matrix is compared with the human
scores by Spearman's rho. Benchmark words are lower-cased and looked up as they are in the
case-sensitive vocabulary, so on WikiText-2 "Paris" in a benchmark meets the vocabulary's
"paris" (if present), never its "Paris". Pairs with a word outside the vocabulary are skipped
and counted.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from scipy import stats

from . import AnalysisError
from .pooling import compared, refuse_unlike, resolved
from .runs import head_label, markdown_table, read_run_config, require_best_pt, write_csv


@dataclass(frozen=True)
class Benchmark:
    name: str                                # the file name without EN- and .txt, e.g. WS-353-ALL
    pairs: list[tuple[str, str, float]]      # lower-cased words, human score


@dataclass(frozen=True)
class Score:
    rho: float      # nan when fewer than two pairs are in the vocabulary
    used: int
    skipped: int    # pairs with an out-of-vocabulary word
    std: float = float("nan")   # by_head: the sample std of rho over the head's runs (nan for one run)


def read_benchmark(path: Path) -> Benchmark:
    pairs = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            fields = line.split()
            if not fields:
                continue
            try:
                if len(fields) != 3:
                    raise ValueError
                pairs.append((fields[0].lower(), fields[1].lower(), float(fields[2])))
            except ValueError:
                raise AnalysisError(f"{path}:{number}: expected 'word1 word2 score', "
                                    f"got {line.rstrip()!r}") from None
    name = path.stem[3:] if path.stem.startswith("EN-") else path.stem
    return Benchmark(name, pairs)


def read_benchmarks(folder: Path) -> list[Benchmark]:
    if not folder.is_dir():
        raise AnalysisError(f"{folder}: no such benchmark folder")
    files = sorted(folder.glob("*.txt"))
    if not files:
        raise AnalysisError(f"{folder}: no benchmark files (*.txt with lines 'word1 word2 score')")
    return [read_benchmark(path) for path in files]


def score(embeddings: np.ndarray, word_to_id: Mapping[str, int], benchmark: Benchmark) -> Score:
    """Spearman's rho between the embeddings' cosine similarities and the human scores."""
    kept = [(word_to_id[a], word_to_id[b], human) for a, b, human in benchmark.pairs
            if a in word_to_id and b in word_to_id]
    skipped = len(benchmark.pairs) - len(kept)
    if len(kept) < 2:
        return Score(float("nan"), len(kept), skipped)
    first, second, human = (np.array(column) for column in zip(*kept))
    unit = embeddings / np.maximum(np.linalg.norm(embeddings, axis=1, keepdims=True), 1e-12)
    cosine = np.sum(unit[first] * unit[second], axis=1)
    rho, _ = stats.spearmanr(cosine, human)
    return Score(float(rho), len(kept), skipped)


def win_counts(rhos: np.ndarray) -> np.ndarray:
    """wins[i, j] = on how many benchmarks (columns) model i's rho is above model j's."""
    return np.sum(rhos[:, None, :] > rhos[None, :, :], axis=2)


def plot_win_counts(labels: Sequence[str], wins: np.ndarray, benchmarks: int, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    size = 1.2 + 0.7 * len(labels)
    fig, ax = plt.subplots(figsize=(size + 1.5, size))
    image = ax.imshow(wins, cmap="viridis", vmin=0, vmax=benchmarks)
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right")
    ax.set_yticks(range(len(labels)), labels)
    for i in range(len(labels)):
        for j in range(len(labels)):
            ax.text(j, i, str(wins[i, j]), ha="center", va="center",
                    color="black" if wins[i, j] > benchmarks / 2 else "white")
    ax.set_xlabel("model j")
    ax.set_ylabel("model i")
    ax.set_title(f"benchmarks (of {benchmarks}) where model i's\nSpearman rho beats model j's")
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


@dataclass
class ModelScores:
    label: str               # a table row: a run directory's name, or a head's
    dataset: str
    head: str
    scores: list[Score]      # one per benchmark
    setting: dict = field(default_factory=dict)   # what seeds of one configuration share (pooling.py)
    runs: int = 1            # by_head: the runs whose rho the row averages


def score_runs(run_dirs: Sequence[Path], benchmarks: Sequence[Benchmark], device,
               data_dir: str | None = None) -> list[ModelScores]:
    """The scores of each run's best.pt input embedding matrix."""
    from experiment.loading import load_trained

    rows = []
    for run_dir in run_dirs:
        require_best_pt(run_dir, "report.py wordsim")
        run = load_trained(run_dir, device, data_dir)
        embeddings = run.model.body.encoder.weight.detach().cpu().double().numpy()
        word_to_id = run.corpus.word_to_id()
        rows.append(ModelScores(run_dir.name, run.corpus.name, run.config.head_name,
                                [score(embeddings, word_to_id, b) for b in benchmarks],
                                compared(resolved(read_run_config(run_dir)))))
    return rows


def by_head(runs: Sequence[ModelScores]) -> list[ModelScores]:
    """One row per (dataset, head): rho averaged over its runs, with their sample std, which must
    be seeds of one configuration (pooling.py; the pair counts depend on the vocabulary only, so
    they are the same for all of them)."""
    groups: dict[tuple[str, str], list[ModelScores]] = {}
    for run in runs:
        groups.setdefault((run.dataset, run.head), []).append(run)
    several_datasets = len({dataset for dataset, _ in groups}) > 1
    rows = []
    for (dataset, head), members in groups.items():
        refuse_unlike(f"--by-head: {head_label(head)} ({dataset})", [m.setting for m in members])
        scores = []
        for i, s in enumerate(members[0].scores):
            rhos = [m.scores[i].rho for m in members]
            std = float(np.std(rhos, ddof=1)) if len(rhos) > 1 else float("nan")
            scores.append(Score(float(np.mean(rhos)), s.used, s.skipped, std))
        label = head_label(head) + (f" ({dataset})" if several_datasets else "")
        rows.append(ModelScores(label, dataset, head, scores, runs=len(members)))
    return rows


def write_wordsim(rows: Sequence[ModelScores], benchmarks: Sequence[Benchmark], out_prefix: Path) -> str:
    """<prefix>.md, <prefix>.csv and <prefix>_wins.png; return the Markdown."""
    names = [b.name for b in benchmarks]
    def cell(s: Score) -> str:
        if np.isnan(s.rho):
            return "—"
        return f"{s.rho:.4f}" if np.isnan(s.std) else f"{s.rho:.4f} ± {s.std:.4f}"

    body = [[row.label, str(row.runs), *(cell(s) for s in row.scores)] for row in rows]
    for dataset in dict.fromkeys(row.dataset for row in rows):   # counts depend on the vocabulary only
        first = next(row for row in rows if row.dataset == dataset)
        body.append([f"pairs used / skipped ({dataset})", "", *(f"{s.used} / {s.skipped}" for s in first.scores)])
    rhos = np.array([[s.rho for s in row.scores] for row in rows])
    wins = win_counts(rhos)
    labels = [row.label for row in rows]
    text = ("# Word similarity (Spearman's rho of input-embedding cosine similarities)\n\n"
            + markdown_table(["Model", "n", *names], body)
            + "\nn: the runs a row stands for; with several (--by-head), rho is their mean ± sample std. "
              "—: fewer than two of the benchmark's pairs in the vocabulary, so no rho.\n"
            + "\n## Wins (row beats column on this many benchmarks)\n\n"
            + markdown_table(["", *labels], [[a, *map(str, w)] for a, w in zip(labels, wins)])
            + "\nA win compares two rows' rho (means, for rows of several runs) on one benchmark; it is "
              "[SB] Figure 4's count, not a test: no interval is computed for a difference of rho.\n")
    out_prefix.parent.mkdir(parents=True, exist_ok=True)
    out_prefix.with_name(out_prefix.name + ".md").write_text(text, encoding="utf-8")
    header = ["model", "dataset", "runs"] + [f"{n}{suffix}" for n in names
                                             for suffix in ("", "_std", "_used", "_skipped")]
    write_csv(out_prefix.with_name(out_prefix.name + ".csv"), header,
              [[row.label, row.dataset, row.runs,
                *(v for s in row.scores for v in (s.rho, "" if np.isnan(s.std) else s.std, s.used, s.skipped))]
               for row in rows])
    plot_win_counts(labels, wins, len(benchmarks), out_prefix.with_name(out_prefix.name + "_wins.png"))
    return text
