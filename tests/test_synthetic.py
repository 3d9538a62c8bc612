"""The synthetic experiment of [LMS] section 5.1 (bottleneck/, synthetic.py) on tiny grids."""
from __future__ import annotations

import csv
import dataclasses
import json
import math
import subprocess
import sys

import pytest
import torch

from bottleneck.monotone import MonotoneHead, MonotoneOptions, monotone_reference
from bottleneck.problem import (SYNTHETIC_HEADS, FitSettings, SyntheticModel, entropy, evaluate,
                                fit, head_options, kl_divergence, mode_match, sample_targets)
from bottleneck.report import Row, from_csv, to_csv, to_markdown, write_figures
from tests.conftest import REPO_ROOT


# --- metrics against hand computations ---------------------------------------------------------

def test_mode_match_by_hand():
    p = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6], [0.0, 1.0, 0.0], [0.5, 0.1, 0.4]])
    q = torch.tensor([[0.5, 0.4, 0.1], [0.4, 0.3, 0.3], [0.1, 0.8, 0.1], [0.2, 0.2, 0.6]])
    assert mode_match(p, q.log()).tolist() == [True, False, True, False]


def test_kl_and_entropy_by_hand():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.25, 0.25, 0.5]])
    q = torch.tensor([[0.25, 0.5, 0.25], [1 / 3, 1 / 3, 1 / 3]])
    # Row 0: 0.5 log(0.5/0.25) + 0.5 log(0.5/0.5) + 0 = 0.5 log 2 (the zero entry adds nothing).
    # Row 1: 0.5 log(0.75) + 0.5 log(1.5).
    expected = [0.5 * math.log(2), 0.5 * math.log(0.75) + 0.5 * math.log(1.5)]
    assert kl_divergence(p, q.log()).tolist() == pytest.approx(expected, rel=1e-6)
    assert entropy(p).tolist() == pytest.approx([math.log(2), 1.5 * math.log(2)], rel=1e-12)
    assert kl_divergence(q, q.log()).abs().max() < 1e-7


def test_evaluate_is_mean_over_contexts_in_any_chunking():
    torch.manual_seed(0)
    targets = sample_targets(37, 11, 0.5, seed=3)
    model = SyntheticModel(SYNTHETIC_HEADS["softmax"], head_options("softmax"), 37, 11, 4)
    with torch.no_grad():
        log_q = model.log_probs(slice(0, 37))
    by_hand = (100.0 * mode_match(targets, log_q).double().mean().item(),
               kl_divergence(targets, log_q).mean().item())
    for chunk in (1, 5, 37, 100):
        matched, kl = evaluate(model, targets, chunk)
        assert matched == pytest.approx(by_hand[0], abs=1e-9)
        assert kl == pytest.approx(by_hand[1], rel=1e-6)   # float32 logits, chunked matmuls


# --- the true distributions --------------------------------------------------------------------

def test_targets_are_distributions_reproducible_by_seed():
    a = sample_targets(50, 30, 0.1, seed=1)
    assert a.shape == (50, 30) and a.dtype == torch.float32
    assert (a >= 0).all()
    assert torch.allclose(a.sum(1), torch.ones(50), atol=1e-5)
    assert torch.equal(a, sample_targets(50, 30, 0.1, seed=1))
    assert not torch.equal(a, sample_targets(50, 30, 0.1, seed=2))


def test_targets_follow_the_dirichlet():
    # Each coordinate's mean is 1/M; smaller alpha gives sparser rows (lower entropy).
    sparse = sample_targets(4000, 20, 0.1, seed=0)
    flat = sample_targets(4000, 20, 10.0, seed=0)
    assert sparse.mean(0).sub(1 / 20).abs().max() < 0.02
    # Var of one coordinate: (1/M)(1 - 1/M) / (M alpha + 1).
    var = (1 / 20) * (1 - 1 / 20) / (20 * 0.1 + 1)
    assert sparse[:, 0].var().item() == pytest.approx(var, rel=0.15)
    assert entropy(sparse).mean() < entropy(flat).mean() - 1.0


# --- the monotone network of eq. 14 ------------------------------------------------------------

def test_monotone_function_matches_reference_values_and_gradients():
    torch.manual_seed(0)
    x = (torch.randn(3, 5, 7, dtype=torch.float64) * 4).requires_grad_()
    params = [torch.randn(6, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    b0 = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    from bottleneck.monotone import _Monotone
    for compiled in (False,):
        out = _Monotone.apply(x, *params, b0, compiled)
        ref = monotone_reference(x, *params, b0)
        assert torch.allclose(out, ref, rtol=1e-12, atol=1e-12)
        assert torch.autograd.gradcheck(lambda *a: _Monotone.apply(*a, compiled),
                                        (x, *params, b0))


def test_monotone_function_is_increasing():
    head = MonotoneHead(MonotoneOptions(units=5, compile=False), 4, 3, 3,
                        torch.nn.Parameter(torch.randn(4, 3)))
    with torch.no_grad():
        for p in (head.u_raw, head.v_raw, head.c):
            p.normal_()
        x = torch.linspace(-30, 30, 2001)
        f = monotone_reference(x, head.u_raw, head.v_raw, head.c, head.b0)
    assert (f.diff() >= 0).all() and f[-1] > f[0]


def test_monotone_head_on_the_head_interface():
    torch.manual_seed(1)
    weight = torch.nn.Parameter(torch.randn(9, 4))
    head = MonotoneHead(MonotoneHead.small_options(), 9, 4, 4, weight)
    g = torch.randn(2, 3, 4)
    out, ref = head(g), head.reference(g)
    assert out.log_probs.shape == (2, 3, 9)
    assert torch.allclose(out.log_probs.exp().sum(-1), torch.ones(2, 3), atol=1e-5)
    assert torch.allclose(out.log_probs, ref.log_probs, atol=1e-5)
    assert torch.allclose(out.transformed_logits, ref.transformed_logits, atol=1e-5)


# --- head options ------------------------------------------------------------------------------

def test_head_options_defaults_and_overrides():
    assert head_options("mos").components == 4 and head_options("mos").dropoutl == 0.0
    assert head_options("mos", {"components": "7"}).components == 7
    assert head_options("lms", {"units": "3"}, compile=False) == MonotoneOptions(3, False)
    assert head_options("gss").c == -1.5
    assert head_options("plif", {"compile": "false"}).compile is False


@pytest.mark.parametrize("head, overrides, message", [
    ("mos", {"bogus": "1"}, "mos.bogus: not an option of this head"),
    ("mos", {"components": "two"}, "mos.components: expected int, got 'two'"),
    ("mos", {"components": "0"}, "mos.components: expected an integer >= 1, got 0"),
    ("gss", {"k": "nan"}, "gss.k: expected a finite number"),
    ("softmax", {"x": "1"}, "softmax.x: not an option of this head (options: none)"),
    # PLIF's own lr is its SGD group's in language-model training; fit's one Adam ignored it
    ("plif", {"lr": "100"}, "plif.lr: unused here (the head's own lr in language-model training; the "
                            "fit's one Adam takes --lr): leave it out"),
])
def test_head_option_errors_name_the_key(head, overrides, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        head_options(head, overrides)


# --- fitting -------------------------------------------------------------------------------------

def _fit(head, targets, dim, seed=0, **settings):
    torch.manual_seed(seed)
    model = SyntheticModel(SYNTHETIC_HEADS[head], head_options(head, compile=False),
                           targets.shape[0], targets.shape[1], dim)
    return fit(model, targets, FitSettings(**settings))


def test_stopping_rule_and_step_limit():
    targets = sample_targets(20, 10, 0.1, seed=0)
    capped = _fit("softmax", targets, 2, lr=0.05, max_steps=7, tol=0.0)
    assert (capped.steps, capped.converged) == (7, False)
    stalled = _fit("softmax", targets, 2, lr=0.05, max_steps=500, tol=10.0, window=3, lr_drops=0)
    assert (stalled.steps, stalled.converged) == (4, True)     # the first step the rule can see
    # Each lr drop starts the window afresh: 4 steps, drop, 4 steps, drop, 4 steps.
    dropped = _fit("softmax", targets, 2, lr=0.05, max_steps=500, tol=10.0, window=3, lr_drops=2)
    assert (dropped.steps, dropped.converged) == (12, True)


def test_lr_drops_divide_the_learning_rate_by_ten_on_each_stall(monkeypatch):
    seen = []
    original = torch.optim.Adam.step

    def step(self, *args, **kwargs):
        seen.append(self.param_groups[0]["lr"])
        return original(self, *args, **kwargs)
    monkeypatch.setattr(torch.optim.Adam, "step", step)
    targets = sample_targets(20, 10, 0.1, seed=0)
    _fit("softmax", targets, 2, lr=0.05, max_steps=500, tol=10.0, window=3, lr_drops=2)
    assert seen == pytest.approx([0.05] * 4 + [0.005] * 4 + [0.0005] * 4)


def test_chunking_is_only_a_memory_matter():
    targets = sample_targets(30, 12, 0.1, seed=4)
    # A few steps only: Adam divides by the gradient's size, so float rounding differences of
    # the summation order grow over many steps.
    whole = _fit("plif", targets, 3, max_steps=5, tol=0.0, batch_contexts=1000)
    chunked = _fit("plif", targets, 3, max_steps=5, tol=0.0, batch_contexts=7)
    assert chunked.kl == pytest.approx(whole.kl, rel=1e-6)
    assert chunked.mode_match == whole.mode_match


@pytest.mark.parametrize("head", list(SYNTHETIC_HEADS))
def test_a_head_that_can_represent_p_exactly_fits_it(head):
    # D >= M: E can be invertible, so every head can put any logits on every context.
    targets = sample_targets(60, 12, 0.1, seed=5)
    # A small constant lr: Adam's steps set a floor on how close it gets, and a few contexts
    # have top-two probabilities within 1% of each other. 2,500 steps take every head to a KL
    # of at most 1.1e-3 (Mixtape's; the others' are below 7e-4), half the bound below.
    result = _fit(head, targets, 16, lr=0.003, max_steps=2500, tol=0.0)
    assert result.mode_match == 100.0
    assert result.kl < 2e-3


@pytest.mark.parametrize("seed", [0, 1])
def test_low_d_large_m_softmax_is_worse_than_lms_and_plif(seed):
    # The bottleneck: D = 4 for M = 200 words. A pointwise monotone f on the logits (LMS with
    # the network of eq. 14, LMS-PLIF) reaches a lower KL than the Linear-Softmax.
    targets = sample_targets(300, 200, 0.1, seed=seed)
    kl = {head: _fit(head, targets, 4, seed=seed, lr=0.05, max_steps=300).kl
          for head in ("softmax", "lms", "plif")}
    assert kl["softmax"] > kl["lms"] + 0.05, kl
    assert kl["softmax"] > kl["plif"] + 0.05, kl


# --- the decoder bias: none by default ([LMS] eqs. 1, 11, 12), trained with --decoder-bias --------

def _model(head, targets, dim, decoder_bias, seed=0):
    torch.manual_seed(seed)
    return SyntheticModel(SYNTHETIC_HEADS[head], head_options(head, compile=False), targets.shape[0],
                          targets.shape[1], dim, decoder_bias=decoder_bias)


@pytest.mark.parametrize("head", list(SYNTHETIC_HEADS))
def test_without_decoder_bias_no_head_has_one_to_train(head, monkeypatch):
    """The heads' TiedDecoder has a trainable b (l = W g + b), which the fit trained: every head of
    the synthetic experiment had a per-word bias that [LMS]'s models do not have."""
    optimized = []
    real_adam = torch.optim.Adam

    def recording_adam(params, **kwargs):
        params = list(params)
        optimized.append(params)
        return real_adam(params, **kwargs)
    monkeypatch.setattr(torch.optim, "Adam", recording_adam)
    targets = sample_targets(20, 10, 0.1, seed=0)
    for decoder_bias in (False, True):
        model = _model(head, targets, 3, decoder_bias)
        fit(model, targets, FitSettings(max_steps=5, tol=0.0))
        names = [name for name, _ in model.named_parameters()]
        bias = model.head.decoder.bias
        # the optimizer gets exactly the model's parameters, the bias among them only when asked
        assert [id(p) for p in optimized[-1]] == [id(p) for p in model.parameters()]
        assert ("head.decoder.bias" in names) == decoder_bias
        assert any(p is bias for p in optimized[-1]) == decoder_bias
        assert torch.equal(bias, torch.zeros(10)) != decoder_bias      # held at 0, or it trained


@pytest.mark.parametrize("head", list(SYNTHETIC_HEADS))
def test_the_decoder_bias_changes_no_other_parameter_s_start(head):
    """b starts at 0 and draws no random numbers: with and without it, every other parameter starts
    the same (same seed), so the two fits differ by b alone."""
    targets = sample_targets(20, 10, 0.1, seed=0)
    with_bias = _model(head, targets, 3, True).state_dict()
    without = _model(head, targets, 3, False).state_dict()
    assert with_bias.keys() == without.keys()
    assert all(torch.equal(with_bias[k], without[k]) for k in with_bias)   # b: zeros in both


def test_linear_softmax_log_p_rank_is_d_plus_one_without_bias_d_plus_two_with_it():
    """[LMS] eq. 10: Linear-Softmax's log-P matrix log Q = H W^T - log Z 1^T has rank at most
    D + 1 (the normaliser adds one), and its rows centred (the logits up to each context's
    constant), at most D. A trained b adds one to both. Float64, so that the ranks are clear."""
    targets = sample_targets(30, 12, 0.5, seed=0).double()
    dim = 3
    ranks = {}
    for decoder_bias in (False, True):
        model = _model("softmax", targets, dim, decoder_bias).double()
        fit(model, targets, FitSettings(max_steps=60, tol=0.0))
        with torch.no_grad():
            log_q = model.log_probs(slice(0, 30))
        assert log_q.dtype == torch.float64
        centred = log_q - log_q.mean(1, keepdim=True)
        ranks[decoder_bias] = (int(torch.linalg.matrix_rank(log_q)),
                               int(torch.linalg.matrix_rank(centred)))
    assert ranks == {False: (dim + 1, dim), True: (dim + 2, dim + 1)}


# --- outputs ---------------------------------------------------------------------------------------

def _rows():
    rows = []
    for dim, (sm, lms) in {4: ((10.0, 1.5), (30.0, 1.2)), 8: ((20.0, 1.0), (15.0, 0.9))}.items():
        rows.append(Row(0.1, 50, dim, 40, "softmax", "Softmax", 0, sm[0], sm[1], 20, True, 0.1, False))
        rows.append(Row(0.1, 50, dim, 40, "lms", "LMS", 0, lms[0], lms[1], 30, dim == 4, 0.2, False))
    return rows


def test_markdown_table_marks_best_and_unconverged():
    text = to_markdown(_rows())
    assert "### alpha = 0.1, M = 50, N = 40, seeds 0" in text
    assert "| D | Softmax mode % | Softmax KL | LMS mode % | LMS KL |" in text
    assert "| 4 | 10.0 | 1.500 | **30.0** | **1.200** |" in text
    assert "| 8 | **20.0** | 1.000 | 15.0 | **0.900*** |" in text
    assert "`*`: at least one fit" in text


def test_the_heads_differences_are_paired_by_seed_with_their_t_intervals():
    """One seed gave the guide's differences between heads (0.0006 nats) without an interval;
    with seeds, each head against the Linear-Softmax and each metric's leader against the next
    head come paired by seed, with a 95% t interval (t(0.975, 2) = 4.3027)."""
    def row(dim, head, seed, mode, kl):
        label = {"softmax": "Softmax", "lms": "LMS", "mos": "MoS"}[head]
        return Row(0.1, 50, dim, 40, head, label, seed, mode, kl, 20, True, 0.1, False)
    rows = []
    for seed, (sm, lms, mos) in enumerate([(10.0, 20.0, 15.0), (11.0, 23.0, 16.0), (12.0, 26.0, 17.0)]):
        rows += [row(4, "softmax", seed, sm, 1.5), row(4, "lms", seed, lms, 1.2 - 0.01 * seed),
                 row(4, "mos", seed, mos, 1.3)]
    rows += [row(8, "softmax", 0, 20.0, 1.0), row(8, "lms", 0, 25.0, 0.9), row(8, "mos", 0, 22.0, 0.95)]
    text = to_markdown(rows)
    # lms - softmax by seed: 10, 12, 14 (mean 12, sd 2): 12 +- 4.3027 * 2 / sqrt(3) = [7.0, 17.0]
    half = 4.302652729911275 * 2 / math.sqrt(3)
    assert (f"| 4 | 3 | +12.0 [{12 - half:+.1f}, {12 + half:+.1f}] | "
            f"-0.3100 [{-0.31 - half / 200:+.4f}, {-0.31 + half / 200:+.4f}] | "
            f"+5.0 (no spread: no interval) | -0.2000 (no spread: no interval) |") in text
    assert "| D | seeds | Softmax mode % |" in text and "| 4 | 0, 1, 2 | " in text and "| 8 | 0 | " in text
    assert "; D = 8: one seed, no interval:" in text and "\n| 8 | 1 | " not in text
    # the leaders: LMS ahead of MoS by 5, 7, 9 points; LMS's KL below MoS's by 0.10, 0.11, 0.12
    lead = [line for line in text.splitlines() if line.startswith("| 4 | 3 | LMS | MoS | ")]
    assert len(lead) == 1 and lead[0].split(" | ")[4] == f"+7.0 [{7 - half:+.1f}, {7 + half:+.1f}]"
    assert lead[0].split(" | ")[5:7] == ["LMS", "MoS"] and lead[0].split(" | ")[7].startswith("-0.1100 [")
    # a bound that would print as +0.0 or -0.0 gets the digits that show its side of zero
    from bottleneck.report import _paired
    base = [row(4, "softmax", seed, 10.0, 1.5) for seed in range(3)]
    near_zero = [row(4, "lms", seed, 10.0 + 2.4640 + step, 1.5) for seed, step in enumerate((-1.0, 0.0, 1.0))]
    assert _paired(near_zero, base, "mode_match", 1) == (3, "+2.5 [-0.02, +4.9]")
    # a head without seed 2 is paired over the two seeds it shares
    partial = to_markdown([r for r in rows if not (r.head == "mos" and r.seed == 2)])
    assert "| 4 | 2, 3 | " in partial
    assert "One seed per cell: no difference between two heads here has an interval" in to_markdown(_rows())
    assert "One seed per cell" not in text


def test_csv_keeps_every_row(tmp_path):
    rows = list(csv.DictReader(to_csv(_rows()).splitlines()))
    assert len(rows) == 4
    assert rows[1]["head"] == "lms" and float(rows[1]["kl"]) == 1.2 and rows[1]["converged"] == "True"


def test_csv_reads_back_into_the_same_rows():
    assert from_csv(to_csv(_rows())) == _rows()


@pytest.mark.parametrize("text, message", [
    ("alpha,words\n0.1,5\n", "r.csv: missing column(s) dim, contexts"),
    (to_csv(_rows()).replace("True", "yes", 1), "r.csv, line 2: converged: expected bool, got 'yes'"),
    (to_csv(_rows()).replace(",50,", ",fifty,", 1), "r.csv, line 2: words: expected int, got 'fifty'"),
])
def test_bad_csv_is_one_line_naming_file_line_and_column(text, message):
    with pytest.raises(ValueError) as error:
        from_csv(text, "r.csv")
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_old_csv_without_the_decoder_bias_column_reads_as_fitted_with_it():
    """results.csv files from before --decoder-bias: every one of those fits trained b."""
    old = "\n".join(line.rsplit(",", 1)[0] for line in to_csv(_rows()).splitlines()) + "\n"
    assert "decoder_bias" not in old
    assert from_csv(old) == [dataclasses.replace(r, decoder_bias=True) for r in _rows()]


def test_markdown_and_figures_name_a_trained_decoder_bias(tmp_path, monkeypatch):
    import bottleneck.report as report
    biased = [dataclasses.replace(r, decoder_bias=True) for r in _rows()]
    assert "### alpha = 0.1, M = 50, N = 40, seeds 0, with a trained decoder bias b (--decoder-bias)" \
        in to_markdown(biased)
    assert "decoder bias" not in to_markdown(_rows())
    figures = []
    monkeypatch.setattr(report, "save", lambda fig, path: figures.append(fig))
    write_figures(biased, tmp_path)
    assert all(fig.axes[0].get_title() == "M = 50, alpha = 0.1, with bias b" for fig in figures)


def test_figures_one_per_metric_and_alpha(tmp_path):
    paths = write_figures(_rows(), tmp_path)
    assert sorted(p.name for p in paths) == ["kl_alpha0.1.png", "mode_match_alpha0.1.png"]
    assert all(p.stat().st_size > 5000 for p in paths)


def test_figure_panels_share_the_d_axis_when_one_m_was_only_partly_run(tmp_path, monkeypatch):
    import bottleneck.report as report
    figures = []
    monkeypatch.setattr(report, "save", lambda fig, path: figures.append(fig))
    partial = [Row(0.1, 500, 4, 40, "softmax", "Softmax", 0, 5.0, 1.7, 20, True, 0.1, False)]
    write_figures(_rows() + partial, tmp_path)     # M = 50 has D 4 and 8, M = 500 only D 4
    assert len(figures) == 2
    for fig in figures:
        full, part = fig.axes[:2]
        assert part.get_title().startswith("M = 500")
        assert part.get_xlim() == full.get_xlim() and full.get_xlim()[1] > 8


# --- the command line --------------------------------------------------------------------------------

def _synthetic(*args, **kwargs):
    return subprocess.run([sys.executable, "synthetic.py", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=600, **kwargs)


def _synthetic_here(capsys, *args):
    """synthetic.py's main in this process (its refusals need no fresh interpreter, which costs a
    few seconds of torch's import each): its exit status and stderr."""
    import synthetic
    capsys.readouterr()
    try:
        code = synthetic.main(list(args))
    except SystemExit as stop:          # argparse's refusals
        code = stop.code
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, captured.out, captured.err)


def test_cli_tiny_grid_writes_everything(tmp_path):
    out = tmp_path / "grid"
    args = ["--words", "30", "60", "--dims", "2", "8", "--contexts", "40", "--heads", "softmax",
            "lms", "--seeds", "0", "1", "--max-steps", "20", "--no-compile", "--set",
            "lms.units=3", "--out", str(out), "--json"]
    done = _synthetic(*args)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(rows) == 2 * 2 * 2 * 2
    assert {(r["words"], r["dim"], r["head"], r["seed"]) for r in rows} == {
        (m, d, h, s) for m in (30, 60) for d in (2, 8) for h in ("softmax", "lms") for s in (0, 1)}
    assert all(0 <= r["mode_match"] <= 100 and r["kl"] >= 0 and r["steps"] <= 20 for r in rows)
    for name in ("results.md", "results.csv", "settings.json", "mode_match_alpha0.1.png",
                 "kl_alpha0.1.png"):
        assert (out / name).is_file(), name
    settings = json.loads((out / "settings.json").read_text())
    assert settings["head_options"]["lms"]["units"] == 3 and settings["fit"]["max_steps"] == 20
    assert "### alpha = 0.1, M = 60, N = 40, seeds 0, 1" in (out / "results.md").read_text()
    # Same seeds, same numbers.
    again = _synthetic(*args[:-3], "--out", str(tmp_path / "again"), "--json")
    untimed = lambda rs: [{k: v for k, v in r.items() if k != "seconds"} for r in rs]  # noqa: E731
    assert untimed(json.loads(again.stdout.strip().splitlines()[-1])) == untimed(rows)


def test_cli_from_csv_joins_runs_without_fitting(tmp_path, capsys):
    first, second = _rows()[:2], _rows()[2:]
    (tmp_path / "a.csv").write_text(to_csv(first))
    (tmp_path / "b.csv").write_text(to_csv(second))
    done = _synthetic_here(capsys, "--from-csv", str(tmp_path / "a.csv"), str(tmp_path / "b.csv"),
                      "--out", str(tmp_path / "joined"), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [r.__dict__ for r in _rows()]
    assert (tmp_path / "joined" / "results.md").read_text() == to_markdown(_rows())
    assert (tmp_path / "joined" / "kl_alpha0.1.png").is_file()
    assert not (tmp_path / "joined" / "settings.json").exists()     # nothing was fitted
    missing = _synthetic_here(capsys, "--from-csv", str(tmp_path / "nope.csv"), "--out", str(tmp_path / "x"))
    assert missing.returncode == 2 and "nope.csv: cannot be read" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_cli_from_csv_refuses_fits_it_cannot_pool_and_options_it_would_ignore(tmp_path, capsys):
    """A cell is the mean over seeds at one N: a CSV given twice counted every fit twice, and
    fits of two N were averaged into one cell; --dims and the like did nothing."""
    (tmp_path / "a.csv").write_text(to_csv(_rows()))
    (tmp_path / "n80.csv").write_text(to_csv([dataclasses.replace(r, contexts=80, seed=1) for r in _rows()]))
    out = str(tmp_path / "joined")
    twice = _synthetic_here(capsys, "--from-csv", str(tmp_path / "a.csv"), str(tmp_path / "a.csv"), "--out", out)
    assert twice.returncode == 2 and twice.stderr == (
        f"synthetic.py: {tmp_path / 'a.csv'}: the fit alpha 0.1, M 50, D 4, softmax, seed 0 is also in "
        f"{tmp_path / 'a.csv'}: each fit once (a file given twice, or grids that overlap)\n")
    two_n = _synthetic_here(capsys, "--from-csv", str(tmp_path / "a.csv"), str(tmp_path / "n80.csv"), "--out", out)
    assert two_n.returncode == 2 and two_n.stderr == (
        f"synthetic.py: {tmp_path / 'n80.csv'}: alpha 0.1, M 50 was fitted at N = 80 here and N = 40 in "
        f"{tmp_path / 'a.csv'}: a table pools the fits of one N (join the CSVs of each N apart)\n")
    for option in (["--dims", "8"], ["--heads", "softmax"], ["--no-compile"], ["--set", "mos.components=2"],
                   ["--decoder-bias"]):
        ignored = _synthetic_here(capsys, "--from-csv", str(tmp_path / "a.csv"), *option, "--out", out)
        assert ignored.returncode == 2 and ignored.stderr == (
            f"synthetic.py: error: {option[0]} is an option of fitting; --from-csv fits nothing (it tables "
            f"the fits in the CSVs as they are): leave it out\n")
    assert not (tmp_path / "joined").exists()


def test_cli_records_the_decoder_bias_in_settings_and_results(tmp_path, capsys):
    """settings.json and results.csv said nothing of b: a fit with it and one without could not be
    told apart, nor kept apart by --from-csv."""
    for extra, decoder_bias in (([], False), (["--decoder-bias"], True)):
        out = tmp_path / f"bias_{decoder_bias}"
        done = _synthetic_here(capsys, *TINY_GRID, *extra, "--out", str(out))
        assert done.returncode == 0, done.stderr
        assert json.loads((out / "settings.json").read_text())["decoder_bias"] is decoder_bias
        records = list(csv.DictReader((out / "results.csv").read_text().splitlines()))
        assert records and all(r["decoder_bias"] == str(decoder_bias) for r in records)
        assert [r.decoder_bias for r in from_csv((out / "results.csv").read_text())] == [decoder_bias]


def test_cli_from_csv_refuses_fits_with_and_without_the_decoder_bias(tmp_path, capsys):
    """Heads with b (logits of rank up to D + 1) and without (D) set side by side in one table as
    one model; an old results.csv (no decoder_bias column) counts as with b."""
    without = tmp_path / "without.csv"
    without.write_text(to_csv(_rows()[:2]))
    with_bias = tmp_path / "with.csv"
    with_bias.write_text(to_csv([dataclasses.replace(r, decoder_bias=True) for r in _rows()[2:]]))
    old, old_first = tmp_path / "old.csv", tmp_path / "old_first.csv"
    for path, rows in ((old, _rows()[2:]), (old_first, _rows()[:2])):
        path.write_text("\n".join(line.rsplit(",", 1)[0] for line in to_csv(rows).splitlines()) + "\n")
    out = tmp_path / "joined"
    for second in (with_bias, old):
        mixed = _synthetic_here(capsys, "--from-csv", str(without), str(second), "--out", str(out))
        assert mixed.returncode == 2 and mixed.stderr == (
            f"synthetic.py: {second}: alpha 0.1, M 50, D 8, softmax, seed 0 was fitted with "
            f"--decoder-bias and the fits of {without} without --decoder-bias: a table pools fits of "
            f"one kind (join the CSVs of each apart)\n")
    assert not out.exists()
    alike = _synthetic_here(capsys, "--from-csv", str(old_first), str(with_bias), "--out", str(out))
    assert alike.returncode == 0, alike.stderr


@pytest.mark.parametrize("args, message", [
    (["--alpha", "-1"], "argument --alpha: expected a finite value > 0, got '-1'"),
    (["--words", "1"], "argument --words: expected an integer >= 2, got '1'"),
    (["--set", "mos.components"], "expected HEAD.OPTION=VALUE"),
    (["--set", "moss.components=3"], "unknown head 'moss'"),
    (["--set", "mos.bogus=3"], "synthetic.py: mos.bogus: not an option of this head"),
    (["--heads", "softmax", "--set", "mos.components=3"], "--set names mos, which --heads"),
    (["--device", "cuda:7"], "synthetic.py: --device: 'cuda:7' requested but"),
])
def test_cli_bad_input_is_one_line(tmp_path, capsys, args, message):
    done = _synthetic_here(capsys, *args, "--out", str(tmp_path / "x"))
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "x" / "results.csv").exists()


TINY_GRID = ["--words", "20", "--dims", "2", "--contexts", "20", "--max-steps", "2", "--heads", "softmax",
             "--no-compile"]


def test_cli_one_fitting_process_per_out(tmp_path, capsys):
    """Two processes on one --out (a grid split over processes, each left at the default --out)
    each replaced the other's results.csv with its own when it ended."""
    from experiment.run_directory import RunLock
    out = tmp_path / "grid"
    out.mkdir()
    with RunLock(out):                 # another fit into the same folder
        done = _synthetic_here(capsys, *TINY_GRID, "--out", str(out))
    assert done.returncode == 2
    assert done.stderr.startswith(f"synthetic.py: {out} is in use by PID ")
    assert "give this run another --out" in done.stderr and len(done.stderr.splitlines()) == 1
    assert not (out / "results.csv").exists() and not (out / "settings.json").exists()
    assert _synthetic_here(capsys, *TINY_GRID, "--out", str(out)).returncode == 0    # once it is free


def test_cli_from_csv_keeps_the_results_it_would_replace(tmp_path, capsys):
    """--from-csv into a fitting run's folder (the default --out, say) replaced that run's
    results.csv, leaving its settings.json to describe another table; into the folder of one of
    its inputs, it replaced that input."""
    fitted = tmp_path / "fitted"
    fitted.mkdir()
    (fitted / "results.csv").write_text(to_csv(_rows()[:2]))
    (fitted / "settings.json").write_text("{}\n")
    other = tmp_path / "other.csv"
    other.write_text(to_csv(_rows()[2:]))
    into_fit = _synthetic_here(capsys, "--from-csv", str(other), "--out", str(fitted))
    assert into_fit.returncode == 2 and into_fit.stderr == (
        f"synthetic.py: --out {fitted}: holds the results of a fitting run (settings.json), whose "
        f"results.csv the join would replace: give the join a folder of its own\n")
    joined = tmp_path / "joined"
    joined.mkdir()
    (joined / "results.csv").write_text(to_csv(_rows()[:2]))
    into_input = _synthetic_here(capsys, "--from-csv", str(joined / "results.csv"), str(other),
                                 "--out", str(joined))
    assert into_input.returncode == 2 and into_input.stderr == (
        f"synthetic.py: --out {joined}: its results.csv is one of the --from-csv files, which the join "
        f"would replace: give the join a folder of its own\n")
    assert (fitted / "results.csv").read_text() == (joined / "results.csv").read_text() == to_csv(_rows()[:2])


def test_cli_a_diverging_fit_keeps_the_fits_before_it(tmp_path, capsys, monkeypatch):
    """A fit whose loss became non-finite ended the grid with nothing written: every fit before it
    (hours of them at M = 10,000) was lost."""
    import synthetic
    real_fit, calls = synthetic.fit, []

    def second_diverges(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise FloatingPointError("the loss became non-finite at step 2 (lr 0.05)")
        return real_fit(*args, **kwargs)
    monkeypatch.setattr(synthetic, "fit", second_diverges)
    out = tmp_path / "grid"
    done = _synthetic_here(capsys, *TINY_GRID[:2], "--dims", "2", "3", *TINY_GRID[4:], "--out", str(out))
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        f"synthetic.py: alpha 0.1 M 20 seed 0 D 3 softmax: the loss became non-finite at step 2 "
        f"(lr 0.05); try a smaller --lr, with another --out (the 1 fit(s) before it are in "
        f"{out / 'results.csv'})")
    assert [(r.dim, r.head) for r in from_csv((out / "results.csv").read_text())] == [(2, "softmax")]
    assert (out / "results.md").is_file()


def test_cli_a_size_beyond_memory_is_one_line_and_keeps_the_fits_before_it(tmp_path, capsys):
    """--set plif.knots=100000000000 (a typo's zeros) was the CPU allocator's RuntimeError
    traceback from building the model, after the fits before it had run and with none of them
    written. 2**60 knots (4 * 2**60 bytes) are beyond any address space."""
    out = tmp_path / "grid"
    done = _synthetic_here(capsys, *TINY_GRID[:-2], "softmax", "plif", "--set", f"plif.knots={2**60}",
                           "--no-compile", "--out", str(out))
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        f"synthetic.py: alpha 0.1 M 20 seed 0 D 2 plif: the model does not fit in this machine's "
        f"memory (building it asked for a tensor of {4 * 2**60:,} bytes); is a --set size too large? "
        f"(the 1 fit(s) before it are in {out / 'results.csv'})")
    assert [r.head for r in from_csv((out / "results.csv").read_text())] == ["softmax"]


def test_cli_a_grid_stopped_part_way_keeps_its_fits_and_the_same_command_fits_the_rest(
        tmp_path, capsys, monkeypatch):
    """A grid stopped by Ctrl-C or SIGTERM wrote nothing (7 fits of 56 minutes lost at M = 1,000;
    a grid at M = 10,000 outlasts a session): results.csv now grows as each fit ends, and the same
    command again fits only the others, ending with the rows of a grid never stopped."""
    import synthetic
    real_fit, calls = synthetic.fit, []

    def third_interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_fit(*args, **kwargs)
    grid = [*TINY_GRID[:2], "--dims", "2", "3", *TINY_GRID[4:], "--seeds", "0", "1"]
    whole = _synthetic_here(capsys, *grid, "--out", str(tmp_path / "whole"), "--json")
    assert whole.returncode == 0, whole.stderr
    out = tmp_path / "grid"
    monkeypatch.setattr(synthetic, "fit", third_interrupted)
    with pytest.raises(KeyboardInterrupt):       # run_script's to turn into one line and 130
        synthetic.main([*grid, "--out", str(out)])
    assert [(r.seed, r.dim) for r in from_csv((out / "results.csv").read_text())] == [(0, 2), (0, 3)]
    calls.clear()
    monkeypatch.setattr(synthetic, "fit", lambda *a, **k: calls.append(1) or real_fit(*a, **k))
    again = _synthetic_here(capsys, *grid, "--out", str(out), "--json")
    assert again.returncode == 0, again.stderr
    assert len(calls) == 2                       # seed 1's two fits only
    assert (f"synthetic.py: 2 fit(s) of this grid are in {out / 'results.csv'} already (an earlier run "
            f"of this command): fitting the others") in again.stderr
    untimed = lambda text: [{k: v for k, v in r.items() if k != "seconds"}    # noqa: E731
                            for r in json.loads(text.strip().splitlines()[-1])]
    assert untimed(again.stdout) == untimed(whole.stdout)
    assert (out / "results.md").read_text() == (tmp_path / "whole" / "results.md").read_text()
    calls.clear()                                # finished: the same command fits nothing
    assert _synthetic_here(capsys, *grid, "--out", str(out)).returncode == 0 and calls == []


def test_cli_an_out_of_fits_made_with_other_settings_is_refused(tmp_path, capsys):
    """The same --out with another setting would have mixed two grids' fits into one table (or,
    before fits were kept, replaced the earlier ones): one line naming the setting, nothing written."""
    out = tmp_path / "grid"
    assert _synthetic_here(capsys, *TINY_GRID, "--out", str(out)).returncode == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    other = _synthetic_here(capsys, *TINY_GRID, "--lr", "0.01", "--out", str(out))
    assert other.returncode == 2 and other.stderr == (
        f'synthetic.py: --out {out}: holds fits made with other settings (fit: {json.dumps(json.loads((out / "settings.json").read_text())["fit"])} '
        f'there, {json.dumps(dict(json.loads((out / "settings.json").read_text())["fit"], lr=0.01))} here): give '
        f"this run another --out, or finish that one with its own command (settings.json)\n")
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    joined = tmp_path / "joined"
    joined.mkdir()
    (joined / "results.csv").write_text(to_csv(_rows()))
    into_join = _synthetic_here(capsys, *TINY_GRID, "--out", str(joined))
    assert into_join.returncode == 2 and "holds a results.csv but no settings.json" in into_join.stderr
    assert (joined / "results.csv").read_text() == to_csv(_rows())


def test_cli_out_that_cannot_be_a_folder_is_one_line(tmp_path, capsys):
    (tmp_path / "a_file").write_text("")
    for args in (TINY_GRID, ["--from-csv", str(tmp_path / "a.csv")]):
        (tmp_path / "a.csv").write_text(to_csv(_rows()))
        done = _synthetic_here(capsys, *args, "--out", str(tmp_path / "a_file"))
        assert done.returncode == 2
        assert done.stderr == f"synthetic.py: --out {tmp_path / 'a_file'}: is a file, expected a folder\n"


@pytest.mark.parametrize("args, message", [
    (["--dims", "8", "16", "8"], "--dims: 8 is given twice: each value once"),
    (["--alpha", "0.1", "0.10"], "--alpha: 0.1 is given twice: each value once"),
    (["--heads", "softmax", "lms", "softmax"], "--heads: softmax is given twice: each value once"),
    (["--words", "50", "50"], "--words: 50 is given twice: each value once"),
    (["--seeds", "0", "0"], "--seeds: 0 is given twice: each value once"),
])
def test_cli_refuses_a_grid_value_given_twice(capsys, args, message):
    """A repeated value fitted its cells again, the table averaged the copies as if they were seeds,
    and --from-csv then refused the results.csv it had written."""
    import synthetic
    with pytest.raises(SystemExit) as stop:
        synthetic.parse_args(args)
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"synthetic.py: error: {message}"


def test_every_documented_command_passes_the_checks_before_fitting(tmp_path, monkeypatch):
    """docs/synthetic.md's commands: one gave --set mos.components with --heads softmax lms, which
    synthetic.py refuses. Each is run up to its first fit (the --from-csv one parses)."""
    import shlex
    import synthetic

    class Fitting(Exception):
        pass

    def first_fit(*args, **kwargs):
        raise Fitting
    monkeypatch.setattr(synthetic, "sample_targets", first_fit)
    page = (REPO_ROOT / "docs" / "synthetic.md").read_text(encoding="utf-8")
    commands = [shlex.split(line, comments=True)[2:] for line in page.splitlines()
                if line.startswith("python synthetic.py")]
    assert len(commands) >= 5
    for number, argv in enumerate(commands):
        argv = [a for a in argv if a not in ("--json",)]
        out = str(tmp_path / f"out{number}")        # each its own: an --out holds one grid's fits
        if "--out" in argv:
            argv[argv.index("--out") + 1] = out
        if "--from-csv" in argv:
            assert synthetic.parse_args(argv).from_csv
            continue
        with pytest.raises(Fitting):
            synthetic.main([*argv, "--out", out])


@pytest.mark.parametrize("folder, heading", [
    ("m1000_no_bias", "## alpha = 0.1, M = 1,000, N = 10,000, seeds 0, 1, 2, the default (no decoder bias)"),
    ("m1000_bias", "## alpha = 0.1, M = 1,000, N = 10,000, seeds 0, with a trained decoder bias b (--decoder-bias)")])
def test_the_guides_m1000_tables_are_the_committed_runs(folder, heading):
    """docs/synthetic.md's tables at M = 1,000 (the default, and with the decoder bias) are the
    committed results.md's (joined/, where several processes' results.csv were joined: it holds
    exactly their rows), over every D of the default grid: each figure from a committed raw file."""
    folder = REPO_ROOT / "results" / "cpu_synthetic" / folder
    raws = [raw for raw in sorted(folder.glob("**/results.csv")) if raw.parent.name != "joined"]
    raw_rows = {row for raw in raws for row in raw.read_text().splitlines()[1:]}
    table_of = folder / "joined" if (folder / "joined").is_dir() else folder
    assert set((table_of / "results.csv").read_text().splitlines()[1:]) == raw_rows
    table = [line for line in (table_of / "results.md").read_text().splitlines() if line.startswith("| ")]
    section = (REPO_ROOT / "docs" / "synthetic.md").read_text().split(heading + "\n")[1].split("\n## ")[0]
    assert [line for line in section.splitlines() if line.startswith("| ")] == table
    assert {row.split(",")[2] for row in raw_rows} == {"8", "16", "32", "64", "128"}
    assert {row.split(",")[-1] for row in raw_rows} == {"True" if "with a trained" in heading else "False"}
    # every cell has the seeds the heading names (the table's means and paired intervals over them)
    seeds = {int(seed) for seed in heading.split("seeds ")[1].split(", the")[0].split(", with")[0].split(", ")}
    cells: dict = {}
    for row in raw_rows:
        fields = row.split(",")
        cells.setdefault((fields[2], fields[4]), set()).add(int(fields[6]))
    assert all(found == seeds for found in cells.values()), cells
