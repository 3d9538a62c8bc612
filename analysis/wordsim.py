"""Word similarity of the learned input embeddings ([SB] Figure 4 and SM Table 3).

For every benchmark file (lines `word1 word2 score`, tab or space separated) the cosine
similarity of the two words' rows of the input embedding matrix is compared with the human
scores by Spearman's rho. Benchmark words are lower-cased and looked up as they are in the
case-sensitive vocabulary, so on WikiText-2 "Paris" in a benchmark meets the vocabulary's
"paris" (if present), never its "Paris". Pairs with a word outside the vocabulary are skipped
and counted, so runs of different vocabularies (other corpora, or a modified corpus) are scored on
different pairs of a benchmark: their rho are not compared (no win either way), nor averaged.
The benchmarks are the EN-*.txt files of a folder (other files there are not read): --benchmarks,
else the word-similarity/ folder of the data directory the corpora are read from.
"""
from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from scipy import stats

from data.corpus import resolve_data_dir
from . import AnalysisError
from .pooling import compared, refuse_unlike, run_setting
from .runs import head_label, markdown_table, require_best_pt, write_csv


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


BENCHMARK_FILES = "EN-*.txt"    # the 13 published files' names; a README.txt beside them is not one


def read_benchmark(path: Path) -> Benchmark:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise AnalysisError(f"{path}: cannot read the benchmark file ({e.strerror or e})") from None
    # Decoded whole rather than line by line, so that the error can name the line it is on.
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise AnalysisError(f"{path}:{line}: not UTF-8 text (byte 0x{raw[e.start]:02x}); benchmark files "
                            f"are read as UTF-8, as the corpus files are: convert it to UTF-8") from None
    pairs = []
    # newline=None: lines end as open() in text mode ends them (\n, \r\n or \r)
    for number, line in enumerate(io.StringIO(text, newline=None), 1):
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
    return Benchmark(path.stem.removeprefix("EN-"), pairs)


def read_benchmarks(folder: Path) -> list[Benchmark]:
    if not folder.is_dir():
        raise AnalysisError(f"{folder}: no such benchmark folder")
    files = sorted(folder.glob(BENCHMARK_FILES))
    if not files:
        raise AnalysisError(f"{folder}: no benchmark files ({BENCHMARK_FILES} with lines 'word1 word2 score')")
    return [read_benchmark(path) for path in files]


def benchmark_folder(data_dir: str | None) -> Path:
    """The folder --benchmarks defaults to: word-similarity/ in the data directory the corpora are
    read from (resolve_data_dir: --data-dir, else $AWD_DATA_DIR, else the repository's corpora/)."""
    folder = resolve_data_dir(data_dir) / "word-similarity"
    if not folder.is_dir():
        raise AnalysisError(f"{folder}: no such benchmark folder (without --benchmarks, the word-similarity/ "
                            f"folder of the data directory: --data-dir, else $AWD_DATA_DIR, else corpora/ "
                            f"in the repository); put the {BENCHMARK_FILES} files there or give --benchmarks FOLDER")
    return folder


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


def plot_win_counts(labels: Sequence[str], wins: np.ndarray, compared_pairs: np.ndarray, benchmarks: int,
                    path: Path) -> None:
    """compared_pairs[i, j]: whether rows i and j were scored on the same pairs; where not, the
    cell is left blank and marked —."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    size = 1.2 + 0.7 * len(labels)
    fig, ax = plt.subplots(figsize=(size + 1.5, size))
    image = ax.imshow(np.ma.masked_where(~compared_pairs, wins), cmap="viridis", vmin=0, vmax=benchmarks)
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right")
    ax.set_yticks(range(len(labels)), labels)
    for i in range(len(labels)):
        for j in range(len(labels)):
            if compared_pairs[i, j]:
                ax.text(j, i, str(wins[i, j]), ha="center", va="center",
                        color="black" if wins[i, j] > benchmarks / 2 else "white")
            else:   # a masked cell is left white
                ax.text(j, i, "—", ha="center", va="center", color="black")
    ax.set_xlabel("model j")
    ax.set_ylabel("model i")
    ax.set_title(f"benchmarks (of {benchmarks}) where model i's\nSpearman rho beats model j's"
                 + ("" if compared_pairs.all() else "\n(—: other vocabularies, other pairs)"))
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
    vocabulary: str          # the corpus vocabulary's sha256: rows of one vocabulary are scored on the same pairs
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
                                [score(embeddings, word_to_id, b) for b in benchmarks], run.corpus.vocab_sha256,
                                compared(run_setting(run_dir))))
    return rows


def by_head(runs: Sequence[ModelScores]) -> list[ModelScores]:
    """One row per (dataset, head): rho averaged over its runs, with their sample std, which must
    be seeds of one configuration (pooling.py) scored on the same pairs (one vocabulary)."""
    groups: dict[tuple[str, str], list[ModelScores]] = {}
    for run in runs:
        groups.setdefault((run.dataset, run.head), []).append(run)
    several_datasets = len({dataset for dataset, _ in groups}) > 1
    rows = []
    for (dataset, head), members in groups.items():
        refuse_unlike(f"--by-head: {head_label(head)} ({dataset})", [m.setting for m in members])
        refuse_other_vocabularies(f"--by-head: {head_label(head)} ({dataset})", members)
        scores = []
        for i, s in enumerate(members[0].scores):
            rhos = [m.scores[i].rho for m in members]
            std = float(np.std(rhos, ddof=1)) if len(rhos) > 1 else float("nan")
            scores.append(Score(float(np.mean(rhos)), s.used, s.skipped, std))
        label = head_label(head) + (f" ({dataset})" if several_datasets else "")
        rows.append(ModelScores(label, dataset, head, scores, members[0].vocabulary, runs=len(members)))
    return rows


def refuse_other_vocabularies(what: str, members: Sequence[ModelScores]) -> None:
    """One line where runs to be averaged have different vocabularies: each was scored on other
    pairs of a benchmark, so a mean of their rho mixes pair sets. Seeds of one configuration
    differ so only where their corpus files changed between runs (data.allow_modified_corpus)."""
    vocabularies: dict[str, list[str]] = {}
    for member in members:
        vocabularies.setdefault(member.vocabulary, []).append(member.label)
    if len(vocabularies) > 1:
        described = "; ".join(f"{vocabulary[:12]}: {', '.join(labels)}" for vocabulary, labels in vocabularies.items())
        raise AnalysisError(f"{what}: the runs have different vocabularies ({described}), so they were scored "
                            f"on different pairs of each benchmark and their rho is not averaged; give runs "
                            f"of one corpus, or leave out --by-head")


def write_wordsim(rows: Sequence[ModelScores], benchmarks: Sequence[Benchmark], out_prefix: Path) -> str:
    """<prefix>.md, <prefix>.csv and <prefix>_wins.png; return the Markdown."""
    names = [b.name for b in benchmarks]
    def cell(s: Score) -> str:
        if np.isnan(s.rho):
            return "—"
        return f"{s.rho:.4f}" if np.isnan(s.std) else f"{s.rho:.4f} ± {s.std:.4f}"

    body = [[row.label, str(row.runs), *(cell(s) for s in row.scores)] for row in rows]
    body += coverage_rows(rows)
    rhos = np.array([[s.rho for s in row.scores] for row in rows])
    wins = win_counts(rhos)
    vocabularies = np.array([row.vocabulary for row in rows])
    compared_pairs = vocabularies[:, None] == vocabularies[None, :]
    labels = [row.label for row in rows]
    wins_body = [[a, *(str(w) if same else "—" for w, same in zip(ws, sames))]
                 for a, ws, sames in zip(labels, wins, compared_pairs)]
    text = ("# Word similarity (Spearman's rho of input-embedding cosine similarities)\n\n"
            + markdown_table(["Model", "n", *names], body)
            + "\nn: the runs a row stands for; with several (--by-head), rho is their mean ± sample std. "
              "—: fewer than two of the benchmark's pairs in the vocabulary, so no rho.\n"
            + "\n## Wins (row beats column on this many benchmarks)\n\n"
            + markdown_table(["", *labels], wins_body)
            + "\nA win compares two rows' rho (means, for rows of several runs) on one benchmark; it is "
              "[SB] Figure 4's count, not a test: no interval is computed for a difference of rho.\n"
            + ("" if compared_pairs.all() else
               "—: the two rows have different vocabularies, so each was scored on other pairs of a "
               "benchmark (the pairs used / skipped rows above): their rho are not compared.\n"))
    out_prefix.parent.mkdir(parents=True, exist_ok=True)
    out_prefix.with_name(out_prefix.name + ".md").write_text(text, encoding="utf-8")
    header = ["model", "dataset", "runs"] + [f"{n}{suffix}" for n in names
                                             for suffix in ("", "_std", "_used", "_skipped")]
    write_csv(out_prefix.with_name(out_prefix.name + ".csv"), header,
              [[row.label, row.dataset, row.runs,
                *(v for s in row.scores for v in (s.rho, "" if np.isnan(s.std) else s.std, s.used, s.skipped))]
               for row in rows])
    plot_win_counts(labels, wins, compared_pairs, len(benchmarks), out_prefix.with_name(out_prefix.name + "_wins.png"))
    return text


def coverage_rows(rows: Sequence[ModelScores]) -> list[list[str]]:
    """The pairs used / skipped of each benchmark, one table row per vocabulary (the counts depend
    on it only): labelled by its dataset, and where a dataset has several, by the rows of each."""
    table = []
    for vocabulary in dict.fromkeys(row.vocabulary for row in rows):
        sharing = [row for row in rows if row.vocabulary == vocabulary]
        dataset = sharing[0].dataset
        alone = len({row.vocabulary for row in rows if row.dataset == dataset}) == 1
        whose = dataset if alone else f"{dataset}: {', '.join(row.label for row in sharing)}"
        table.append([f"pairs used / skipped ({whose})", "", *(f"{s.used} / {s.skipped}" for s in sharing[0].scores)])
    return table
