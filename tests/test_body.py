"""The AWD-LSTM body: weight drop, locked and embedding dropout, init, tying (docs/reference.md section 2)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from experiment.config import load_config
from model import build_model
import pytest

from experiment.config import ConfigError
from model.body import (AWDLSTMBody, WeightDropLSTM, embedding_dropout, embedding_noise, keep_mask,
                        locked_dropout)


def reference_lstm(layer: WeightDropLSTM, weight_hh: torch.Tensor) -> torch.nn.LSTM:
    """An nn.LSTM with layer's weights and the given hidden-to-hidden matrix."""
    ref = torch.nn.LSTM(layer.input_size, layer.hidden_size)
    with torch.no_grad():
        ref.weight_ih_l0.copy_(layer.weight_ih)
        ref.weight_hh_l0.copy_(weight_hh)
        ref.bias_ih_l0.copy_(layer.bias_ih)
        ref.bias_hh_l0.copy_(layer.bias_hh)
    return ref


def inputs(steps=6, batch=3, size=5, hidden=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(steps, batch, size, generator=g)
    state = (torch.randn(1, batch, hidden, generator=g), torch.randn(1, batch, hidden, generator=g))
    return x, state


class TestWeightDrop:
    def test_one_fresh_mask_per_training_forward_shared_by_all_time_steps(self):
        layer = WeightDropLSTM(5, 7, weight_drop=0.5).train()
        x, state = inputs()
        # The dropped matrix the forward will draw, recovered by replaying the RNG.
        torch.manual_seed(123)
        dropped = layer.dropped_weight_hh().detach()
        torch.manual_seed(123)
        out, (h, c) = layer(x, state)
        # An LSTM that uses that one matrix at every time step gives exactly the same result.
        ref_out, (ref_h, ref_c) = reference_lstm(layer, dropped)(x, state)
        torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-6)
        torch.testing.assert_close(c, ref_c, rtol=0, atol=1e-6)
        # The mask really dropped something, and the next forward draws another one.
        assert (dropped == 0).any()
        out2, _ = layer(x, state)
        assert not torch.equal(out, out2)

    def test_about_p_zeroed_and_the_rest_scaled(self):
        layer = WeightDropLSTM(50, 200, weight_drop=0.3).train()
        torch.manual_seed(0)
        dropped = layer.dropped_weight_hh().detach()
        zero = dropped == 0
        frac = zero.float().mean().item()
        n = dropped.numel()
        assert abs(frac - 0.3) < 4 * math.sqrt(0.3 * 0.7 / n)      # within 4 standard errors
        torch.testing.assert_close(dropped[~zero], layer.weight_hh.detach()[~zero] / 0.7)

    def test_eval_uses_the_raw_matrix_and_is_deterministic(self):
        layer = WeightDropLSTM(5, 7, weight_drop=0.5).eval()
        x, state = inputs()
        out1, _ = layer(x, state)
        out2, _ = layer(x, state)
        assert torch.equal(out1, out2)
        ref_out, _ = reference_lstm(layer, layer.weight_hh.detach())(x, state)
        torch.testing.assert_close(out1, ref_out, rtol=0, atol=1e-6)

    def test_gradients_reach_the_raw_weight_through_the_mask(self):
        layer = WeightDropLSTM(5, 7, weight_drop=0.5).train()
        x, state = inputs()
        torch.manual_seed(5)
        kept = layer.dropped_weight_hh().detach() != 0
        torch.manual_seed(5)
        out, _ = layer(x, state)
        out.pow(2).sum().backward()
        grad = layer.weight_hh.grad
        assert grad is not None and grad[kept].abs().sum() > 0
        assert torch.all(grad[~kept] == 0)        # dropped entries get no gradient
        for p in (layer.weight_ih, layer.bias_ih, layer.bias_hh):
            assert p.grad is not None and p.grad.abs().sum() > 0

    def test_weight_drop_zero_equals_plain_lstm_in_training(self):
        layer = WeightDropLSTM(5, 7, weight_drop=0.0).train()
        x, state = inputs()
        out, _ = layer(x, state)
        ref_out, _ = reference_lstm(layer, layer.weight_hh.detach())(x, state)
        torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-6)

    def test_raw_weights_are_ordinary_parameters(self):
        layer = WeightDropLSTM(5, 7, weight_drop=0.5)
        names = [name for name, _ in layer.named_parameters()]
        assert names == ["weight_ih", "weight_hh", "bias_ih", "bias_hh"]
        layer.train()(*inputs())
        assert [name for name, _ in layer.named_parameters()] == names   # nothing swapped at run time


def test_keep_mask_probability_and_scale():
    torch.manual_seed(0)
    mask = keep_mask((1000, 1000), 0.3, torch.empty(0))
    assert abs((mask == 0).float().mean().item() - 0.3) < 0.002
    kept = mask[mask != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 1 / 0.7))


class TestLockedDropout:
    def test_one_mask_per_sequence_shared_over_time(self):
        torch.manual_seed(0)
        x = torch.ones(30, 8, 100)
        y = locked_dropout(x, 0.4, training=True)
        assert torch.equal(y, y[:1].expand_as(y))                  # same mask at every step
        kept = y[y != 0]
        torch.testing.assert_close(kept, torch.full_like(kept, 1 / 0.6))
        frac = (y[0] == 0).float().mean().item()
        assert abs(frac - 0.4) < 0.07
        assert not torch.equal(y[0, 0], y[0, 1])                   # sequences differ

    def test_identity_in_eval_and_for_p_zero(self):
        x = torch.randn(4, 3, 5)
        assert torch.equal(locked_dropout(x, 0.5, training=False), x)
        assert torch.equal(locked_dropout(x, 0.0, training=True), x)


class TestEmbeddingDropout:
    def test_drops_whole_words_with_one_mask_per_call(self):
        torch.manual_seed(0)
        weight = torch.randn(50, 6)
        ids = torch.randint(0, 50, (40, 5))
        out = embedding_dropout(ids, weight, 0.5, training=True)
        dropped_words = set()
        for word in ids.unique().tolist():
            rows = out[ids == word]
            if torch.all(rows == 0):
                dropped_words.add(word)
            else:                                                 # kept everywhere, scaled
                torch.testing.assert_close(rows, (weight[word] / 0.5).expand_as(rows))
        assert 0 < len(dropped_words) < len(ids.unique())

    def test_same_maths_as_masking_the_matrix(self):
        weight = torch.randn(30, 4, requires_grad=True)
        ids = torch.randint(0, 30, (7, 3))
        torch.manual_seed(1)
        fast = embedding_dropout(ids, weight, 0.2, training=True)
        torch.manual_seed(1)
        mask = keep_mask((30, 1), 0.2, weight)
        slow = F.embedding(ids, weight * mask)
        torch.testing.assert_close(fast, slow)

    def test_identity_in_eval(self):
        weight = torch.randn(30, 4)
        ids = torch.randint(0, 30, (7, 3))
        assert torch.equal(embedding_dropout(ids, weight, 0.1, training=False), F.embedding(ids, weight))


class TestEmbeddingNoise:
    """[SB] SM 2.3: N(0, sigma^2) on every element of the embedding output, in training only,
    after embedding dropout and before the dropouti locked dropout."""

    SIGMA = 0.15

    def test_mean_variance_and_independence(self):
        torch.manual_seed(0)
        x = torch.full((200, 50, 100), 3.0)                       # 10^6 elements
        noise = (embedding_noise(x, self.SIGMA, training=True) - 3.0).double()
        n = noise.numel()
        # Fixed seed, so each check is one deterministic number; the tolerances are 6-7
        # standard errors of the estimate, so a wrong mean or scale (e.g. sigma^2 or sqrt(sigma)
        # as the std) fails by orders of magnitude more.
        assert abs(noise.mean().item()) < 6 * self.SIGMA / math.sqrt(n)
        assert abs(noise.var().item() / self.SIGMA ** 2 - 1) < 7 * math.sqrt(2 / n)
        within = (noise.abs() < self.SIGMA).double().mean().item()   # normal: P(|z| < 1) = 0.6827
        assert abs(within - 0.682689) < 6 * math.sqrt(0.6827 * 0.3173 / n)
        # Independent elements: no correlation across time steps, sequences or features
        # (a locked, i.e. shared, noise would give correlation 1).
        for a, b in ((noise[1:], noise[:-1]), (noise[:, 1:], noise[:, :-1]), (noise[..., 1:], noise[..., :-1])):
            r = torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1].item()
            assert abs(r) < 6 / math.sqrt(a.numel())

    def test_absent_in_eval_and_at_sigma_zero(self):
        x = torch.randn(4, 3, 5)
        assert embedding_noise(x, 0.3, training=False) is x
        assert embedding_noise(x, 0.0, training=True) is x
        torch.manual_seed(0)
        noisy, quiet = tiny_model(emb_noise=0.3), tiny_model()
        quiet.load_state_dict(noisy.state_dict())
        ids = torch.randint(0, 40, (6, 3))
        hidden = noisy.init_hidden(3)
        noisy.eval(), quiet.eval()
        assert torch.equal(noisy(ids, hidden).log_probs, quiet(ids, hidden).log_probs)

    def test_sigma_zero_is_the_body_without_noise_and_draws_nothing(self):
        # The body with emb_noise = 0 computes exactly the pipeline of the functions it is made
        # of, consuming the same random numbers: the later dropout masks are unchanged.
        torch.manual_seed(0)
        body = AWDLSTMBody(40, 8, 12, 8, 3, 0.4, 0.3, 0.4, 0.1, 0.5, emb_noise=0.0).train()
        ids = torch.randint(0, 40, (6, 3))
        hidden = body.init_hidden(3)
        torch.manual_seed(1)
        out = body(ids, hidden).output
        state_after = torch.get_rng_state()
        torch.manual_seed(1)
        x = locked_dropout(embedding_dropout(ids, body.encoder.weight, 0.1, True), 0.4, True)
        for layer, rnn in enumerate(body.rnns):
            x, _ = rnn(x, hidden[layer])
            x = locked_dropout(x, 0.4 if layer == 2 else 0.3, True)
        assert torch.equal(out, x)
        assert torch.equal(torch.get_rng_state(), state_after)

    def first_lstm_input(self, dropouti: float, dropoute: float):
        """(body, ids, the tensor its first LSTM receives: the embedding after all its regularisers)
        for a noisy body with only the given embedding dropouts; the forward ran from seed 3."""
        torch.manual_seed(0)
        body = AWDLSTMBody(40, 8, 12, 8, 3, 0, 0, dropouti, dropoute, 0, emb_noise=self.SIGMA).train()
        ids = torch.randint(0, 40, (20, 4))
        seen = []
        handle = body.rnns[0].register_forward_pre_hook(lambda module, args: seen.append(args[0]))
        torch.manual_seed(3)
        body(ids, body.init_hidden(ids.size(1)))
        handle.remove()
        return body, ids, seen[0]

    def test_after_embedding_dropout_dropped_words_get_pure_noise(self):
        body, ids, x = self.first_lstm_input(dropouti=0, dropoute=0.5)
        torch.manual_seed(3)                 # replay: word mask first, then the noise
        dropped = embedding_dropout(ids, body.encoder.weight, 0.5, True)
        noise = torch.randn_like(dropped) * self.SIGMA
        torch.testing.assert_close(x, dropped + noise, rtol=0, atol=1e-7)
        gone = (dropped == 0).all(-1)         # positions of dropped words
        assert gone.any() and (~gone).any()
        torch.testing.assert_close(x[gone], noise[gone], rtol=0, atol=0)
        assert (x[gone] != 0).all()

    def test_before_dropouti_so_the_locked_mask_zeroes_noise_too(self):
        body, ids, x = self.first_lstm_input(dropouti=0.5, dropoute=0)
        torch.manual_seed(3)                 # replay: noise first, then the locked mask
        emb = F.embedding(ids, body.encoder.weight)
        noise = torch.randn_like(emb) * self.SIGMA
        mask = keep_mask((1, 4, 8), 0.5, emb)
        torch.testing.assert_close(x, (emb + noise) * mask, rtol=0, atol=1e-7)
        # A (sequence, feature) dropped by dropouti is exactly zero at every time step: noise
        # added after the locked dropout would leave it non-zero.
        dropped = (mask[0] == 0)
        assert dropped.any() and torch.all(x[:, dropped] == 0)
        assert torch.all(x[:, ~dropped] != 0)

    def test_config_key(self):
        assert load_config("configs/ptb/softmax.yaml").model.emb_noise == 0.0
        model = tiny_model(emb_noise=0.1)
        assert model.body.emb_noise == 0.1
        for bad in ("-0.1", ".inf", "abc"):
            with pytest.raises(ConfigError, match="model.emb_noise"):
                tiny_model(emb_noise=bad)


def tiny_model(**model_overrides):
    overrides = ["model.emsize=8", "model.nhid=12", "model.nhidlast=8"]
    overrides += [f"model.{k}={v}" for k, v in model_overrides.items()]
    return build_model(load_config("configs/ptb/softmax.yaml", overrides), vocab_size=40)


class TestModel:
    def test_init_and_tying(self):
        torch.manual_seed(0)
        model = tiny_model()
        emb = model.body.encoder.weight
        assert emb.abs().max() <= 0.1
        assert model.head.decoder.weight is emb
        assert torch.all(model.head.decoder.bias == 0)
        for rnn in model.body.rnns:
            bound = 1 / math.sqrt(rnn.hidden_size)
            assert all(p.abs().max() <= bound for p in rnn.parameters())

    def test_layer_sizes(self):
        model = tiny_model()
        sizes = [(r.input_size, r.hidden_size) for r in model.body.rnns]
        assert sizes == [(8, 12), (12, 12), (12, 8)]

    def test_dropouts_active_in_training_and_off_in_eval(self):
        torch.manual_seed(0)
        model = tiny_model()
        ids = torch.randint(0, 40, (6, 3))
        hidden = model.init_hidden(3)
        model.train()
        a, b = model(ids, hidden).log_probs, model(ids, hidden).log_probs
        assert not torch.equal(a, b)
        model.eval()
        a, b = model(ids, hidden).log_probs, model(ids, hidden).log_probs
        assert torch.equal(a, b)

    def test_weight_drop_is_the_only_dropout_left(self):
        # With every other dropout at 0, training outputs still vary: the weight drop works
        # inside the full model (the failure mode of broken WeightDrop ports).
        torch.manual_seed(0)
        model = tiny_model(dropout=0, dropouth=0, dropouti=0, dropoute=0, wdrop=0.5).train()
        ids = torch.randint(0, 40, (6, 3))
        hidden = model.init_hidden(3)
        assert not torch.equal(model(ids, hidden).log_probs, model(ids, hidden).log_probs)
        model = tiny_model(dropout=0, dropouth=0, dropouti=0, dropoute=0, wdrop=0).train()
        assert torch.equal(model(ids, hidden).log_probs, model(ids, hidden).log_probs)

    def test_outputs_for_regularisers(self):
        torch.manual_seed(0)
        model = tiny_model(dropout=0.5).train()
        out = model(torch.randint(0, 40, (6, 3)), model.init_hidden(3))
        assert out.dropped_output.shape == out.last_raw_output.shape == (6, 3, 8)
        zeroed = out.dropped_output == 0
        assert zeroed.any() and not (out.last_raw_output == 0).any()
        torch.testing.assert_close(out.dropped_output[~zeroed], out.last_raw_output[~zeroed] / 0.5)
        assert len(out.hidden) == 3 and out.hidden[2][0].shape == (1, 3, 8)
        torch.testing.assert_close(out.log_probs.exp().sum(-1), torch.ones(6, 3))


def test_body_runs_in_float64():
    body = AWDLSTMBody(20, 4, 6, 4, 3, 0.1, 0.1, 0.1, 0.1, 0.5).double()
    out = body(torch.randint(0, 20, (3, 2)), [(h.double(), c.double()) for h, c in body.init_hidden(2)])
    assert out.output.dtype == torch.float64
