"""PLIF ([LMS] section 4): the piecewise function against a direct evaluation, its custom
gradient against gradcheck and plain autograd, what it saves for backward, the compiled
kernels, and the frozen variant."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from model.heads import HEADS
from model.heads.plif import FrozenPLIFOptions, PLIFOptions, plif_reference
from model.kernels.plif import plif

K, BOUND = 10, 2.0
DELTA = 2 * BOUND / K


def slopes_param(k: int = K, dtype=torch.float64, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(k, generator=generator, dtype=dtype) + math.log(math.e - 1)


def away_from_knots(n: int, dtype=torch.float64, seed: int = 1, k: int = K,
                    bound: float = BOUND) -> torch.Tensor:
    """Points inside buckets (20%-80% of the way), plus some beyond both ends of [-T, T]."""
    generator = torch.Generator().manual_seed(seed)
    delta = 2 * bound / k
    bucket = torch.randint(-3, k + 3, (n,), generator=generator)     # -3..-1, K..K+2: outside
    within = 0.2 + 0.6 * torch.rand(n, generator=generator, dtype=torch.float64)
    return (-bound + (bucket + within) * delta).to(dtype)


def reference(x: float, v: torch.Tensor, bound: float) -> float:
    """f(x) straight from the definition, one point at a time, in Python floats."""
    s = [math.log1p(math.exp(vi)) for vi in v.tolist()]
    k = len(s)
    delta = 2 * bound / k
    i = min(max(math.floor((x + bound) / delta), 0), k - 1)
    return s[i] * (x - (-bound + i * delta)) + delta * sum(s[:i])


# --- the function ---------------------------------------------------------------------------

def test_forward_matches_the_definition():
    v = slopes_param()
    x = torch.cat([away_from_knots(200), torch.linspace(-3, 3, 61, dtype=torch.float64)])
    expected = torch.tensor([reference(xi, v, BOUND) for xi in x.tolist()], dtype=torch.float64)
    torch.testing.assert_close(plif(x, v, BOUND), expected)


def test_float32_forward_matches_float64_definition_at_the_default_size():
    v = slopes_param(100_000, torch.float32)
    x = torch.randn(20_000) * 8
    expected = plif_reference(x.double(), v.double(), 20.0)
    torch.testing.assert_close(plif(x, v, 20.0).double(), expected, rtol=1e-5, atol=1e-4)


def test_function_is_continuous_and_increasing():
    v = slopes_param()
    knots = torch.linspace(-BOUND, BOUND, K + 1, dtype=torch.float64)
    eps = 1e-9
    torch.testing.assert_close(plif(knots - eps, v, BOUND), plif(knots + eps, v, BOUND),
                               atol=1e-8, rtol=0)
    f = plif(torch.linspace(-5, 5, 2001, dtype=torch.float64), v, BOUND)
    assert (f.diff() > 0).all()


def test_values_outside_the_bound_continue_the_edge_pieces():
    v = slopes_param()
    s = F.softplus(v)
    below = torch.tensor([-BOUND - 0.5, -BOUND - 7.0, -1e6], dtype=torch.float64)
    above = torch.tensor([BOUND + 0.5, BOUND + 7.0, 1e6], dtype=torch.float64)
    f_top = DELTA * s.sum()                                     # f(T)
    torch.testing.assert_close(plif(below, v, BOUND), s[0] * (below + BOUND))
    torch.testing.assert_close(plif(above, v, BOUND), f_top + s[-1] * (above - BOUND))


def test_papers_init_of_v():
    head = HEADS["plif"](PLIFOptions(compile=False), 7, 3, 3, nn.Parameter(torch.zeros(7, 3)))
    v = head.v.detach()
    assert v.shape == (100_000,)
    # N(0, 1) + log(e - 1): the median slope softplus(log(e - 1)) is 1, f starts near identity
    assert abs(v.mean().item() - math.log(math.e - 1)) < 0.02 and abs(v.std().item() - 1) < 0.02


def test_extreme_and_nan_logits():
    v = slopes_param(dtype=torch.float32)
    x = torch.tensor([1e30, -1e30, 3e38, -3e38, math.inf, -math.inf, math.nan])
    f = plif(x, v, BOUND)
    assert torch.isfinite(f[:2]).all()
    assert f[4] == math.inf and f[5] == -math.inf and math.isnan(f[6])


# --- gradients ------------------------------------------------------------------------------

def test_gradcheck_float64_logits_and_slopes():
    x = away_from_knots(60).view(3, 4, 5).requires_grad_()
    v = slopes_param().requires_grad_()
    assert torch.autograd.gradcheck(lambda x, v: plif(x, v, BOUND), (x, v))


@pytest.mark.parametrize("scatter_chunk", [1 << 22, 64, 999])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_gradients_match_plain_autograd(dtype, scatter_chunk, monkeypatch):
    """Also with the slope gradient's scatter split into many chunks (a partial last one)."""
    monkeypatch.setattr("model.kernels.plif._SCATTER_CHUNK", scatter_chunk)
    x = torch.cat([away_from_knots(500, dtype), torch.randn(500, dtype=dtype) * 3]).view(10, 100)
    v = slopes_param(dtype=dtype)
    grad = torch.randn(10, 100, dtype=dtype)
    grads = []
    for fn in (plif, plif_reference):
        xi, vi = x.clone().requires_grad_(), v.clone().requires_grad_()
        fn(xi, vi, BOUND).backward(grad)
        grads.append((xi.grad, vi.grad))
    (gx, gv), (gx_ref, gv_ref) = grads
    torch.testing.assert_close(gx, gx_ref)
    torch.testing.assert_close(gv, gv_ref)


def test_without_deterministic_algorithms_a_gpu_keeps_index_add():
    from model.kernels import plif as kernels
    assert not torch.are_deterministic_algorithms_enabled()
    assert not kernels._ordered_sums_needed(torch.device("cuda"))


@pytest.fixture
def deterministic_algorithms():
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before)


@pytest.mark.parametrize("scatter_chunk", [1 << 22, 64])
def test_deterministic_mode_sums_the_slope_gradient_without_index_add(scatter_chunk, monkeypatch,
                                                                      deterministic_algorithms):
    """A GPU's index_add_ adds in the order its atomics arrive: with deterministic algorithms
    the buckets are summed in a fixed order instead, to the same values (the CPU's index_add_
    is a loop in a fixed order already: the ordered sums are forced here)."""
    from model.kernels import plif as kernels
    assert kernels._ordered_sums_needed(torch.device("cuda"))
    assert not kernels._ordered_sums_needed(torch.device("cpu"))
    monkeypatch.setattr(kernels, "_ordered_sums_needed", lambda device: True)
    monkeypatch.setattr("model.kernels.plif._SCATTER_CHUNK", scatter_chunk)

    def no_index_add(*args, **kwargs):
        raise AssertionError("index_add_ used in deterministic mode")

    x = torch.cat([away_from_knots(500), torch.randn(500) * 3]).view(10, 100)
    v, grad = slopes_param(), torch.randn(10, 100)
    xi, vi = x.clone().requires_grad_(), v.clone().requires_grad_()
    plif_reference(xi, vi, BOUND).backward(grad)
    monkeypatch.setattr(torch.Tensor, "index_add_", no_index_add)
    xd, vd = x.clone().requires_grad_(), v.clone().requires_grad_()
    plif(xd, vd, BOUND).backward(grad)
    torch.testing.assert_close(xd.grad, xi.grad)
    torch.testing.assert_close(vd.grad, vi.grad)


def test_no_slope_gradient_when_slopes_are_fixed():
    x = away_from_knots(50).requires_grad_()
    v = slopes_param()
    plif(x, v, BOUND).sum().backward()
    torch.testing.assert_close(x.grad, F.softplus(v)[((x.detach() + BOUND) / DELTA)
                                                   .floor().clamp(0, K - 1).long()])


# --- memory: what backward keeps ------------------------------------------------------------

def saved_by(fn, *args) -> list[torch.Tensor]:
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        fn(*args)
    return saved


def test_saves_only_the_logits_per_logit():
    x = torch.randn(7, 5, 300, requires_grad=True)
    v = slopes_param(1000, torch.float32).requires_grad_()
    saved = saved_by(plif, x, v, 20.0)
    per_logit = [t for t in saved if t.numel() >= x.numel()]
    assert all(t.dtype != torch.int64 for t in saved)
    assert len(per_logit) == 1 and per_logit[0].untyped_storage().data_ptr() == \
        x.untyped_storage().data_ptr()
    assert sum(t.numel() * t.element_size() for t in per_logit) / x.numel() <= 4
    # the rest is v itself (K values, a parameter): nothing grows with the batch
    assert [t is v for t in saved if t.numel() < x.numel()] == [True]


def test_head_saves_four_bytes_per_logit_more_than_softmax():
    def saved_storages(head, g) -> int:
        params = {p.untyped_storage().data_ptr() for p in [*head.parameters(), *head.buffers()]}
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                    for t in saved_by(head, g)}
        return sum(n for ptr, n in storages.items() if ptr not in params)

    V, E = 500, 8
    embedding = nn.Parameter(torch.randn(V, E))
    g = torch.randn(6, 4, E, requires_grad=True)
    softmax = HEADS["softmax"](HEADS["softmax"].Options(), V, E, E, embedding)
    for name, options in (("plif", PLIFOptions(compile=False)),
                          ("plif_frozen", FrozenPLIFOptions(compile=False))):
        head = HEADS[name](options, V, E, E, embedding)
        extra = saved_storages(head, g) - saved_storages(softmax, g)
        assert extra == 4 * g.shape[0] * g.shape[1] * V   # the logits, once


# --- the compiled kernels -------------------------------------------------------------------

@pytest.mark.parametrize("v_trainable", [True, False])
def test_compiled_kernels_agree_with_eager(v_trainable):
    x0 = torch.cat([torch.randn(6000) * 8, torch.tensor([1e30, -1e30, 25.0, -25.0])]).view(4, -1)
    v0 = slopes_param(100_000, torch.float32)
    grad = torch.randn_like(x0)
    results = []
    for compiled in (False, True):
        x, v = x0.clone().requires_grad_(), v0.clone().requires_grad_(v_trainable)
        f = plif(x, v, 20.0, compiled=compiled)
        f.backward(grad)
        results.append((f.detach(), x.grad, v.grad))
    for eager, compiled in zip(*results):
        if eager is None:
            assert compiled is None
        else:
            torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)


# --- the heads ------------------------------------------------------------------------------

def make(name: str, options, seed: int = 0):
    torch.manual_seed(seed)
    return HEADS[name](options, 50, 6, 6, nn.Parameter(torch.randn(50, 6) * 0.3))


@pytest.mark.parametrize("name, options", [
    ("plif", PLIFOptions(knots=32, bound=3.0, compile=False)),
    ("plif_frozen", FrozenPLIFOptions(knots=32, bound=3.0, compile=False)),
])
def test_head_applies_plif_to_the_tied_logits(name, options):
    head = make(name, options)
    g = torch.randn(5, 2, 6)
    out = head(g)
    logits = g @ head.decoder.weight.T + head.decoder.bias
    expected = plif_reference(logits, head.v, 3.0)
    torch.testing.assert_close(out.transformed_logits, expected)
    torch.testing.assert_close(out.log_probs, F.log_softmax(expected, -1))


def test_learnt_slopes_have_their_own_learning_rate():
    head = make("plif", PLIFOptions(knots=32, bound=3.0, lr=0.05, compile=False))
    assert isinstance(head.v, nn.Parameter)
    (group,) = head.extra_param_groups()
    assert group["lr"] == 0.05 and len(group["params"]) == 1 and group["params"][0] is head.v


def test_learnt_slopes_train():
    head = make("plif", PLIFOptions(knots=32, bound=3.0, compile=False))
    before = head.v.detach().clone()
    head(torch.randn(5, 2, 6)).log_probs[..., 0].sum().backward()
    assert head.v.grad is not None and head.v.grad.abs().sum() > 0
    torch.optim.SGD(head.parameters(), lr=1.0).step()
    assert not torch.equal(head.v, before)


def test_frozen_slopes_are_a_buffer_that_optimisers_never_change():
    head = make("plif_frozen", FrozenPLIFOptions(knots=32, bound=3.0, compile=False))
    assert "v" in dict(head.named_buffers()) and "v" not in dict(head.named_parameters())
    assert head.extra_param_groups() == []
    before = head.v.clone()
    optimizer = torch.optim.SGD(head.parameters(), lr=1.0, weight_decay=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        head(torch.randn(5, 2, 6)).log_probs[..., 0].sum().backward()
        optimizer.step()
    assert torch.equal(head.v, before)
    assert not torch.equal(head.decoder.bias, torch.zeros(50))   # the rest did train


def test_frozen_slopes_round_trip_through_state_dict():
    options = FrozenPLIFOptions(knots=32, bound=3.0, compile=False)
    trained, fresh = make("plif_frozen", options, seed=0), make("plif_frozen", options, seed=1)
    assert not torch.equal(trained.v, fresh.v)
    assert "v" in trained.state_dict()
    fresh.load_state_dict(trained.state_dict())
    assert torch.equal(fresh.v, trained.v)
    g = torch.randn(5, 2, 6)
    torch.testing.assert_close(fresh(g).log_probs, trained(g).log_probs)
