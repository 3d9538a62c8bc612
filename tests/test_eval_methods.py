"""The neural cache and dynamic evaluation (evaluation/cache.py, evaluation/dynamic.py) and
evaluate.py's --cache / --dynamic: the definitions against direct computations, the limits that
must give plain evaluation (exactly, or to float32 rounding), the effect on a repeated text, every head, the command line."""
from __future__ import annotations

import json
import math
from typing import NamedTuple

import numpy as np
import pytest
import torch

import evaluate
from data import load_corpus
from data.batching import batchify
from evaluation import cache, dynamic as dynamic_eval
from experiment.config import ConfigError, load_config
from evaluation.loop import evaluate_nll, iterate_chunks
from experiment.loading import load_trained
from model import build_model
from model.heads import HEADS
from tests.conftest import TINY, head_overrides
from tests.test_evaluation import HostReads

CPU = torch.device("cpu")


def plain_log_probs(model, source, bptt: int) -> torch.Tensor:
    """log p(target) of every position, as plain evaluation computes them (float64, in order)."""
    return torch.cat([out.target_log_probs.double().flatten()
                      for out, _ in iterate_chunks(model, source, bptt, targets_only=True)])


def with_cache(model, source, window: int, thetas, lambdas, bptt: int, start: str = "reference") -> torch.Tensor:
    """log p(target) of every position with the cache, (len(thetas), len(lambdas), positions)."""
    return torch.cat(list(cache.chunk_log_probs(model, source, window, thetas, lambdas, bptt, start)), dim=2)


def dynamic_log_probs(evaluator, source) -> torch.Tensor:
    """log p(target) of every position under dynamic evaluation (float64, in order)."""
    return torch.cat([log_p.double().flatten() for log_p in evaluator.segment_log_probs(source)])


@pytest.fixture(scope="module")
def trained(tiny_run):
    return load_trained(tiny_run, CPU)


def repeated_text(corpus, length: int = 120) -> torch.Tensor:
    """A text that is a segment of the test split followed by the same segment again."""
    segment = corpus.test[:length]
    return batchify(torch.cat([segment, segment]), 1)


# ---------------------------------------------------------------------- the cache's definition

def test_log_space_mixture_equals_a_direct_float64_computation():
    """p = (1 - lambda) p_model + lambda sum_{i: y_i = y} exp(theta h.h_i) / sum_i exp(theta h.h_i)."""
    h_t = np.array([0.3, -0.8, 0.5])
    history = np.array([[0.1, 0.2, -0.3], [0.9, -0.7, 0.4], [-0.5, 0.5, 0.5], [0.3, -0.8, 0.6]])
    next_words = np.array([7, 2, 7, 4])
    theta, lam, p_model = 1.7, 0.25, 0.013
    for target in (7, 4, 9):                     # twice in the cache, once, never
        weights = np.exp(theta * history @ h_t)
        p_cache = weights[next_words == target].sum() / weights.sum()
        expected = math.log((1 - lam) * p_model + lam * p_cache)
        scores = torch.tensor(theta * history @ h_t)[None]                    # float64
        allowed = torch.ones(1, 4, dtype=torch.bool)
        matches = torch.tensor(next_words == target)[None]
        log_p_cache = cache.cache_log_probs(scores, allowed, matches)
        got = cache.mix(torch.tensor([math.log(p_model)], dtype=torch.float64), log_p_cache, lam)
        assert got.item() == pytest.approx(expected, rel=1e-13, abs=1e-13)


def test_the_mixture_does_not_underflow_where_probabilities_would():
    scores = torch.tensor([[-2000.0, -2001.0, -2010.0]], dtype=torch.float64)   # exp() is 0 here
    allowed = torch.ones(1, 3, dtype=torch.bool)
    matches = torch.tensor([[False, True, False]])
    log_p_cache = cache.cache_log_probs(scores, allowed, matches)
    expected = -1.0 - math.log(1 + math.exp(-1) + math.exp(-10))     # by hand, shifted
    assert log_p_cache.item() == pytest.approx(expected, rel=1e-12)
    log_p = cache.mix(torch.tensor([-900.0], dtype=torch.float64), log_p_cache, 0.1)
    assert math.isfinite(log_p.item()) and log_p.item() == pytest.approx(math.log(0.1) + expected)


class FakeOutput(NamedTuple):
    target_log_probs: torch.Tensor
    last_raw_output: torch.Tensor
    hidden: list


class FakeModel:
    """h_t = a fixed vector per input word, p_model = 1/V: the cache's arithmetic alone."""

    def __init__(self, vocab: int = 6, size: int = 3):
        self.vectors = torch.randn(vocab, size, generator=torch.Generator().manual_seed(0),
                                   dtype=torch.float64)
        self.vocab = vocab

    def eval(self):
        return self

    def init_hidden(self, batch_size):
        return [(torch.zeros(1), torch.zeros(1))]

    def __call__(self, inputs, hidden, targets):
        log_p = torch.full(targets.shape, -math.log(self.vocab), dtype=torch.float64)
        return FakeOutput(log_p, self.vectors[inputs], hidden)


@pytest.mark.parametrize("row_block", [cache.ROW_BLOCK, 2])
def test_window_and_chunks_follow_the_definition_position_by_position(row_block, monkeypatch):
    """start="available": across chunk boundaries (bptt 3) and row blocks with a window of 4:
    the previous `window` positions only, fewer at the start, none at the first position,
    computed directly in float64; no more than `window` past states are kept between chunks."""
    monkeypatch.setattr(cache, "ROW_BLOCK", row_block)
    kept, extend = [], cache._History.extend

    def recording_extend(history, *args):
        keys = extend(history, *args)
        kept.append(history.hidden.size(0))
        return keys

    monkeypatch.setattr(cache._History, "extend", recording_extend)
    model = FakeModel()
    ids = torch.randint(model.vocab, (30,), generator=torch.Generator().manual_seed(1))
    theta, lam, window = 0.8, 0.3, 4
    got = with_cache(model, batchify(ids, 1), window, [theta], [lam], bptt=3, start="available")[0, 0]
    assert max(kept) == window
    h = model.vectors[ids[:-1]].numpy()
    y = ids[1:].numpy()
    expected = []
    for t in range(len(y)):
        past = range(max(0, t - window), t)
        p = 1 / model.vocab
        if t > 0:
            weights = np.array([math.exp(theta * h[t] @ h[i]) for i in past])
            p_cache = sum(w for w, i in zip(weights, past) if y[i] == y[t]) / weights.sum()
            p = (1 - lam) * p + lam * p_cache
        expected.append(math.log(p))
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12)
    # The chunk length changes nothing, and the grid evaluates every pair in one pass.
    torch.testing.assert_close(
        with_cache(model, batchify(ids, 1), window, [theta], [lam], bptt=50, start="available")[0, 0], got)
    grid = with_cache(model, batchify(ids, 1), window, [0.1, theta], [lam, 0.5], bptt=3, start="available")
    torch.testing.assert_close(grid[1, 0], got)


def pointer_reference(hidden: np.ndarray, log_p_model: np.ndarray, targets: np.ndarray,
                      window: int, theta: float, lam: float, bptt: int) -> np.ndarray:
    """log p(target) per position by AWD-LSTM pointer.py's loop, written out again in float64:
    per chunk, the memory is the kept history then the chunk; position idx of the chunk mixes in
    the cache when start_idx + idx > window, start_idx being the memory's length before the
    chunk, over the `window` entries before it; then the memory keeps its last `window`."""
    memory_h, memory_y, out = np.zeros((0, hidden.shape[1])), np.zeros(0, dtype=int), []
    for first in range(0, len(targets), bptt):
        chunk = slice(first, first + bptt)
        start_idx = len(memory_y)
        memory_h = np.concatenate([memory_h, hidden[chunk]])
        memory_y = np.concatenate([memory_y, targets[chunk]])
        for idx, (h, y, log_p) in enumerate(zip(hidden[chunk], targets[chunk], log_p_model[chunk])):
            p = math.exp(log_p)
            if start_idx + idx > window:
                keys = memory_h[start_idx + idx - window:start_idx + idx]
                words = memory_y[start_idx + idx - window:start_idx + idx]
                scores = theta * keys @ h
                attention = np.exp(scores - scores.max())
                attention /= attention.sum()
                p = lam * attention[words == y].sum() + (1 - lam) * p
            out.append(math.log(p))
        memory_h, memory_y = memory_h[-window:], memory_y[-window:]
    return np.array(out)


@pytest.mark.parametrize("row_block", [cache.ROW_BLOCK, 2])
def test_by_default_the_cache_starts_where_pointer_py_starts_it(row_block, monkeypatch):
    """The reference rule: no cache on the first window + 1 positions nor at the first position
    of a later chunk, a full window elsewhere (chunks of 7 with a window of 4)."""
    monkeypatch.setattr(cache, "ROW_BLOCK", row_block)
    model = FakeModel()
    ids = torch.randint(model.vocab, (40,), generator=torch.Generator().manual_seed(2))
    theta, lam, window, bptt = 0.8, 0.3, 4, 7
    got = with_cache(model, batchify(ids, 1), window, [theta], [lam], bptt=bptt)[0, 0]
    log_p_model = np.full(len(ids) - 1, -math.log(model.vocab))
    expected = pointer_reference(model.vectors[ids[:-1]].numpy(), log_p_model, ids[1:].numpy(),
                                 window, theta, lam, bptt)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12)
    available = with_cache(model, batchify(ids, 1), window, [theta], [lam], bptt=bptt, start="available")[0, 0]
    differs = (got != available).nonzero().flatten().tolist()
    assert differs == [1, 2, 3, 4, 7, 14, 21, 28, 35]      # 0 has no history under either rule


def test_positions_mixed_counts_where_the_cache_is_used():
    """positions_mixed, counted without a model, is the number of positions chunk_log_probs mixes
    the cache into (those that differ from p_model alone), under both rules; pointer.py's loop
    counted by hand says the same for longer splits."""
    model = FakeModel()
    ids = torch.randint(model.vocab, (40,), generator=torch.Generator().manual_seed(3))
    plain = torch.full((len(ids) - 1,), -math.log(model.vocab), dtype=torch.float64)
    for window, bptt in ((4, 7), (4, 3), (10, 7), (38, 5), (39, 50)):
        for start in cache.START_RULES:
            got = with_cache(model, batchify(ids, 1), window, [0.8], [0.3], bptt=bptt, start=start)[0, 0]
            used = int((~torch.isclose(got, plain, rtol=0, atol=1e-12)).sum())
            assert cache.positions_mixed(len(ids) - 1, window, bptt, start) == used, (window, bptt, start)
    for length, window, bptt in ((82_429, 500, 5000), (245_568, 3785, 2000), (3785, 3785, 2000), (3787, 3785, 2000)):
        by_hand, memory = 0, 0
        for first in range(0, length, bptt):
            by_hand += sum(memory + idx > window for idx in range(min(bptt, length - first)))
            memory = min(window, memory + min(bptt, length - first))
        assert cache.positions_mixed(length, window, bptt) == by_hand
    assert cache.positions_mixed(3786, 3785, 2000) == 0          # window + 1 positions: never


@pytest.mark.parametrize("dataset, published", [
    ("ptb", (500, 1.0, 0.1, 5000)), ("wikitext-2", (3785, 0.662, 0.1279, 2000))])
def test_cache_with_the_published_settings_is_pointer_py_on_a_small_model(trained, dataset, published):
    """AWD-LSTM's pointer.py commands (PTB: window 500, chunks of 5000; WT2: window 3785, chunks
    of 2000) on a text of two and three chunks: the trained tiny model's states and
    probabilities through pointer.py's rule."""
    settings = cache.PUBLISHED[dataset]
    assert (settings.window, settings.theta, settings.lam, settings.bptt) == published
    ids = torch.randint(trained.corpus.vocab_size, (5601,), generator=torch.Generator().manual_seed(3))
    source = batchify(ids, 1)
    outputs = list(iterate_chunks(trained.model, source, settings.bptt, targets_only=True))
    hidden = torch.cat([out.last_raw_output[:, 0] for out, _ in outputs]).double().numpy()
    log_p_model = torch.cat([out.target_log_probs[:, 0] for out, _ in outputs]).double().numpy()
    expected = pointer_reference(hidden, log_p_model, ids[1:].numpy(), settings.window, settings.theta,
                                 settings.lam, settings.bptt)
    # float32 scores against float64 ones: a window of 3,785 rounds a little more than one of
    # 500 (1.4e-9 relative here); --cache-start available moves the mean by 8e-4 (PTB) and 2e-2
    # (WT2) relative, about 2e-6 for each position whose rule differs.
    assert cache.cache_nll(trained.model, source, settings) == pytest.approx(-expected.mean(), rel=1e-8)


# ---------------------------------------------------------------------- limits and effects

def test_cache_with_lambda_zero_is_plain_evaluation_exactly(trained):
    source = batchify(trained.corpus.test, 1)
    plain = plain_log_probs(trained.model, source, bptt=40)
    assert torch.equal(with_cache(trained.model, source, 50, [1.0], [0.0], bptt=40)[0, 0], plain)
    settings = cache.CacheSettings(window=50, theta=1.0, lam=0.0, bptt=40)
    assert cache.cache_nll(trained.model, source, settings) == evaluate_nll(trained.model, source, 40)


def test_the_cache_lowers_the_perplexity_of_a_repeated_text(trained):
    source = repeated_text(trained.corpus)
    half = (source.size(0) - 1) // 2
    plain = plain_log_probs(trained.model, source, bptt=70)
    cached = with_cache(trained.model, source, half, [1.0], [0.1], bptt=70)[0, 0]   # from the repeat on
    repeat = slice(half + 1, None)
    assert -cached[repeat].mean() < -plain[repeat].mean() - 0.05


def gradient_statistics(run, settings):
    return dynamic_eval.gradient_statistics(run.model, run.corpus.train, settings)


def test_gradient_statistics_are_root_sum_squares_over_training_batches(trained):
    """S = sqrt(sum_b g_b^2) of each batch's mean-NLL gradient, eval mode, hidden state carried;
    and the settings in the paper's units: eta = lr / sqrt(N_b), eps = eps / sqrt(N_b), lambda / K."""
    settings = dynamic_eval.DynamicSettings(lr=0.002, lam=0.075, epsilon=0.001, bptt=5,
                                            ms_batch_size=4, ms_batches=3)
    statistics = gradient_statistics(trained, settings)
    model = trained.model.eval()
    params = [p for p in model.parameters() if p.requires_grad]
    data = batchify(trained.corpus.train, 4)
    hidden, squares = model.init_hidden(4), [torch.zeros_like(p) for p in params]
    for b in range(3):
        out = model(data[5 * b:5 * b + 5], hidden, data[5 * b + 1:5 * b + 6])
        hidden = [(h.detach(), c.detach()) for h, c in out.hidden]
        for total, g in zip(squares, torch.autograd.grad(-out.target_log_probs.mean(), params)):
            total += g * g
    assert statistics.batches == 3
    for got, total in zip(statistics.root_sum_squares, squares):
        torch.testing.assert_close(got, total.sqrt())
    units = dynamic_eval.paper_units(settings, statistics)
    assert units["eta"] == pytest.approx(0.002 / math.sqrt(3))
    assert units["epsilon"] == pytest.approx(0.001 / math.sqrt(3))
    assert units["lambda"] == pytest.approx(0.075 / len(params)) and units["parameter_tensors"] == len(params)


def test_dynamic_evaluation_with_lr_zero_is_plain_evaluation(trained):
    """Up to float32 rounding, not bit for bit: dynamic evaluation scores with gradients on, and
    the CPU's LSTM kernel (oneDNN) then rounds its output differently in the last bit (the
    weights do not move: a stepped weight would change the log-probs by far more)."""
    settings = dynamic_eval.DynamicSettings(lr=0.0, lam=0.075, epsilon=0.001, bptt=5, ms_batches=3)
    evaluator = dynamic_eval.DynamicEvaluator(trained.model, gradient_statistics(trained, settings), settings)
    source = batchify(trained.corpus.test, 1)
    weights = [p.detach().clone() for p in trained.model.parameters()]
    torch.testing.assert_close(dynamic_log_probs(evaluator, source), plain_log_probs(trained.model, source, bptt=5),
                               rtol=0, atol=1e-5)
    assert evaluator.nll(source) == pytest.approx(evaluate_nll(trained.model, source, 5), rel=1e-7)
    assert all(torch.equal(a, b) for a, b in zip(weights, trained.model.parameters()))


def test_cache_and_dynamic_evaluation_read_the_device_once_per_split(trained, monkeypatch):
    source = batchify(trained.corpus.test[:300], 1)
    settings = dynamic_eval.DynamicSettings(lr=0.002, lam=0.075, epsilon=0.001, bptt=5, ms_batches=3)
    evaluator = dynamic_eval.DynamicEvaluator(trained.model, gradient_statistics(trained, settings), settings)
    reads = HostReads(monkeypatch)
    cache.cache_nll(trained.model, source, cache.CacheSettings(window=50, theta=1.0, lam=0.1, bptt=40))
    assert len(reads.calls) == 1, reads.calls
    evaluator.nll(source)                                  # 60 segments of 5
    assert len(reads.calls) == 2, reads.calls


def test_dynamic_evaluation_gains_more_on_the_second_pass_of_a_repeated_text(trained):
    settings = dynamic_eval.DynamicSettings(lr=0.02, lam=0.0, epsilon=0.001, bptt=5, ms_batches=10)
    evaluator = dynamic_eval.DynamicEvaluator(trained.model, gradient_statistics(trained, settings), settings)
    source = repeated_text(trained.corpus)
    half = (source.size(0) - 1) // 2
    dynamic = dynamic_log_probs(evaluator, source)
    evaluator.reset()
    plain = plain_log_probs(trained.model, source, bptt=5)
    gain_first = (dynamic[:half] - plain[:half]).mean()
    gain_second = (dynamic[half + 1:] - plain[half + 1:]).mean()
    assert gain_second > gain_first and gain_second > 0.05


def test_the_update_rule_step_by_step(trained):
    """Two segments, S = sqrt(sum_b g_b^2): theta_1 = theta_0 - lr g_1 / (S + eps); theta_2 =
    theta_1 - lr g_2 / (S + eps) + min(lambda S / sum_k mean(S_k), 1) (theta_0 - theta_1), with
    g_2 at theta_1 (the published units; see evaluation/dynamic.py)."""
    settings = dynamic_eval.DynamicSettings(lr=0.01, lam=0.3, epsilon=0.001, bptt=5, ms_batches=2)
    model = trained.model
    statistics = gradient_statistics(trained, settings)
    rms = statistics.root_sum_squares
    evaluator = dynamic_eval.DynamicEvaluator(model, statistics, settings)
    params = evaluator.params
    source = batchify(trained.corpus.test[:11], 1)          # exactly two segments of 5
    theta0 = [p.detach().clone() for p in params]
    dynamic_log_probs(evaluator, source)
    after = [p.detach().clone() for p in params]
    evaluator.reset()
    scale = sum(r.mean() for r in rms)                       # over the K parameter tensors
    # By hand, with plain autograd.
    hidden = model.init_hidden(1)
    expected = [p.clone() for p in theta0]
    for segment in range(2):
        with torch.no_grad():
            for p, value in zip(params, expected):
                p.copy_(value)
        inputs, targets = source[segment * 5:segment * 5 + 5], source[segment * 5 + 1:segment * 5 + 6]
        out = model(inputs, hidden, targets)
        hidden = [(h.detach(), c.detach()) for h, c in out.hidden]
        grads = torch.autograd.grad(-out.target_log_probs.mean(), params)
        expected = [value - settings.lr * g / (r + settings.epsilon)
                    + torch.clamp(settings.lam * r / scale, max=1) * (t0 - value)
                    for value, g, r, t0 in zip(expected, grads, rms, theta0)]
    evaluator.reset()
    for got, want in zip(after, expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    assert any(not torch.equal(a, t0) for a, t0 in zip(after, theta0))


# ---------------------------------------------------------------------- every head

@pytest.mark.parametrize("name", list(HEADS))
def test_every_head_works_with_both_methods(name, small_data):
    config = load_config(f"configs/ptb/{name}.yaml", [f"data.data_dir={small_data}", *TINY,
                                                      *head_overrides(name)])
    corpus = load_corpus("ptb", small_data, allow_modified=True)
    torch.manual_seed(0)
    model = build_model(config, corpus.vocab_size)
    # A tiny trained model: a few SGD steps on the training slice, so that the weights (and
    # PLIF's slopes, MoS's prior) have moved away from their initial values.
    train = batchify(corpus.train[:400], 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    losses = []
    for start in range(0, min(len(train) - 21, 160), 20):
        ids, targets = train[start:start + 20], train[start + 1:start + 21]
        loss = -model(ids, model.init_hidden(4), targets).target_log_probs.mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    model.eval()
    source = batchify(corpus.test[:60], 1)
    out = model(source[:5], model.init_hidden(1))      # in eval mode the head sees the cache's h
    assert torch.equal(out.dropped_output, out.last_raw_output)
    plain = plain_log_probs(model, source, bptt=20)
    assert torch.equal(with_cache(model, source, 30, [1.0], [0.0], 20)[0, 0], plain)
    cached = with_cache(model, source, 30, [1.0], [0.2], 20)[0, 0]
    assert torch.isfinite(cached).all() and not torch.equal(cached, plain)
    settings = dynamic_eval.DynamicSettings(lr=0.002, lam=0.075, epsilon=0.001, bptt=20, ms_batches=2)
    statistics = dynamic_eval.gradient_statistics(model, corpus.train, settings)
    evaluator = dynamic_eval.DynamicEvaluator(model, statistics, settings)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    # The first segment as dynamic evaluation scores it, with a graph: PyTorch's CPU LSTM runs
    # another kernel when autograd records (values a float32 rounding apart from `plain`).
    first, _ = next(iterate_chunks(model, source, 20, targets_only=True, grad=True))
    first = first.target_log_probs.detach().double().flatten()
    dynamic = dynamic_log_probs(evaluator, source)
    assert torch.isfinite(dynamic).all()
    assert torch.equal(dynamic[:20], first)               # the first segment is scored before any step
    assert not torch.equal(dynamic, plain)
    evaluator.reset()
    for key, value in model.state_dict().items():         # the trained weights back, buffers untouched
        assert torch.equal(value, before[key]), key


# ---------------------------------------------------------------------- the command line

def test_evaluate_cache_and_dynamic_from_the_command_line(tiny_run, capsys):
    checkpoint = tiny_run / "best.pt"
    saved = checkpoint.read_bytes()
    assert evaluate.main([str(tiny_run), "--json", "--test-batch-size", "1", "--valid-batch-size", "1"]) == 0
    plain = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert plain["corpus"]["published"] is False and plain["corpus"]["folder"].endswith("ptb")   # a slice
    # The tiny splits are shorter than PTB's window of 500 (pointer.py's rule would never mix the
    # cache in: refused, test_a_cache_that_would_never_be_used_is_refused), so a window of 50.
    assert evaluate.main([str(tiny_run), "--cache", "--cache-window", "50", "--cache-lambda", "0",
                          "--cache-bptt", "70", "--json"]) == 0
    zero = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert zero["method"] == "cache" and zero["settings"] == {"window": 50, "theta": 1.0, "lam": 0.0, "bptt": 70,
                                                                 "start": "reference"}
    assert min(zero["cache_positions"].values()) > 0
    for split in ("val", "test"):
        assert zero[f"{split}_ppl"] == pytest.approx(plain[f"{split}_ppl"], rel=1e-12)
    assert evaluate.main([str(tiny_run), "--cache", "--cache-window", "50", "--json"]) == 0
    published = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert published["settings"] == {"window": 50, "theta": 1.0, "lam": 0.1, "bptt": 5000, "start": "reference"}
    assert published["test_ppl"] != pytest.approx(plain["test_ppl"], rel=1e-6)      # the cache is used
    assert evaluate.main([str(tiny_run), "--cache", "--cache-start", "available", "--json"]) == 0
    available = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert available["settings"]["start"] == "available" and available["test_ppl"] != published["test_ppl"]
    assert evaluate.main([str(tiny_run), "--cache", "--cache-window", "50", "--json"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith(", raw; evaluated with the neural cache")
    published = json.loads(out.strip().splitlines()[-1])
    assert json.loads((tiny_run / "eval_best_cache.json").read_text()) == published
    assert published["corpus"] == plain["corpus"]
    assert evaluate.main([str(tiny_run), "--dynamic", "--dynamic-ms-batches", "3", "--json"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith(", raw; evaluated with dynamic evaluation")    # not "raw with dynamic"
    dynamic = json.loads(out.strip().splitlines()[-1])
    assert dynamic["method"] == "dynamic" and dynamic["settings"]["lam"] == 0.075
    assert json.loads((tiny_run / "eval_best_dynamic.json").read_text()) == dynamic
    assert checkpoint.read_bytes() == saved                  # the checkpoint is never written
    assert evaluate.main([str(tiny_run), "--cache-search", "--cache-window", "50", "--json"]) == 0
    out = capsys.readouterr().out
    searched = json.loads(out.strip().splitlines()[-1])
    grid = np.array(searched["search"]["val_ppl"])
    assert grid.shape == (len(cache.SEARCH_THETAS), len(cache.SEARCH_LAMBDAS))
    assert searched["val_ppl"] == pytest.approx(grid.min(), rel=1e-4)
    chosen = (cache.SEARCH_THETAS.index(searched["settings"]["theta"]),
              cache.SEARCH_LAMBDAS.index(searched["settings"]["lam"]))
    assert grid[chosen] == pytest.approx(grid.min(), rel=1e-6)      # the pair with the lowest ppl
    assert "cache search on the validation split" in out
    assert searched["cache_positions"]["test"] == cache.positions_mixed(
        run_split_length(tiny_run, "test"), *(searched["settings"][k] for k in ("window", "bptt", "start")))
    on_edge = [value in (grid[0], grid[-1]) for value, grid in
               ((searched["settings"]["theta"], cache.SEARCH_THETAS), (searched["settings"]["lam"], cache.SEARCH_LAMBDAS))]
    assert ("note: the best pair is on the grid's edge" in out) == any(on_edge)


def run_split_length(run_dir, split: str) -> int:
    """The target positions of a run's split read at batch size 1."""
    from experiment.loading import load_trained
    return len(getattr(load_trained(run_dir, torch.device("cpu")).corpus, split)) - 1


def test_a_cache_that_would_never_be_used_is_refused(tiny_run, capsys):
    """A window as long as the split: under the reference rule no position mixes in the cache, so
    the "cache" numbers would be the plain ones under the cache's name."""
    assert evaluate.main([str(tiny_run), "--cache", "--cache-window", "100000000"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --cache-window 100000000: the valid split's ") and "\n" not in err
    assert "the cache is never used" in err and "--cache-start available" in err


def test_settings_under_which_a_method_would_not_be_itself_are_refused_with_the_reason(tiny_run, capsys):
    """Chunks of one position never mix the cache in (not the window's fault); a dynamic segment
    as long as a split is scored before any step; more gradient-statistics batches than the
    training split has were recorded as asked but read as there were. Nothing is written."""
    valid, test = run_split_length(tiny_run, "valid"), run_split_length(tiny_run, "test")
    results = {path: path.read_bytes() for path in tiny_run.glob("eval_*.json")}   # other tests' too
    assert evaluate.main([str(tiny_run), "--cache", "--cache-window", "5", "--cache-bptt", "1"]) == 2
    assert capsys.readouterr().err == (
        "error: --cache-bptt 1: with --cache-start reference the first position of every chunk uses "
        "p_model alone, and chunks of 1 position have nothing else, so the cache is never used and its "
        "numbers would be the plain ones; give a longer --cache-bptt or --cache-start available\n")
    longest = max(valid, test)
    assert evaluate.main([str(tiny_run), "--dynamic", "--dynamic-bptt", str(longest)]) == 2
    err = capsys.readouterr().err
    split = "valid" if valid == longest else "test"
    assert err == (f"error: --dynamic-bptt {longest}: the {split} split's {longest} positions make one "
                   "segment, scored before any step, so its numbers would be the plain ones; give a shorter "
                   "--dynamic-bptt (it also sets the training batches' length for the gradient statistics)\n")
    from experiment.loading import load_trained
    from evaluation import dynamic
    train_ids = load_trained(tiny_run, torch.device("cpu")).corpus.train
    available = dynamic.training_batches(train_ids, dynamic.DynamicSettings(lr=0.002, lam=0.075, epsilon=0.001,
                                                                             ms_batch_size=4))
    assert evaluate.main([str(tiny_run), "--dynamic", "--dynamic-ms-batch-size", "4",
                          "--dynamic-ms-batches", str(available + 1)]) == 2
    assert capsys.readouterr().err == (
        f"error: --dynamic-ms-batches {available + 1}: the training split has {available} batches of 4 "
        f"columns x 5 positions; give at most {available}, or leave it out for all of them\n")
    assert {path: path.read_bytes() for path in tiny_run.glob("eval_*.json")} == results


def test_a_result_that_is_not_a_number_is_refused_and_nothing_written(tiny_run, capsys):
    """A theta whose scores overflow float32 made every cached position NaN, and a huge lr made
    dynamic evaluation's weights diverge: both were printed as ppl inf, exit 0, and written with
    NaN / Infinity (not JSON)."""
    results = {path: path.read_bytes() for path in tiny_run.glob("eval_*.json")}   # other tests' too
    safe = cache.largest_safe_theta(load_trained(tiny_run, CPU).config.model.nhidlast)
    assert evaluate.main([str(tiny_run), "--cache", "--cache-window", "50", "--cache-theta", "1e45"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == (
        "error: --cache-theta 1e+45 (with --cache-window 50, --cache-lambda 0.1, --cache-bptt 5000, "
        "--cache-start reference): valid loss nan and test loss nan: the cache's scores theta <h_t, h_i> "
        "overflow float32 (the model's precision, in which AWD-LSTM's pointer.py computes them too); "
        f"give a --cache-theta of at most {safe:.3g}; nothing written\n")
    assert evaluate.main([str(tiny_run), "--dynamic", "--dynamic-lr", "1e30", "--dynamic-ms-batches", "3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --dynamic-lr 1e+30 --dynamic-epsilon 0.001 (with --dynamic-lambda 0.075, "
                          "--dynamic-bptt 5, --dynamic-ms-batch-size 100, --dynamic-ms-batches 3): valid loss ")
    assert err.endswith(": the steps lr * g / (S + epsilon) made the weights diverge; give a smaller "
                        "--dynamic-lr or a larger --dynamic-epsilon; nothing written\n") and err.count("\n") == 1
    assert {path: path.read_bytes() for path in tiny_run.glob("eval_*.json")} == results


def test_the_largest_safe_theta_gives_a_finite_cache(trained):
    """The bound the refusal gives is safe: the LSTM's outputs lie in (-1, 1)."""
    theta = cache.largest_safe_theta(trained.config.model.nhidlast)
    source = batchify(trained.corpus.test, 1)
    assert math.isfinite(cache.cache_nll(trained.model, source, cache.CacheSettings(window=50, theta=theta, lam=0.1)))
    assert math.isnan(cache.cache_nll(trained.model, source, cache.CacheSettings(window=50, theta=1e45, lam=0.1)))


@pytest.mark.parametrize("losses, message", [
    ((math.nan, 4.0), "plain evaluation (valid batch size 2, test batch size 1): valid loss nan: the model's "
                      "log-probabilities of the text are not usable numbers; nothing written"),
    ((4.0, 800.0), "plain evaluation (valid batch size 2, test batch size 1): test loss 800 (past 709.78 nats "
                   "the perplexity overflows float64): the model's log-probabilities of the text are not "
                   "usable numbers; nothing written")])
def test_a_plain_result_that_is_not_a_number_is_refused(losses, message):
    results = {"val_batch_size": 2, "test_batch_size": 1}
    for key, loss in zip(("val", "test"), losses):
        results.update({f"{key}_loss": loss, f"{key}_ppl": evaluate.perplexity(loss)})
    with pytest.raises(ConfigError) as refused:
        evaluate.refuse_non_finite(results, hidden_size=16)
    assert str(refused.value) == message


@pytest.mark.parametrize("argv, message", [
    (["--cache", "--cache-window", "0"], "--cache-window: expected an integer >= 1, got 0"),
    (["--cache", "--cache-lambda", "1"], "--cache-lambda: expected a number in [0, 1), got 1.0"),
    (["--dynamic", "--dynamic-lr", "-0.1"], "--dynamic-lr: expected a finite number >= 0, got -0.1"),
    (["--dynamic", "--dynamic-epsilon", "0"], "--dynamic-epsilon: expected a number > 0, got 0.0"),
])
def test_bad_settings_are_one_line(tiny_run, argv, message, capsys):
    assert evaluate.main([str(tiny_run), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {message}"


@pytest.mark.parametrize("argv, message", [
    (["--cache-window", "10"], "--cache-window belongs to --cache"),
    (["--cache", "--dynamic"], "two methods"),
    (["--dynamic", "--test-batch-size", "4"], "batch size 1"),
    (["--cache-search", "--cache-theta", "0.5"], "--cache-theta: --cache-search chooses theta and lambda"),
    (["--cache-search", "--cache-lambda", "0.2"], "--cache-lambda: --cache-search chooses theta and lambda"),
])
def test_options_that_do_not_fit_are_refused(tiny_run, argv, message, capsys):
    with pytest.raises(SystemExit):
        evaluate.main([str(tiny_run), *argv])
    assert message in capsys.readouterr().err
