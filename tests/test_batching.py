"""batchify, get_batch and the variable-length BPTT sampler (docs/reference.md section 3)."""
from __future__ import annotations

import pytest
import torch

from data.batching import SequenceLengthSampler, batchify, get_batch


def test_batchify_makes_contiguous_columns_and_drops_the_tail():
    ids = torch.arange(23)
    data = batchify(ids, 4)
    assert data.shape == (5, 4)
    # column j is the j-th contiguous fifth of the stream
    assert data[:, 0].tolist() == [0, 1, 2, 3, 4]
    assert data[:, 3].tolist() == [15, 16, 17, 18, 19]


def test_batchify_rejects_a_stream_too_short():
    with pytest.raises(ValueError, match="too few"):
        batchify(torch.arange(5), 4)


def test_get_batch_targets_are_the_next_tokens_and_stop_at_the_end():
    data = batchify(torch.arange(40), 2)            # 20 x 2
    x, y = get_batch(data, 3, 5)
    assert x.shape == y.shape == (5, 2)
    assert torch.equal(y, data[4:9])
    x, y = get_batch(data, 16, 10)                  # only 3 inputs have a target left
    assert x.shape == (3, 2) and torch.equal(y[-1], data[19])


def test_sampler_lengths_follow_the_awd_recipe():
    sampler = SequenceLengthSampler(bptt=70, max_seq_len_delta=40, seed=0)
    lengths = torch.tensor([sampler.sample() for _ in range(20000)], dtype=torch.float64)
    assert lengths.min() >= 5 and lengths.max() <= 110
    short = lengths < 52                             # drawn around bptt / 2 = 35
    assert abs(short.double().mean().item() - 0.05) < 0.01
    assert abs(lengths[~short].mean().item() - 69.5) < 0.3   # int() truncates Normal(70, 5)
    assert abs(lengths[~short].std().item() - 5.0) < 0.3


def test_sampler_cap_and_floor():
    capped = SequenceLengthSampler(bptt=70, max_seq_len_delta=0, seed=0)
    assert max(capped.sample() for _ in range(2000)) == 70
    tiny = SequenceLengthSampler(bptt=4, max_seq_len_delta=40, seed=0)
    assert min(tiny.sample() for _ in range(2000)) == 5


def test_sampler_state_round_trip_continues_the_same_stream():
    a = SequenceLengthSampler(70, 40, seed=3)
    for _ in range(17):
        a.sample()
    state = a.state_dict()
    expected = [a.sample() for _ in range(50)]
    b = SequenceLengthSampler(70, 40, seed=999)
    b.load_state_dict(state)
    assert [b.sample() for _ in range(50)] == expected
