"""Mixtape's own properties (the registry-derived tests of tests/test_heads.py and the others
cover it as every head): the sigmoid tree, gate sharing, the frequent / infrequent split against
the word-by-word formula with a vocabulary order that is not the ids', K = 1, the options."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from model.heads.mixtape import MixtapeHead, MixtapeOptions
from model.kernels.mixtape import narrow_linear, sigmoid_tree

V, E, NHIDLAST, T, B = 17, 6, 5, 4, 3


def make_mixtape(options=None, dtype=torch.float64, counts_seed: int | None = 11) -> MixtapeHead:
    torch.manual_seed(0)
    if options is not None and options.compile:
        options = dataclasses.replace(options, compile=False)   # the eager kernels (compiled: test_heads.py)
    embedding = nn.Parameter(torch.empty(V, E).uniform_(-0.5, 0.5))
    head = MixtapeHead(options or MixtapeHead.small_options(), V, E, NHIDLAST, embedding)
    with torch.no_grad():
        head.decoder.bias.uniform_(-0.3, 0.3)
        if hasattr(head, "gate_bias"):
            head.gate_bias.uniform_(-0.5, 0.5)    # b_xj starts at 0; make it count
    if counts_seed is not None:             # frequencies whose order is not the ids'
        head.set_word_counts(torch.randint(0, 5, (V,), generator=torch.Generator().manual_seed(counts_seed)))
    return head.to(dtype)


def g_of(dtype=torch.float64, seed: int = 1, scale: float = 2.0) -> torch.Tensor:
    return torch.randn(T, B, NHIDLAST, generator=torch.Generator().manual_seed(seed), dtype=dtype) * scale


def test_sigmoid_tree_of_four_leaves_is_the_papers_formula():
    logits = torch.randn(2, 3, 5, dtype=torch.float64)
    s1, s2, s3 = torch.sigmoid(logits).unbind(-2)
    expected = torch.stack([s1 * s2, s1 * (1 - s2), (1 - s1) * s3, (1 - s1) * (1 - s3)], dim=-2)
    torch.testing.assert_close(sigmoid_tree(logits), expected)


@pytest.mark.parametrize("k", [1, 2, 8, 16])
def test_sigmoid_tree_leaves_are_a_distribution(k):
    priors = sigmoid_tree(torch.randn(7, k - 1, 4, dtype=torch.float64) * 3)
    assert priors.shape == (7, k, 4) and (priors >= 0).all()
    torch.testing.assert_close(priors.sum(-2), torch.ones(7, 4, dtype=torch.float64))


def test_sigmoid_tree_of_eight_leaves_follows_the_heap_order():
    # leaf 6 (0-based, binary 110): right at node 1, right at node 3, left at node 7
    logits = torch.randn(7, 1, dtype=torch.float64)
    s = torch.sigmoid(logits[:, 0])
    torch.testing.assert_close(sigmoid_tree(logits)[6, 0], (1 - s[0]) * (1 - s[2]) * s[6])


@pytest.mark.parametrize("needs", [(True, True), (True, False), (False, True)])
def test_narrow_linear_is_f_linear_with_its_gradients(needs):
    torch.manual_seed(3)
    inputs = torch.randn(5, 4, 3, 8, dtype=torch.float64, requires_grad=needs[0])
    weight = torch.randn(30, 8, dtype=torch.float64, requires_grad=needs[1])
    assert torch.equal(narrow_linear(inputs, weight), torch.nn.functional.linear(inputs, weight))
    assert torch.autograd.gradcheck(narrow_linear, (inputs, weight))


def test_word_counts_order_the_vocabulary_most_frequent_first_ties_by_id():
    head = make_mixtape(MixtapeOptions(frequent_fraction=0.25, gate_dim=2), counts_seed=None)
    counts = torch.tensor([3, 9, 0, 9, 1, 5, 5, 2, 0, 7, 1, 1, 4, 6, 0, 8, 2])
    head.set_word_counts(counts)
    assert head.frequent == 4                       # round(0.25 * 17)
    assert head.order[:6].tolist() == [1, 3, 15, 9, 13, 5]
    assert torch.equal(head.order[head.place], torch.arange(V))


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_the_split_computes_the_word_by_word_formula_with_gradients(mode):
    """forward() and target_log_probs() against `reference` (every word's K gated logits), all
    three dropouts on in training (the same masks), the frequent words not the first ids."""
    head = make_mixtape().train(mode == "train")
    assert head.order[:head.frequent].tolist() != list(range(head.frequent))
    g = g_of().requires_grad_()
    targets = torch.randint(V, (T, B), generator=torch.Generator().manual_seed(2))
    params = [g, *head.parameters()]
    weights = torch.rand(T, B, V, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    results = []
    for fn in (head.forward, head.reference):
        torch.manual_seed(7)
        log_p = fn(g).log_probs
        results.append((log_p, torch.autograd.grad((log_p * weights).sum(), params)))
    (fast, fast_grads), (plain, plain_grads) = results
    torch.testing.assert_close(fast, plain)
    for a, b in zip(fast_grads, plain_grads):
        torch.testing.assert_close(a, b)
    torch.manual_seed(7)
    target = head.target_log_probs(g, targets)
    target_grads = torch.autograd.grad((target * weights[..., 0]).sum(), params)
    torch.manual_seed(7)
    gathered = head.reference(g).log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    gathered_grads = torch.autograd.grad((gathered * weights[..., 0]).sum(), params)
    torch.testing.assert_close(target, gathered)
    for a, b in zip(target_grads, gathered_grads):
        torch.testing.assert_close(a, b)


def test_with_one_component_it_is_a_softmax_over_a_tanh_projection():
    head = make_mixtape(MixtapeOptions(components=1, frequent_fraction=1 / V, dropoutl=0.0)).eval()
    assert head.frequent == 1 and not hasattr(head, "gate_embedding")
    g = g_of()
    projected = torch.tanh(head.contexts(g))
    expected = F.log_softmax(head.decoder(projected), dim=-1)
    torch.testing.assert_close(head(g).log_probs, expected)
    torch.testing.assert_close(head.reference(g).log_probs, expected)


def test_infrequent_words_share_their_priors_and_frequent_words_have_their_own():
    head = make_mixtape(MixtapeOptions(frequent_fraction=0.3, gate_dim=3, dropoutl=0.0)).eval()
    with torch.no_grad():
        priors = head.priors(g_of())                       # (T, B, K, V)
    frequent, infrequent = head.order[:head.frequent], head.order[head.frequent:]
    a, b = infrequent[:2].tolist()
    torch.testing.assert_close(priors[..., a], priors[..., b], rtol=0, atol=0)
    c, d = frequent[:2].tolist()
    assert (priors[..., c] - priors[..., d]).abs().amax(-1).min() > 1e-6   # differ at every position
    # the shared priors are the tree of u_j . g alone
    torch.testing.assert_close(priors[..., a], sigmoid_tree(head.shared_gates(g_of()).unsqueeze(-1)).squeeze(-1))


def test_with_every_word_frequent_no_prior_is_shared():
    head = make_mixtape(MixtapeOptions(frequent_fraction=1.0, gate_dim=3, dropoutl=0.0)).eval()
    assert head.frequent == V
    g = g_of()
    torch.testing.assert_close(head(g).log_probs, head.reference(g).log_probs)


def test_with_no_frequent_word_it_is_moc_with_sigmoid_tree_priors():
    head = make_mixtape(MixtapeOptions(frequent_fraction=0.0, dropoutl=0.0)).eval()
    assert head.frequent == 0 and not hasattr(head, "gate_embedding")
    g = g_of()
    contexts = torch.tanh(head.contexts(g)).view(T, B, 4, E)
    priors = sigmoid_tree(head.shared_gates(g).unsqueeze(-1))           # (T, B, K, 1)
    expected = F.log_softmax(head.decoder((priors * contexts).sum(-2)), dim=-1)
    torch.testing.assert_close(head(g).log_probs, expected)


@pytest.mark.parametrize("option", ["dropoutl", "dropout_gates", "dropout_logits"])
def test_each_dropout_acts_in_training_only_with_one_mask_per_sequence(option):
    options = MixtapeOptions(gate_dim=3, frequent_fraction=0.4, **{"dropoutl": 0.0, option: 0.5})
    head = make_mixtape(options)
    g = g_of()[:1].expand(T, B, NHIDLAST)             # the same input at every position
    head.train()
    torch.manual_seed(0)
    dropped = head(g).log_probs
    # one mask per sequence: every position of a sequence gives the same output ...
    torch.testing.assert_close(dropped, dropped[:1].expand_as(dropped))
    # ... and the masks differ between sequences, and from evaluation
    assert not torch.allclose(dropped[0, 0], dropped[0, 1])
    head.eval()
    assert torch.equal(head(g).log_probs, head(g).log_probs)
    assert not torch.allclose(head(g).log_probs, dropped)


@pytest.mark.parametrize("kwargs, field", [
    ({"components": 3}, "components"), ({"components": 0}, "components"),
    ({"gate_dim": 0}, "gate_dim"), ({"frequent_fraction": 1.5}, "frequent_fraction"),
    ({"frequent_fraction": -0.1}, "frequent_fraction"), ({"dropoutl": 1.0}, "dropoutl"),
    ({"dropout_gates": -0.5}, "dropout_gates"), ({"dropout_logits": 1.0}, "dropout_logits"),
])
def test_impossible_options_are_rejected_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}: "):
        MixtapeOptions(**kwargs)


def test_default_options_are_the_papers_k_and_share_with_mos_dropoutl():
    assert MixtapeOptions() == MixtapeOptions(components=4, gate_dim=64, frequent_fraction=0.1, dropoutl=0.29,
                                              dropout_gates=0.0, dropout_logits=0.0, compile=True)


def test_a_new_run_gives_its_own_gates_to_the_most_frequent_training_words(ptb_slice, tmp_path):
    """train.py builds the head with the training split's counts and the split is saved with
    the model: best.pt's `order` puts the training set's most frequent words first."""
    import train
    from data import load_corpus
    from tests.conftest import TINY
    run_dir = tmp_path / "mixtape"
    assert train.main(["configs/ptb_mini/mixtape.yaml", f"data.data_dir={ptb_slice}", *TINY, "train.epochs=1",
                       f"run.dir={run_dir}"]) == 0
    corpus = load_corpus("ptb", ptb_slice, allow_modified=True)
    counts = torch.bincount(corpus.train, minlength=corpus.vocab_size)
    state = torch.load(run_dir / "best.pt", weights_only=True)["model"]
    order, frequent = state["head.order"], round(0.1 * corpus.vocab_size)
    assert counts[order[:frequent]].min() >= counts[order[frequent:]].max()
    assert counts[order].tolist() == sorted(counts.tolist(), reverse=True)
    assert order[:5].tolist() != list(range(5))     # not the id order: the test sees the difference


@pytest.mark.parametrize("fraction, expected_rank", [(0.3, E + 2 + 5), (1.0, V)])
def test_gate_sharing_bounds_the_rank_of_the_log_probabilities_by_d_plus_2_plus_the_frequent_words(
        fraction, expected_rank):
    # An infrequent word's logit is w_x . sum_k pi_k h_k + b_x with priors pi shared by all of
    # them: those columns lie in the span of the mixed context's E coordinates and the ones
    # vector, and the log-softmax's normaliser adds one more, so the log-probability matrix has
    # rank at most E + 2 + F (the converged Mixtape's spectrum drops after index E + 2 + F =
    # 1,034, docs/results_cpu.md); with every word frequent the bound is gone (rank V here).
    head = make_mixtape(MixtapeOptions(frequent_fraction=fraction, gate_dim=3, dropoutl=0.0)).eval()
    assert head.frequent == round(fraction * V)
    g = torch.randn(60, 4, NHIDLAST, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 2
    with torch.no_grad():
        log_probs = head(g).log_probs.reshape(-1, V)
    assert torch.linalg.matrix_rank(log_probs).item() == expected_rank
