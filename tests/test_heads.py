"""Output heads (docs/reference.md section 4): the registry, each head's maths against a direct
reference, gradients, normalisation, extreme inputs, eval determinism, options and
parameter counts (docs/reference.md section 6). PLIF's own function is tested in test_plif.py.

The generic tests run for every head in the registry, with the options its class gives for
tiny models (`small_options`): a new head is tested by them with no edit here."""
from __future__ import annotations

import dataclasses
import math
import typing
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from experiment.config import readable_type
from model import LanguageModel, count_parameters
from model.body import AWDLSTMBody
from model.heads import HEADS
from model.heads.mixture import MixtureOptions, MoSOptions, mos_reference
from model.heads.plif import FrozenPLIFOptions, PLIFOptions
from model.heads.sigsoftmax import GSSOptions, gss_reference
from model.kernels.compiled import FusedKernel
from model.kernels.gss import gss_transform
from model.kernels.mixture import mixture_log_softmax

V, E, NHIDLAST_MIX, T, B = 13, 6, 5, 4, 3
# The heads of [SB]; the generic tests below take whatever the registry holds.
SB_HEADS = ("softmax", "ss", "gss", "plif", "plif_frozen", "mos", "moc")


def nhidlast_of(name: str) -> int:
    return E if HEADS[name].requires_nhidlast_equal_emsize else NHIDLAST_MIX


def make_head(name: str, options=None, dtype=torch.float32, seed: int = 0):
    torch.manual_seed(seed)
    embedding = nn.Parameter(torch.empty(V, E).uniform_(-0.5, 0.5))
    head = HEADS[name](options or HEADS[name].small_options(), V, E, nhidlast_of(name), embedding)
    with torch.no_grad():   # a non-zero bias so that tests see it
        head.decoder.bias.uniform_(-0.3, 0.3)
    return head.to(dtype)


def make_g(name: str, dtype=torch.float32, scale: float = 1.0, seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(T, B, nhidlast_of(name), generator=generator, dtype=dtype) * scale


# --- the registry and the interface ---------------------------------------------------------

def test_registry_holds_the_heads_of_sb_in_table_order():
    assert list(HEADS)[:len(SB_HEADS)] == list(SB_HEADS)


@pytest.mark.parametrize("name", list(HEADS))     # one test per head: `pytest -k NAME` selects its own
def test_a_head_has_its_own_label_and_a_config_per_dataset(name):
    """docs/heads.md's recipe: a label of its own, and configs/{ptb,wt2,ptb_mini}/NAME.yaml (the
    miniature's is what a CPU trains) naming the head."""
    label = HEADS[name].label
    assert label, f"{name}: its head class has no label"
    same = [other for other in HEADS if other != name and HEADS[other].label == label]
    assert not same, f"{name}: its label {label!r} is also the label of {', '.join(same)}"
    for dataset in ("ptb", "wt2", "ptb_mini"):
        path = Path(f"configs/{dataset}/{name}.yaml")
        assert path.is_file(), f"{name}: no {path} (docs/heads.md, Adding a head)"
        assert f"name: {name}" in path.read_text(), f"{path} does not name the head {name}"


@pytest.mark.parametrize("name", list(HEADS))
def test_a_heads_options_are_a_dataclass_of_types_a_config_gives(name):
    """docs/heads.md's recipe: Options is a dataclass whose fields a config can set (a field typed
    list or tuple is one no config could give, found here rather than by its first config)."""
    options = HEADS[name].Options
    assert dataclasses.is_dataclass(options), f"{name}: its Options is not a dataclass"
    hints = typing.get_type_hints(options)
    unreadable = {field.name: hints[field.name] for field in dataclasses.fields(options)
                  if field.init and not readable_type(hints[field.name])}
    assert not unreadable, f"{name}: options of types no config value is read as: {unreadable}"


@pytest.mark.parametrize("name", SB_HEADS)
def test_linear_heads_need_nhidlast_equal_emsize(name):
    assert HEADS[name].requires_nhidlast_equal_emsize == (name not in ("mos", "moc"))


@pytest.mark.parametrize("name", list(HEADS))
def test_output_shapes_and_transformed_logits(name):
    head = make_head(name)
    out = head(make_g(name))
    assert out.log_probs.shape == (T, B, V)
    if HEADS[name].has_transformed_logits:
        assert out.transformed_logits.shape == (T, B, V)
        # log_probs is the log_softmax of the returned f(l)
        torch.testing.assert_close(out.log_probs, F.log_softmax(out.transformed_logits, -1))
    else:
        assert out.transformed_logits is None


@pytest.mark.parametrize("name", list(HEADS))
def test_decoder_weight_is_the_embedding_and_bias_starts_at_zero(name):
    embedding = nn.Parameter(torch.randn(V, E))
    head = HEADS[name](HEADS[name].small_options(), V, E, nhidlast_of(name), embedding)
    assert head.decoder.weight is embedding
    assert torch.equal(head.decoder.bias, torch.zeros(V))


@pytest.mark.parametrize("name", list(HEADS))
def test_rows_are_distributions(name):
    head = make_head(name, dtype=torch.float64).train()
    log_probs = head(make_g(name, torch.float64, scale=3.0)).log_probs
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(T, B, dtype=torch.float64))
    assert (log_probs <= 0).all()


@pytest.mark.parametrize("name", list(HEADS))
def test_gradients_gradcheck_float64(name):
    head = make_head(name, dtype=torch.float64).eval()   # no dropout: a deterministic function
    g = make_g(name, torch.float64).requires_grad_()
    params = [p for p in head.parameters() if p.requires_grad]

    def fn(g, *params):
        return head(g).log_probs

    assert torch.autograd.gradcheck(fn, (g, *params), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("name", list(HEADS))
def test_eval_mode_is_deterministic(name):
    head = make_head(name).eval()
    g = make_g(name)
    first, second = head(g), head(g)
    assert torch.equal(first.log_probs, second.log_probs)


@pytest.mark.parametrize("name", list(HEADS))
@pytest.mark.parametrize("mode", ["eval", "train"])
def test_forward_computes_the_heads_plain_reference_with_its_gradients(name, mode):
    """forward() (fused kernels where the head has them) against the head's equation written
    plainly (`reference`), values and every gradient, in training mode with the same masks."""
    head = make_head(name, dtype=torch.float64).train(mode == "train")
    g = make_g(name, torch.float64, scale=2.0)
    results = []
    for fn in (lambda h, x: h(x), lambda h, x: h.reference(x)):
        torch.manual_seed(7)
        out = fn(head, g.detach())
        transformed = out.transformed_logits
        results.append((out.log_probs, transformed,
                        grads_of(lambda h, x: fn(h, x).log_probs[..., :3].sum(-1), head, g)))
    (fused, fused_f, (_, fused_grads)), (plain, plain_f, (_, plain_grads)) = results
    torch.testing.assert_close(fused, plain)
    assert (fused_f is None) == (plain_f is None) == (not HEADS[name].has_transformed_logits)
    if fused_f is not None:
        torch.testing.assert_close(fused_f, plain_f)
    for a, b in zip(fused_grads, plain_grads):
        torch.testing.assert_close(a, b)


def targets_for(seed: int = 2) -> torch.Tensor:
    return torch.randint(V, (T, B), generator=torch.Generator().manual_seed(seed))


def grads_of(fn, head, g):
    """fn(head, g) -> (T, B) values; returns them and the gradients of a random
    weighted sum for g and every head parameter."""
    g = g.detach().requires_grad_()
    values = fn(head, g)
    weights = torch.rand(values.shape, generator=torch.Generator().manual_seed(3), dtype=values.dtype)
    inputs = [g, *(p for p in head.parameters() if p.requires_grad)]
    return values, torch.autograd.grad((values * weights).sum(), inputs)


def gathered(head, g, targets):
    return head(g).log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


COMPILABLE = [name for name in HEADS if hasattr(HEADS[name].small_options(), "compile")]


@pytest.mark.parametrize("name, compiled", [(name, False) for name in HEADS] +
                         [(name, True) for name in COMPILABLE])
def test_target_log_probs_equal_the_gathered_log_probs_with_gradients(name, compiled):
    """In training mode, with the same dropout masks: the values and every gradient."""
    options = HEADS[name].small_options()
    if compiled:
        options = dataclasses.replace(options, compile=True)
    head = make_head(name, options, dtype=torch.float64).train()
    g, targets = make_g(name, torch.float64, scale=2.0), targets_for()
    torch.manual_seed(5)
    expected, expected_grads = grads_of(lambda h, x: gathered(h, x, targets), head, g)
    for _ in range(2):            # the second time MoS reuses its workspace
        torch.manual_seed(5)
        values, grads = grads_of(lambda h, x: h.target_log_probs(x, targets), head, g)
        torch.testing.assert_close(values, expected)
        for a, b in zip(grads, expected_grads):
            torch.testing.assert_close(a, b)


def test_mos_target_log_probs_match_finite_differences_float64():
    """v^T J u from one backward against central differences along random u, for g and
    every parameter at once. (torch's gradcheck runs backward on one graph twice, which
    this function refuses: see the retain_graph test below.)"""
    head = make_head("mos", dtype=torch.float64).eval()
    g, targets = make_g("mos", torch.float64), targets_for()
    params = [p for p in head.parameters() if p.requires_grad]
    generator = torch.Generator().manual_seed(4)
    v = torch.randn(T, B, generator=generator, dtype=torch.float64)
    for trial in range(3):
        inputs = [g, *(p.detach().clone() for p in params)]
        directions = [torch.randn(x.shape, generator=generator, dtype=torch.float64) for x in inputs]

        def value(step: float) -> torch.Tensor:
            with torch.no_grad():
                for p, x, u in zip(params, inputs[1:], directions[1:]):
                    p.copy_(x + step * u)
                return (head.target_log_probs(g + step * directions[0], targets) * v).sum()

        eps = 1e-6
        numerical = (value(eps) - value(-eps)) / (2 * eps)
        value(0.0)                      # parameters back to where they were
        x = g.detach().requires_grad_()
        grads = torch.autograd.grad((head.target_log_probs(x, targets) * v).sum(), [x, *params])
        analytical = sum((grad * u).sum() for grad, u in zip(grads, directions))
        torch.testing.assert_close(analytical, numerical, rtol=1e-6, atol=1e-7)


def test_mos_workspace_is_reused_after_backward_and_released_without_grad():
    head = make_head("mos").train()
    g, targets = make_g("mos").requires_grad_(), targets_for()
    head.target_log_probs(g, targets).sum().backward()
    buffer = head.workspace._free
    assert buffer is not None and buffer.numel() == T * B * 3 * V   # given back by backward
    log_p = head.target_log_probs(g, targets)
    assert head.workspace._free is None                              # held by the graph ...
    log_p.sum().backward()
    assert head.workspace._free.data_ptr() == buffer.data_ptr()      # ... then the same memory
    with torch.no_grad():
        head.target_log_probs(g, targets)
    assert head.workspace._free.data_ptr() == buffer.data_ptr()      # no graph: back at once
    head.workspace.release()
    assert head.workspace._free is None


def test_mos_evaluation_never_grows_the_training_workspace():
    head = make_head("mos").train()
    targets = targets_for()
    head.target_log_probs(make_g("mos").requires_grad_(), targets).sum().backward()
    kept = head.workspace._free
    bigger = make_g("mos").repeat(2, 1, 1)                          # twice the positions
    expected = gathered(head.eval(), bigger, targets.repeat(2, 1))
    with torch.no_grad():
        values = head.target_log_probs(bigger, targets.repeat(2, 1))
    torch.testing.assert_close(values, expected)
    assert head.workspace._free is kept                             # a temporary was used
    head.train()
    head.target_log_probs(bigger.requires_grad_(), targets.repeat(2, 1)).sum().backward()
    assert head.workspace._free.numel() == 2 * kept.numel()         # training does grow it


def test_mos_without_gradient_scores_row_blocks_within_the_memory_bound(monkeypatch):
    from model.kernels import mixture
    head = make_head("mos").eval()
    g, targets = make_g("mos"), targets_for()
    expected = gathered(head, g, targets)
    budget = 2 * 3 * V * 4                               # two positions' K x V float32 logits
    monkeypatch.setattr(mixture, "NO_GRAD_LOGITS_BYTES", budget)
    taken, take = [], mixture.Workspace.take

    def recording_take(workspace, rows, cols, like, grow=True):
        taken.append(rows * cols * like.element_size())
        return take(workspace, rows, cols, like, grow)

    monkeypatch.setattr(mixture.Workspace, "take", recording_take)
    with torch.no_grad():
        values = head.target_log_probs(g, targets)
    torch.testing.assert_close(values, expected)
    assert len(taken) == math.ceil(T * B / 2) and max(taken) <= budget


MOS_CACHE_PEAK = """
import sys
import torch
from benchmarks.gpu_check import FAST, mos_cache_peak
from model.kernels import mixture
mixture.NO_GRAD_LOGITS_BYTES = int(sys.argv[1])
overrides = [*FAST, "head.components=10", "head.compile=false"]
mos_cache_peak("configs/ptb/mos.yaml", 2000, torch.device("cpu"), positions=200, overrides=overrides)  # warm
print(*mos_cache_peak("configs/ptb/mos.yaml", 2000, torch.device("cpu"), overrides=overrides))
"""


def test_mos_on_a_neural_cache_chunk_stays_inside_an_explicit_budget_measured():
    """A 5,000-position chunk at V = 2,000, K = 10 (400 MB of logits at once) in a fresh process:
    the resident memory grows by the two bounded buffers of the eager path and little else."""
    import os
    import subprocess
    import sys
    budget = 8 << 20
    proc = subprocess.run([sys.executable, "-c", MOS_CACHE_PEAK, str(budget)], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent.parent, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536"})
    assert proc.returncode == 0, proc.stderr
    peak = int(proc.stdout.split()[-2])
    assert peak <= 2 * budget + (16 << 20), peak


def test_mos_two_forwards_before_backward_get_their_own_buffers():
    head = make_head("mos", dtype=torch.float64).eval()
    first_targets, second_targets = targets_for(2), targets_for(3)
    g = make_g("mos", torch.float64)
    expected = [grads_of(lambda h, x: gathered(h, x, t), head, g)[1]
                for t in (first_targets, second_targets)]
    x1 = g.detach().requires_grad_()
    x2 = g.detach().requires_grad_()
    first = head.target_log_probs(x1, first_targets)
    second = head.target_log_probs(x2, second_targets)
    weights = torch.rand(T, B, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    (second * weights).sum().backward()
    (first * weights).sum().backward()
    torch.testing.assert_close(x1.grad, expected[0][0])
    torch.testing.assert_close(x2.grad, expected[1][0])


def test_mos_target_backward_twice_is_an_error_not_a_wrong_gradient():
    head = make_head("mos").train()
    g = make_g("mos").requires_grad_()
    log_p = head.target_log_probs(g, targets_for())
    log_p.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        log_p.sum().backward()


@pytest.mark.parametrize("name", ["mos", "moc"])
def test_mixture_dropout_is_on_in_training_only(name):
    head = make_head(name, HEADS[name].Options(components=3, dropoutl=0.5))
    g = make_g(name)
    head.train()
    assert not torch.equal(head(g).log_probs, head(g).log_probs)
    head.eval()
    assert torch.equal(head(g).log_probs, head(g).log_probs)


@pytest.mark.parametrize("name", list(HEADS))
@pytest.mark.parametrize("g_scale, weight_scale", [(1e4, 1.0), (1.0, 1e4), (1.0, 1e30),
                                                        (1e4, 1e30)])
def test_extreme_inputs_give_finite_log_probs(name, g_scale, weight_scale):
    head = make_head(name).train()
    with torch.no_grad():
        head.decoder.weight.mul_(weight_scale)   # logits of order +-weight_scale (and beyond)
    out = head(make_g(name, scale=g_scale))
    assert torch.isfinite(out.log_probs).all()
    if out.transformed_logits is not None:
        assert torch.isfinite(out.transformed_logits).all()
    out.log_probs[..., 0].sum().backward()   # and backward runs without error
    targets = torch.randint(V, (T, B), generator=torch.Generator().manual_seed(0))
    target_log_probs = head.target_log_probs(make_g(name, scale=g_scale), targets)
    assert torch.isfinite(target_log_probs).all()
    target_log_probs.sum().backward()


def test_softmax_is_log_softmax_of_the_tied_logits():
    head = make_head("softmax", dtype=torch.float64)
    g = make_g("softmax", torch.float64)
    logits = g @ head.decoder.weight.T + head.decoder.bias
    torch.testing.assert_close(head(g).log_probs, F.log_softmax(logits, -1))


# --- options --------------------------------------------------------------------------------

@pytest.mark.parametrize("options_cls, kwargs, field", [
    (GSSOptions, {"c": 0.0, "k": 0.0}, "k"),
    (GSSOptions, {"c": 0.0, "k": -2.0}, "k"),
    (GSSOptions, {"c": math.inf, "k": 2.0}, "c"),
    (PLIFOptions, {"knots": 0}, "knots"),
    (PLIFOptions, {"bound": 0.0}, "bound"),
    (PLIFOptions, {"lr": 0.0}, "lr"),
    (FrozenPLIFOptions, {"bound": -1.0}, "bound"),
    (MixtureOptions, {"components": 0}, "components"),
    (MixtureOptions, {"dropoutl": 1.0}, "dropoutl"),
    (MixtureOptions, {"dropoutl": -0.1}, "dropoutl"),
    (MixtureOptions, {"latent_scale": 0.0}, "latent_scale"),
    (MixtureOptions, {"latent_scale": math.inf}, "latent_scale"),
])
def test_impossible_options_are_rejected_naming_the_field(options_cls, kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}: "):
        options_cls(**kwargs)


@pytest.mark.parametrize("name", ["mos", "moc"])
def test_latent_scale_multiplies_the_latent_layers_initial_weights_only(name):
    plain = make_head(name, HEADS[name].Options(components=3, latent_scale=1.0))
    scaled = make_head(name, HEADS[name].Options(components=3, latent_scale=4.0))
    torch.testing.assert_close(scaled.latent.weight, 4.0 * plain.latent.weight)
    assert torch.equal(scaled.latent.bias, plain.latent.bias) and torch.equal(scaled.prior.weight, plain.prior.weight)


def test_default_options_are_the_papers_settings():
    assert PLIFOptions() == PLIFOptions(knots=100_000, bound=20.0, lr=0.02, compile=True)
    assert MixtureOptions() == MixtureOptions(components=15, dropoutl=0.29)
    assert not hasattr(FrozenPLIFOptions(), "lr")   # nothing to learn, so no learning rate


# --- SS and GSS -----------------------------------------------------------------------------

LOGITS64 = torch.linspace(-30, 30, 601, dtype=torch.float64).view(1, 1, -1)


@pytest.mark.parametrize("c, k", [(0.0, 2.0), (-1.5, 2.5), (-1.5, 3.0), (2.0, 0.5), (1.0, 1.0)])
def test_gss_transform_matches_the_formula(c, k):
    torch.testing.assert_close(gss_transform(LOGITS64, c, k), gss_reference(LOGITS64, c, k))


def test_ss_is_2l_minus_softplus_and_equals_gss_0_2():
    ss = make_head("ss", dtype=torch.float64)
    gss = make_head("gss", GSSOptions(c=0.0, k=2.0, compile=False), dtype=torch.float64)
    g = make_g("ss", torch.float64, scale=4.0)
    out = ss(g)
    logits = ss.decoder(g)
    torch.testing.assert_close(out.transformed_logits, 2 * logits - F.softplus(logits))
    torch.testing.assert_close(out.log_probs, F.log_softmax(2 * logits - F.softplus(logits), -1))
    torch.testing.assert_close(gss(g).log_probs, out.log_probs)


@pytest.mark.parametrize("c", [-1.5, 0.0, 3.0])
def test_gss_with_k_1_is_the_softmax(c):
    gss = make_head("gss", GSSOptions(c=c, k=1.0, compile=False))
    softmax = make_head("softmax")
    g = make_g("gss", scale=4.0)
    torch.testing.assert_close(gss(g).log_probs, softmax(g).log_probs)


def test_gss_transform_gradient_and_monotonicity():
    logits = LOGITS64.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda l: gss_transform(l, -1.5, 2.5), (logits,))
    f = gss_transform(LOGITS64, -1.5, 2.5)
    assert (f.diff(dim=-1) > 0).all()


def test_gss_transform_saves_one_tensor_per_logit():
    logits = torch.randn(T, B, V, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        gss_transform(logits, -1.5, 2.5)
    assert [(t.shape, t.dtype) for t in saved] == [(logits.shape, torch.float32)]


def test_gss_compiled_kernel_agrees_with_eager():
    logits = (torch.randn(5, 3, 301) * 10).requires_grad_()
    grad = torch.randn(5, 3, 301)
    results = []
    for compiled in (False, True):
        x = logits.detach().clone().requires_grad_()
        f = gss_transform(x, -1.5, 2.5, compiled=compiled)
        f.backward(grad)
        results.append((f.detach(), x.grad))
    for eager, compiled in zip(*results):
        torch.testing.assert_close(compiled, eager)


def test_failed_compile_warns_once_and_falls_back_to_eager(monkeypatch):
    def broken_compile(*args, **kwargs):
        raise RuntimeError("no compiler here\nsecond line")

    kernel = FusedKernel(lambda x: x * 2)
    monkeypatch.setattr(FusedKernel, "_compile_failed", False)
    monkeypatch.setattr(torch, "compile", broken_compile)
    x = torch.randn(4)
    with pytest.warns(RuntimeWarning, match="torch.compile failed .*no compiler here"):
        torch.testing.assert_close(kernel(x, compiled=True), x * 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # no second warning, from any kernel
        torch.testing.assert_close(kernel(x, compiled=True), x * 2)
        torch.testing.assert_close(FusedKernel(torch.neg)(x, compiled=True), -x)


def test_a_stop_inside_a_compiled_kernel_stops_and_is_no_compile_failure(monkeypatch):
    """SIGTERM raises Terminated (experiment.cli) wherever the script is; inside a compiled kernel
    the eager fallback's `except Exception` took it for a failed compile, warned, and the script
    went on eagerly (a second SIGTERM was needed). Ctrl-C's KeyboardInterrupt likewise."""
    from experiment.cli import Terminated

    for stop in (Terminated, KeyboardInterrupt):
        def stopped_inside(*args):
            raise stop

        kernel = FusedKernel(lambda x: x * 2)
        monkeypatch.setattr(FusedKernel, "_compile_failed", False)
        monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: stopped_inside)
        with warnings.catch_warnings():
            warnings.simplefilter("error")          # no "torch.compile failed" warning
            with pytest.raises(stop):
                kernel(torch.randn(4), compiled=True)
        assert not FusedKernel._compile_failed


# --- MoS and MoC ----------------------------------------------------------------------------

def mixture_reference(head, g: torch.Tensor):
    """Prior and contexts written out per component k, in float64, without dropout."""
    K = head.options.components
    prior = torch.softmax(g @ head.prior.weight.T, -1)                      # (T, B, K)
    latent = torch.tanh(g @ head.latent.weight.T + head.latent.bias)        # (T, B, K*E)
    contexts = [latent[..., k * E:(k + 1) * E] for k in range(K)]
    return prior, contexts


def test_mos_matches_the_mixture_of_softmaxes():
    head = make_head("mos", dtype=torch.float64).eval()
    g = make_g("mos", torch.float64, scale=2.0)
    prior, contexts = mixture_reference(head, g)
    W, b = head.decoder.weight, head.decoder.bias
    probs = sum(prior[..., k:k + 1] * torch.softmax(h @ W.T + b, -1)
                for k, h in enumerate(contexts))
    torch.testing.assert_close(head(g).log_probs, probs.log())


@pytest.mark.parametrize("compiled", [False, True])
def test_fused_mixture_log_softmax_values_and_gradients(compiled):
    torch.manual_seed(0)
    logits = (torch.randn(2, 5, 3, 11, dtype=torch.float64) * 3).requires_grad_()
    log_prior = F.log_softmax(torch.randn(2, 5, 3, dtype=torch.float64), -1).detach().requires_grad_()
    grad = torch.randn(2, 5, 11, dtype=torch.float64)
    fused = mixture_log_softmax(logits, log_prior, compiled)
    fused_grads = torch.autograd.grad(fused, (logits, log_prior), grad)
    reference = mos_reference(logits, log_prior)
    reference_grads = torch.autograd.grad(reference, (logits, log_prior), grad)
    torch.testing.assert_close(fused, reference)
    for a, b in zip(fused_grads, reference_grads):
        torch.testing.assert_close(a, b)


def test_fused_mixture_log_softmax_gradcheck():
    torch.manual_seed(1)
    logits = torch.randn(4, 3, 7, dtype=torch.float64, requires_grad=True)
    log_prior = F.log_softmax(torch.randn(4, 3, dtype=torch.float64), -1).detach().requires_grad_()
    assert torch.autograd.gradcheck(lambda l, p: mixture_log_softmax(l, p), (logits, log_prior))


def test_fused_mixture_saves_only_the_component_logits():
    logits = torch.randn(6, 15, 1000, requires_grad=True)
    log_prior = F.log_softmax(torch.randn(6, 15), -1)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        mixture_log_softmax(logits, log_prior)
    component_logits = 6 * 15 * 1000
    assert sum(saved) <= component_logits + 6 * 1000 + 2 * 6 * 15


def test_moc_matches_the_mixture_of_contexts():
    head = make_head("moc", dtype=torch.float64).eval()
    g = make_g("moc", torch.float64, scale=2.0)
    prior, contexts = mixture_reference(head, g)
    W, b = head.decoder.weight, head.decoder.bias
    context = sum(prior[..., k:k + 1] * h for k, h in enumerate(contexts))
    torch.testing.assert_close(head(g).log_probs, F.log_softmax(context @ W.T + b, -1))


def test_mos_with_one_component_is_a_softmax_of_tanh_context():
    head = make_head("mos", MoSOptions(components=1, dropoutl=0.0, compile=False), dtype=torch.float64)
    g = make_g("mos", torch.float64)
    context = torch.tanh(head.latent(g))
    torch.testing.assert_close(head(g).log_probs, F.log_softmax(head.decoder(context), -1))


def test_mos_keeps_rare_words_finite_where_log_of_sum_underflows():
    head = make_head("mos", dtype=torch.float64).eval()
    with torch.no_grad():
        head.decoder.bias[0] = -1e3       # p(word 0) ~ exp(-1000): 0 in float64
    log_probs = head(make_g("mos", torch.float64)).log_probs
    assert torch.isfinite(log_probs).all() and (log_probs[..., 0] < -900).all()


def test_mixture_latent_dropout_is_locked_over_time():
    head = make_head("mos", MoSOptions(components=3, dropoutl=0.5, compile=False)).train()
    g = make_g("mos")[:1].expand(T, B, NHIDLAST_MIX)             # the same g at every step
    _, contexts = head.components(g)
    clean = torch.tanh(head.latent(g)).view(T, B, 3, E)
    for t in range(1, T):                                        # one mask for all steps ...
        assert torch.equal(contexts[t], contexts[0])
    assert not torch.equal(contexts[0, 0], contexts[0, 1])      # ... one per sequence
    kept = contexts != 0
    torch.testing.assert_close(contexts[kept], clean[kept] / 0.5)  # scaled by 1/(1-p)
    assert 0 < kept.float().mean() < 1


# --- parameter counts (docs/reference.md section 6) ------------------------------------------------------

def own_parameters(head) -> int:
    """The head's parameters without the tied embedding (the body counts it)."""
    return sum(p.numel() for p in head.parameters() if p is not head.decoder.weight)


def full_model(head_name: str, options, vocab: int, emsize: int, nhid: int, nhidlast: int):
    body = AWDLSTMBody(vocab, emsize, nhid, nhidlast, 3, 0.4, 0.3, 0.4, 0.1, 0.5)
    head = HEADS[head_name](options, vocab, emsize, nhidlast, body.encoder.weight)
    return LanguageModel(body, head)


def lstm_parameters(n_in: int, n_out: int) -> int:
    return 4 * n_out * (n_in + n_out) + 2 * 4 * n_out   # weight_ih, weight_hh, two biases


def test_mos_parameter_count_matches_the_paper():
    head = HEADS["mos"](MoSOptions(), 10_000, 280, 620, nn.Parameter(torch.empty(10_000, 280)))
    assert own_parameters(head) == 620 * 15 + (620 * 15 * 280 + 15 * 280) + 10_000
    total = (10_000 * 280 + lstm_parameters(280, 960) + lstm_parameters(960, 960)
             + lstm_parameters(960, 620) + own_parameters(head))
    assert total == 21_500_620                                   # [SB] Table 2: 21.50M
    assert count_parameters(full_model("mos", MoSOptions(), 10_000, 280, 960, 620)) == total


@pytest.mark.parametrize("name, options, total", [
    ("softmax", HEADS["softmax"].Options(), 24_221_600),         # [SB] Table 2: 24.22M
    ("gss", GSSOptions(c=-1.5, k=2.5), 24_221_600),
    ("plif", PLIFOptions(), 24_321_600),                         # 24.32M: + K slopes
    ("plif_frozen", FrozenPLIFOptions(), 24_221_600),            # frozen slopes are no parameters
])
def test_linear_head_parameter_counts_match_the_paper(name, options, total):
    model = full_model(name, options, 10_000, 400, 1150, 400)
    assert count_parameters(model) == total
    extra = options.knots if name == "plif" else 0
    assert own_parameters(model.head) == 10_000 + extra


def test_moc_has_the_same_parameters_as_mos():
    mos, moc = make_head("mos"), make_head("moc")
    assert [(n, p.shape) for n, p in mos.named_parameters()] == \
           [(n, p.shape) for n, p in moc.named_parameters()]



def test_compiled_kernels_make_only_the_row_dimension_symbolic(monkeypatch):
    """The vocabulary and K stay constants of the compiled kernels; the rows (positions x batch,
    which the variable BPTT length changes) are marked, not everything (dynamic=True)."""
    compiles, marked = [], []

    def recording_compile(fn, **options):
        compiles.append(options)
        return fn

    monkeypatch.setattr(FusedKernel, "_compile_failed", False)
    monkeypatch.setattr(torch, "compile", recording_compile)
    monkeypatch.setattr(torch._dynamo, "maybe_mark_dynamic", lambda t, dim: marked.append((tuple(t.shape), dim)))
    from model.kernels.gss import _KERNEL
    from model.kernels.mixture import _MIXTURE_FORWARD
    for kernel in (_KERNEL, _MIXTURE_FORWARD):
        monkeypatch.setattr(kernel, "_compiled", None)            # compiled by an earlier test
    logits, log_prior = torch.randn(6, 3, 11), torch.randn(6, 3)             # (N, K, V), (N, K)
    _MIXTURE_FORWARD(logits, log_prior, compiled=True)
    assert compiles == [{"dynamic": False}]
    assert marked == [((6, 3, 11), 0), ((6, 3), 0)]
    marked.clear()
    x = torch.randn(7, 11)
    gss_transform(x, -1.5, 2.5, compiled=True)
    assert marked == [((7, 11), 0)]
