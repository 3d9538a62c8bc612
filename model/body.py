"""The AWD-LSTM body ([AWD], docs/reference.md section 2): everything between word ids and the head.

    ids -> embedding (with embedding dropout) [-> + N(0, sigma^2) noise] -> locked dropout (dropouti)
        -> LSTM 1 -> locked dropout (dropouth) -> LSTM 2 -> locked dropout (dropouth)
        -> LSTM 3 -> locked dropout (dropout) -> g, handed to the output head

Each LSTM's hidden-to-hidden matrix is weight-dropped (DropConnect, wdrop). The embedding
noise (emb_noise, [SB] SM 2.3) is off unless configured: only [SB] Table 5 uses it.

A training forward draws all its random numbers first (`draw_masks`, in the order the
computation uses them) and then computes with them: the masks are one value that
model/group.py can draw for each run of a group and apply to all of them in one batched pass.
"""
from __future__ import annotations

import math
import warnings
from typing import NamedTuple, Optional

import torch
from torch import nn
import torch.nn.functional as F

from .random_stream import generator_for

# On CUDA, cuDNN wants all of an LSTM's weights in one contiguous buffer. A weight-dropped
# matrix is a fresh tensor every forward, so cuDNN copies the four weights into a buffer of
# its own each call (a copy of a few MB, negligible next to the recurrence) and warns once
# per call site. The copy is the intended behaviour here, so the warning carries no news.
warnings.filterwarnings("ignore", message="RNN module weights are not part of single contiguous chunk")


def keep_mask(shape, p: float, like: torch.Tensor) -> torch.Tensor:
    """A Bernoulli(1 - p) mask of `shape`, scaled by 1/(1-p), in like's dtype and device.

    Drawn as uniform >= p: on CPU this is several times faster than bernoulli_ (which
    F.dropout uses), and the weight drop draws millions of entries every step. From the current
    run's stream (model/random_stream.py): the global generator unless a group's member computes.
    """
    return kept(uniform(shape, like), p)


def uniform(shape, like: torch.Tensor) -> torch.Tensor:
    """U[0, 1) numbers of `shape` in like's dtype and device, from the current run's stream."""
    return torch.rand(shape, dtype=like.dtype, device=like.device, generator=generator_for(like.device))


def kept(uniforms: torch.Tensor, p: float) -> torch.Tensor:
    """The keep mask that `uniforms` give at drop rate p: 1/(1-p) where >= p, else 0 (computed in
    place: the uniforms become the mask)."""
    return uniforms.ge_(p).mul_(1.0 / (1.0 - p))


def embedding_dropout(ids: torch.Tensor, weight: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Look up ids in `weight`, dropping whole words (rows) with probability p.

    One mask over the vocabulary per call; kept rows are scaled by 1/(1-p). Gathering the
    rows first and then scaling each by its word's mask entry is the same maths as masking
    the whole V x d matrix, at the cost of the batch rather than of the vocabulary.
    """
    return masked_embedding(ids, weight, word_mask(weight, p) if training and p else None)


def word_mask(weight: torch.Tensor, p: float) -> torch.Tensor:
    """Embedding dropout's mask: one entry per word of the vocabulary (V, 1)."""
    return keep_mask(word_mask_shape(weight), p, weight)


def word_mask_shape(weight: torch.Tensor) -> tuple[int, int]:
    return weight.size(0), 1


def masked_embedding(ids: torch.Tensor, weight: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    emb = F.embedding(ids, weight)
    return emb if mask is None else emb * F.embedding(ids, mask)


def embedding_noise(x: torch.Tensor, sigma: float, training: bool) -> torch.Tensor:
    """Add independent N(0, sigma^2) noise to every element of x, in training only ([SB] SM 2.3).

    Applied to the output of embedding dropout, so a dropped word's vector becomes pure noise:
    the [SB] authors' code (after Wang et al. 2019) adds the noise to what its embedded_dropout
    returns. With sigma = 0 or in eval, x is returned and no random number is drawn, so the
    random stream (and every later dropout mask) is that of a body without the option.
    """
    if not training or sigma == 0:
        return x
    return x + normal(x.shape, x).mul_(sigma)


def normal(shape, like: torch.Tensor) -> torch.Tensor:
    """N(0, 1) numbers of `shape` in like's dtype and device, from the current run's stream."""
    return torch.randn(shape, dtype=like.dtype, device=like.device, generator=generator_for(like.device))


def locked_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Variational dropout on x (T, B, H): one mask per sequence, shared by all time steps."""
    if not training or p == 0:
        return x
    return x * keep_mask((1, x.size(1), x.size(2)), p, x)


class WeightDropLSTM(nn.Module):
    """A single-layer LSTM whose hidden-to-hidden matrix is weight-dropped (DropConnect).

    The module owns its four weights as ordinary Parameters and calls the same fused LSTM
    kernel that nn.LSTM calls (`torch.lstm`: cuDNN on CUDA, the native kernel on CPU) with
    the dropped matrix in place of the raw one. Nothing is deleted, re-registered or patched
    at run time, so the drop cannot silently stop working when PyTorch changes nn.LSTM's
    internals (the failure of the original WeightDrop wrapper in PyTorch 1.0 and 1.4).

    In training, every forward draws a fresh mask over weight_hh: the same dropped matrix
    is used at every time step, kept entries are scaled by 1/(1-p), and gradients flow to
    the raw weight through the mask. In eval the raw matrix is used.
    """

    def __init__(self, input_size: int, hidden_size: int, weight_drop: float):
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.weight_drop = weight_drop
        gates = 4 * hidden_size
        self.weight_ih = nn.Parameter(torch.empty(gates, input_size))
        self.weight_hh = nn.Parameter(torch.empty(gates, hidden_size))
        self.bias_ih = nn.Parameter(torch.empty(gates))
        self.bias_hh = nn.Parameter(torch.empty(gates))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # nn.LSTM's init, which AWD-LSTM keeps: U(-1/sqrt(H), 1/sqrt(H)) for every weight.
        bound = 1.0 / math.sqrt(self.hidden_size)
        for weight in self.parameters():
            nn.init.uniform_(weight, -bound, bound)

    def weight_drop_mask(self) -> torch.Tensor | None:
        """A fresh DropConnect mask over weight_hh (None: nothing dropped, in eval or at p = 0)."""
        if not self.training or self.weight_drop == 0:
            return None
        return keep_mask(self.weight_hh.shape, self.weight_drop, self.weight_hh)

    def masked_weight_hh(self, mask: torch.Tensor | None) -> torch.Tensor:
        return self.weight_hh if mask is None else self.weight_hh * mask

    def dropped_weight_hh(self) -> torch.Tensor:
        """weight_hh with a fresh mask applied (the raw matrix in eval or at p = 0)."""
        return self.masked_weight_hh(self.weight_drop_mask())

    def forward(self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor],
                weight_hh: torch.Tensor | None = None):
        """x (T, B, input_size); state (h, c), each (1, B, hidden_size); `weight_hh` the (dropped)
        hidden-to-hidden matrix to use (default: a freshly dropped one)."""
        weight_hh = self.dropped_weight_hh() if weight_hh is None else weight_hh
        weights = [self.weight_ih, weight_hh, self.bias_ih, self.bias_hh]
        # The kernel's `train` flag only picks cuDNN's training path (a one-layer LSTM has no
        # dropout inside the kernel): a gradient through cuDNN needs it, also in eval mode
        # (dynamic evaluation), while training and no-grad evaluation run as always.
        kernel_train = self.training or torch.is_grad_enabled()
        output, h, c = torch.lstm(x, state, weights, True, 1, 0.0, kernel_train, False, False)
        return output, (h, c)

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}, weight_drop={self.weight_drop}"


class BodyMasks(NamedTuple):
    """A training forward's masks (None where nothing is dropped)."""
    words: Optional[torch.Tensor]          # embedding dropout, (V, 1)
    noise: Optional[torch.Tensor]          # embedding noise, (T, B, emsize), sigma-scaled
    inputs: Optional[torch.Tensor]         # dropouti, (1, B, emsize)
    weight_hh: list                        # per layer: weight drop, (4 H, H)
    outputs: list                          # per layer: dropouth (dropout after the last), (1, B, H)


class BodyRandom(NamedTuple):
    """A training forward's random numbers as drawn, in BodyMasks' fields and shapes (None where
    nothing is dropped): U[0, 1) for each dropout, N(0, 1) for the noise. `rates` gives each
    field's drop rate (the noise's sigma); `masks` turns them into the masks (in place). A group
    run stacks its members' draws and makes all their masks at once (model/group.py)."""
    words: Optional[torch.Tensor]
    noise: Optional[torch.Tensor]
    inputs: Optional[torch.Tensor]
    weight_hh: list
    outputs: list

    def masks(self, rates: "BodyMasks") -> BodyMasks:
        def mask(draw, p):
            return None if draw is None else kept(draw, p)
        return BodyMasks(mask(self.words, rates.words),
                         None if self.noise is None else self.noise.mul_(rates.noise),
                         mask(self.inputs, rates.inputs),
                         [mask(d, p) for d, p in zip(self.weight_hh, rates.weight_hh)],
                         [mask(d, p) for d, p in zip(self.outputs, rates.outputs)])


class BodyOutput(NamedTuple):
    output: torch.Tensor               # g: last layer's output after locked dropout (T, B, nhidlast)
    hidden: list                       # new (h, c) per layer, to carry to the next chunk
    last_raw_output: torch.Tensor      # last layer's output before dropout, for TAR


class AWDLSTMBody(nn.Module):
    def __init__(self, vocab_size: int, emsize: int, nhid: int, nhidlast: int, nlayers: int,
                 dropout: float, dropouth: float, dropouti: float, dropoute: float, wdrop: float,
                 emb_noise: float = 0.0):
        super().__init__()
        self.encoder = nn.Embedding(vocab_size, emsize)
        sizes = [emsize] + [nhid] * (nlayers - 1) + [nhidlast]
        self.rnns = nn.ModuleList(
            WeightDropLSTM(sizes[i], sizes[i + 1], wdrop) for i in range(nlayers))
        self.dropout, self.dropouth, self.dropouti, self.dropoute = dropout, dropouth, dropouti, dropoute
        self.emb_noise = emb_noise
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)

    def init_hidden(self, batch_size: int) -> list:
        weight = self.encoder.weight
        return [(weight.new_zeros(1, batch_size, rnn.hidden_size),
                 weight.new_zeros(1, batch_size, rnn.hidden_size)) for rnn in self.rnns]

    def output_dropouts(self) -> list[float]:
        """The locked dropout rate after each LSTM layer."""
        return [self.dropouth] * (len(self.rnns) - 1) + [self.dropout]

    def rates(self) -> BodyMasks:
        """Each mask's drop rate, in BodyMasks' fields (the noise's: its sigma)."""
        return BodyMasks(self.dropoute, self.emb_noise, self.dropouti,
                         [rnn.weight_drop for rnn in self.rnns], self.output_dropouts())

    def draw_random(self, steps: int, batch: int) -> BodyRandom:
        """The random numbers of a training forward over (steps, batch) ids, drawn in the order the
        computation uses them (as each regulariser would draw its own): word mask, noise,
        dropouti, then each layer's weight drop and output dropout. None where a rate is 0."""
        rates, weight = self.rates(), self.encoder.weight
        emsize = weight.size(1)

        def draw(p, shape):
            return uniform(shape, weight) if p else None
        words = draw(rates.words, word_mask_shape(weight))
        noise = normal((steps, batch, emsize), weight) if rates.noise else None
        inputs = draw(rates.inputs, (1, batch, emsize))
        weight_hh, outputs = [], []
        for rnn, p_weights, p_outputs in zip(self.rnns, rates.weight_hh, rates.outputs):
            weight_hh.append(draw(p_weights, rnn.weight_hh.shape))
            outputs.append(draw(p_outputs, (1, batch, rnn.hidden_size)))
        return BodyRandom(words, noise, inputs, weight_hh, outputs)

    def draw_masks(self, steps: int, batch: int) -> BodyMasks:
        """The masks of a training forward (none in eval)."""
        if not self.training:
            return BodyMasks(None, None, None, [None] * len(self.rnns), [None] * len(self.rnns))
        return self.draw_random(steps, batch).masks(self.rates())

    def embed(self, ids: torch.Tensor, masks: BodyMasks) -> torch.Tensor:
        """The first LSTM's input: the embedding with its dropout, noise and dropouti."""
        x = masked_embedding(ids, self.encoder.weight, masks.words)
        x = x if masks.noise is None else x + masks.noise
        return x if masks.inputs is None else x * masks.inputs

    def forward(self, ids: torch.Tensor, hidden: list, masks: BodyMasks | None = None) -> BodyOutput:
        masks = self.draw_masks(*ids.shape) if masks is None else masks
        x = self.embed(ids, masks)
        new_hidden = []
        for layer, rnn in enumerate(self.rnns):
            raw, state = rnn(x, hidden[layer], rnn.masked_weight_hh(masks.weight_hh[layer]))
            new_hidden.append(state)
            x = raw if masks.outputs[layer] is None else raw * masks.outputs[layer]
        return BodyOutput(x, new_hidden, raw)
