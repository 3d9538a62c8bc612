"""Top-k next-word predictions of trained models for chosen contexts ([SB] Figure 3, SM Table 2).

A context is either a position p in the test stream (the prediction for token p + 1 given the
whole test prefix up to and including token p) or a text. Both are fed with batch size 1 through
`iterate_chunks`, the loop evaluate.py uses, so a position's distribution is exactly the row
the test perplexity is computed from. A text is tokenised like the corpus (split on whitespace,
no <eos> added) and fed from a zero hidden state, like the start of the test set.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import torch

from data.batching import batchify
from evaluation.loop import iterate_chunks
from . import AnalysisError
from .runs import markdown_table, require_best_pt

SHOWN_CONTEXT = 20    # tokens of a test prefix shown before the predicted word


@dataclass(frozen=True)
class Context:
    title: str
    text: str                 # what is shown (the end of a long test prefix)
    ids: torch.Tensor         # the 1-D token stream fed to the model
    position: int             # the prediction is for the token after ids[position]
    true_next: str | None     # known for test positions


def next_token_log_probs(model, ids: torch.Tensor, positions: Sequence[int],
                         bptt: int) -> dict[int, torch.Tensor]:
    """Log-probabilities (V,) of the token after each position of `ids`, batch size 1."""
    wanted = sorted(set(positions))
    device = next(model.parameters()).device
    found: dict[int, torch.Tensor] = {}
    offset = 0
    for out, targets in iterate_chunks(model, batchify(ids, 1, device), bptt):
        length = targets.size(0)
        for p in wanted:
            if offset <= p < offset + length:
                found[p] = out.log_probs[p - offset, 0].float().cpu()
        offset += length
        if offset > wanted[-1]:
            break            # the rest of the stream cannot change earlier rows
    return found


def encode(text: str, word_to_id: Mapping[str, int], dataset: str) -> torch.Tensor:
    words = text.split()
    if not words:
        raise AnalysisError("--contexts: an empty context")
    unknown = [w for w in words if w not in word_to_id]
    if unknown:
        raise AnalysisError(f"context {text!r}: {unknown[0]!r} is not in the {dataset} vocabulary")
    return torch.tensor([word_to_id[w] for w in words], dtype=torch.long)


def make_contexts(corpus, positions: Sequence[int], texts: Sequence[str]) -> list[Context]:
    test = corpus.test
    contexts = []
    for p in positions:
        if not 0 <= p <= test.numel() - 2:
            raise AnalysisError(f"position {p}: the {corpus.name} test set has {test.numel()} tokens, "
                                f"so positions run from 0 to {test.numel() - 2}")
        shown = " ".join(corpus.vocab[i] for i in test[max(0, p + 1 - SHOWN_CONTEXT): p + 1].tolist())
        contexts.append(Context(f"test position {p}", ("… " if p + 1 > SHOWN_CONTEXT else "") + shown,
                                test, p, corpus.vocab[int(test[p + 1])]))
    word_to_id = corpus.word_to_id()
    for text in texts:
        ids = encode(text, word_to_id, corpus.name)
        # iterate_chunks gives a row only to tokens followed by another, so one placeholder (any
        # id) is appended; it is never an input, so it changes nothing before it.
        contexts.append(Context(f"text {text!r}", text, torch.cat([ids, ids[-1:]]), ids.numel() - 1, None))
    return contexts


def top_k(log_probs: torch.Tensor, vocab: Sequence[str], k: int) -> list[tuple[str, float]]:
    values, ids = torch.topk(log_probs.double().exp(), k)
    return [(vocab[i], float(v)) for v, i in zip(values.tolist(), ids.tolist())]


def predict(model, bptt: int, vocab: Sequence[str], contexts: Sequence[Context],
            k: int) -> list[list[tuple[str, float]]]:
    """Per context, the k most probable next words with their probabilities, most probable first."""
    streams: dict[int, list[Context]] = {}      # contexts on one stream (the test set) share a pass
    for c in contexts:
        streams.setdefault(id(c.ids), []).append(c)
    log_probs: dict[int, torch.Tensor] = {}
    for group in streams.values():
        rows = next_token_log_probs(model, group[0].ids, [c.position for c in group], bptt)
        for c in group:
            log_probs[id(c)] = rows[c.position]
    return [top_k(log_probs[id(c)], vocab, k) for c in contexts]


def markdown_word(word: str, bold: bool = False) -> str:
    code = "`" + word.replace("|", "\\|") + "`"     # <unk> and <eos> would be read as HTML
    return f"**{code}**" if bold else code


def top_k_markdown(labels: Sequence[str], contexts: Sequence[Context],
                   predictions: Sequence[list[list[tuple[str, float]]]], k: int) -> str:
    """One section per context: a table with a column per model; the true next word in bold."""
    parts = [f"# Top-{k} next-word predictions\n"]
    for i, c in enumerate(contexts):
        head = f"## {c.title}\n\n`{c.text}`"      # as code: <unk> and <eos> would be read as HTML
        if c.true_next is not None:
            head += f" → true next word: {markdown_word(c.true_next, bold=True)}"
        rows = [[str(rank + 1), *(f"{markdown_word(word, word == c.true_next)} {prob:.3f}"
                                   for word, prob in (model[i][rank] for model in predictions))]
                for rank in range(k)]
        parts.append(head + "\n\n" + markdown_table(["rank", *labels], rows))
    return "\n".join(parts)


def top_k_report(run_dirs: Sequence[Path], positions: Sequence[int], texts: Sequence[str], k: int,
                 device, data_dir: str | None = None) -> str:
    from experiment.loading import load_trained

    if not positions and not texts:
        raise AnalysisError("give test --positions and/or --contexts")
    predictions, contexts, dataset = [], None, None
    for run_dir in run_dirs:
        require_best_pt(run_dir, "report.py top5")
        run = load_trained(run_dir, device, data_dir)
        if dataset is not None and run.corpus.name != dataset:
            raise AnalysisError(f"{run_dir}: trained on {run.corpus.name}, the runs before it on "
                                f"{dataset}; compare runs of one dataset")
        dataset = run.corpus.name
        if k > run.corpus.vocab_size:
            raise AnalysisError(f"-k {k}: the {dataset} vocabulary has only {run.corpus.vocab_size} words")
        contexts = contexts or make_contexts(run.corpus, positions, texts)
        predictions.append(predict(run.model, run.config.train.bptt, run.corpus.vocab, contexts, k))
        del run      # one model in memory at a time
    return top_k_markdown([d.name for d in run_dirs], contexts, predictions, k)
