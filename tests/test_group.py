"""Group runs (train.py --group, experiment/group.py): several runs trained in lockstep by one
process, each equal to its solo run.

In float64 on the CPU. The batched step (--group-step batched: the bodies in one pass, the GPU's
path) is forced here, so its maths is checked where no GPU is; it sums in another order than
torch.lstm, so its runs equal the solo runs to rounding (1e-10 after a few epochs). The solo
step (each run's own kernels, the CPU's default) is the solo run bit for bit.

MoS trains here at lr 5: at lr 20 this tiny MoS is chaotic (a 1e-15 change of one weight grows
to 1e-4 within 100 steps of its solo run), which would amplify any reordering of sums, not a
difference of maths; at lr 5 the same change stays at 1e-15.
"""
from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import train
from conftest import TINY, disk_full
from model.body import AWDLSTMBody
from model.group import alive_steps, grouped_forward, grouped_lstm_reference
from model.kernels.grouped_lstm import grouped_lstm_recurrence
from model.random_stream import RandomStream

MINI = "configs/ptb_mini"


@pytest.fixture
def float64():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


@pytest.fixture
def tiny_models():
    """Tiny training-mode models of the given heads over a vocabulary of 50 (float32)."""
    from experiment.config import load_config
    from model import build_model

    def build(heads):
        models = []
        for seed, head in enumerate(heads):
            torch.manual_seed(seed)
            config = load_config(f"{MINI}/{head}.yaml", [*TINY, "head.compile=false"] if head != "softmax" else TINY)
            models.append(build_model(config, 50).train())
        return models
    return build


@pytest.fixture
def tiny(small_data) -> list[str]:
    return [f"data.data_dir={small_data}", *TINY, "run.log_interval=1000"]


def member(head: str, seed: int, run_dir: Path, *overrides: str) -> list[str]:
    extra = ["head.compile=false", "train.lr=5"] if head == "mos" else []
    return [f"{MINI}/{head}.yaml", f"train.seed={seed}", f"run.dir={run_dir}", *extra, *overrides]


def group(*members: list[str], step: str = "batched") -> list[str]:
    return ["--group", *[shlex.join(m) for m in members], "--group-step", step]


def last(run_dir: Path) -> dict:
    return torch.load(run_dir / "last.pt", weights_only=True)


def assert_same_run(a: Path, b: Path, tolerance: float) -> None:
    """Two run directories hold the same training: weights, ASGD averages, validation losses,
    the epoch averaging started and where (and whether) training ended."""
    x, y = last(a), last(b)
    for key in x["model"]:
        torch.testing.assert_close(x["model"][key], y["model"][key], rtol=0, atol=tolerance, msg=key)
    sx, sy = x["optimizer"]["state"]["state"], y["optimizer"]["state"]["state"]
    assert x["optimizer"]["averaged"] == y["optimizer"]["averaged"]
    assert sx.keys() == sy.keys()
    for index in sx:
        for key, value in sx[index].items():
            if torch.is_tensor(value):
                torch.testing.assert_close(value, sy[index][key], rtol=0, atol=tolerance, msg=f"{index}.{key}")
            else:
                assert value == pytest.approx(sy[index][key], abs=tolerance)
    px, py = x["progress"], y["progress"]
    for key in ("epoch", "step", "position", "asgd_start_epoch", "finished"):
        assert px[key] == py[key], key
    assert px["val_history"] == pytest.approx(py["val_history"], abs=tolerance, rel=0)
    metrics = [[json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()] for d in (a, b)]
    assert [(r["epoch"], r["optimizer"], r.get("switched_to_asgd"), r.get("early_stop")) for r in metrics[0]] == \
           [(r["epoch"], r["optimizer"], r.get("switched_to_asgd"), r.get("early_stop")) for r in metrics[1]]


# ---------------------------------------------------------------------- the batched body
@pytest.mark.parametrize("product", ["batched", "per_member", "gate_split", "streams"])  # streams: per_member off CUDA
@pytest.mark.parametrize("lengths", [(7, 7, 7), (7, 4, 6)])
def test_the_grouped_lstm_kernel_is_its_reference_maths(float64, lengths, product, monkeypatch):
    from model.kernels import grouped_lstm
    assert product in grouped_lstm.PRODUCT_WAYS
    monkeypatch.setattr(grouped_lstm, "PRODUCT", product)
    torch.manual_seed(0)
    g, t, b, h = 3, 7, 4, 5
    inputs = [torch.randn(g, t, b, 4 * h), torch.randn(g, b, h), torch.randn(g, b, h), torch.randn(g, 4 * h, h)]
    inputs = [x.requires_grad_() for x in inputs]
    alive = alive_steps(list(lengths), "cpu")
    assert (alive is None) == (len(set(lengths)) == 1)
    reference = grouped_lstm_reference(*inputs, alive)
    kernel = grouped_lstm_recurrence(*inputs, alive)
    weights = [torch.randn_like(x) for x in reference]       # a loss through every output
    grads = [torch.autograd.grad(sum((w * x).sum() for w, x in zip(weights, out)), inputs)
             for out in (reference, kernel)]
    for x, y in zip(reference, kernel):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-14)
    for x, y in zip(*grads):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-13)
    assert torch.autograd.gradcheck(lambda *x: grouped_lstm_recurrence(*x, alive), inputs)
    # A member past its end keeps its state: the final state is the one at its own length.
    for member, n in enumerate(lengths):
        torch.testing.assert_close(reference[1][member], reference[0][member, n - 1])


def test_the_default_product_is_chosen_by_the_layers_size(float64, monkeypatch):
    """PRODUCT "by_shape": gate_split from GATE_SPLIT_FROM hidden units up (PTB's layers, 1150 and
    400), batched below (the miniature's, 256 and 32), the same way every call; a way named in
    PRODUCT holds for every size. A layer of 400 takes gate_split and equals the reference."""
    from model.kernels import grouped_lstm
    assert grouped_lstm.PRODUCT == "by_shape" and grouped_lstm.GATE_SPLIT_FROM == 400
    assert [grouped_lstm.product_for(h) for h in (32, 256, 399, 400, 1150)] == \
        ["batched", "batched", "batched", "gate_split", "gate_split"]
    monkeypatch.setattr(grouped_lstm, "PRODUCT", "per_member")
    assert {grouped_lstm.product_for(h) for h in (32, 1150)} == {"per_member"}
    monkeypatch.setattr(grouped_lstm, "PRODUCT", "by_shape")
    used = []
    real = grouped_lstm.product_with
    monkeypatch.setattr(grouped_lstm, "product_with", lambda w, way: used.append(way) or real(w, way))
    torch.manual_seed(3)
    g, t, b, h = 2, 3, 2, 400
    inputs = [torch.randn(g, t, b, 4 * h) * 0.1, torch.randn(g, b, h), torch.randn(g, b, h),
              torch.randn(g, 4 * h, h) * 0.05]
    inputs = [x.requires_grad_() for x in inputs]
    reference = grouped_lstm_reference(*inputs, None)
    kernel = grouped_lstm.grouped_lstm_recurrence(*inputs)
    grads = [torch.autograd.grad(sum(x.sum() for x in out), inputs) for out in (reference, kernel)]
    assert used == ["batched", "gate_split"]          # the forward's product, then the backward's
    for x, y in zip([*reference, *grads[0]], [*kernel, *grads[1]]):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-12)


def test_the_compiled_cell_a_gpu_runs_is_the_eager_one(float64):
    """On a GPU the kernel's pointwise steps go through torch.compile; compiled here on the CPU
    (forward and backward, with members of three lengths) they give the eager results."""
    from model.kernels.compiled import FusedKernel
    from model.kernels.grouped_lstm import GroupedLSTMRecurrence, Loops
    torch.manual_seed(1)
    inputs = [torch.randn(3, 6, 2, 16), torch.randn(3, 2, 4), torch.randn(3, 2, 4), torch.randn(3, 16, 4)]
    inputs = [x.requires_grad_() for x in inputs]
    alive = alive_steps([6, 3, 5], "cpu")
    results = []
    for compiled in (False, True):
        out = GroupedLSTMRecurrence.apply(*inputs, alive, Loops(compiled, captured=False))
        results.append([*out, *torch.autograd.grad(sum(x.pow(2).sum() for x in out), inputs)])
    assert not FusedKernel._compile_failed
    for eager, fused in zip(*results):
        torch.testing.assert_close(eager, fused, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("lengths, product", [((8, 8), "batched"), ((7, 7), "batched"), ((7, 3), "batched"),
                                             ((7, 3), "per_member"), ((7, 3), "gate_split")])
def test_the_captured_loops_a_gpu_replays_are_the_eager_ones(float64, lengths, product, monkeypatch):
    """On CUDA the time loops are captured (CUDA graphs) with T padded to a multiple of 4 and
    replayed from their own buffers; here the same buffers with the replay emulated. Two layers
    of the same shape share one capture, each forward's saved tensors outliving the other's
    replay: outputs and gradients are the eager loops' exactly (padded steps keep the state)."""
    from model.kernels import grouped_lstm
    monkeypatch.setattr(grouped_lstm.Loops, "captures", {})
    monkeypatch.setattr(grouped_lstm.Loops, "captured_members", None)
    monkeypatch.setattr(grouped_lstm, "PRODUCT", product)
    torch.manual_seed(2)
    g, t, b, h = 2, max(lengths), 3, 4
    x = torch.randn(g, t, b, 4 * h, requires_grad=True)
    states = [torch.randn(g, b, h, requires_grad=True) for _ in range(4)]
    weights = [torch.randn(g, 4 * h, h, requires_grad=True) for _ in range(2)]
    mix = torch.randn(g, h, 4 * h)
    alive = alive_steps(list(lengths), "cpu")
    results = []
    for capture in (False, True):
        monkeypatch.setattr(grouped_lstm, "CAPTURE", capture)
        first = grouped_lstm.grouped_lstm_recurrence(x, states[0], states[1], weights[0], alive)
        second = grouped_lstm.grouped_lstm_recurrence(first[0] @ mix.unsqueeze(1), states[2], states[3],
                                                       weights[1], alive)
        outputs = [*first, *second]
        loss = sum((torch.cos(torch.arange(y.numel()).view_as(y) * 0.37) * y).sum() for y in outputs)
        results.append([*outputs, *torch.autograd.grad(loss, [x, *states, *weights])])
    captures = grouped_lstm.Loops.captures
    assert len(captures) == 2                      # one forward and one backward: both layers share them
    assert all(key[2] == product and key[3][0][1] % grouped_lstm.STEP_BUCKET == 0   # xw and d_out padded
               for key in captures)
    for eager, captured in zip(*results):
        assert eager.shape == captured.shape
        torch.testing.assert_close(eager, captured, rtol=0, atol=1e-13)
    # A group that shrinks (a run finished) frees the larger group's captures.
    kept = dict(captures)
    grouped_lstm.grouped_lstm_recurrence(x[:1], states[0][:1], states[1][:1], weights[0][:1])
    assert len(grouped_lstm.Loops.captures) == 1 and not set(grouped_lstm.Loops.captures) & set(kept)


def test_grouped_bodies_compute_each_bodys_own_forward(float64):
    """Different lengths, dropout rates (none at all in one), embedding noise in one, each with
    the masks its own stream draws: each member's output, state and raw output are its solo
    forward's."""
    bodies, streams = [], []
    for seed, (dropouts, noise) in enumerate([((0.2, 0.1, 0.3, 0.1, 0.4), 0.0), ((0, 0, 0, 0, 0), 0.0),
                                              ((0.4, 0.3, 0.4, 0.1, 0.5), 0.2)]):
        torch.manual_seed(seed)
        bodies.append(AWDLSTMBody(30, 6, 9, 6, 3, *dropouts, emb_noise=noise).train())
        streams.append(RandomStream(torch.device("cpu")))
    ids = [torch.randint(0, 30, (n, 4)) for n in (7, 5, 6)]
    hidden = [[(torch.randn(1, 4, r.hidden_size), torch.randn(1, 4, r.hidden_size)) for r in b.rnns] for b in bodies]
    starts = [s.state() for s in streams]
    solo = []
    for body, x, h, stream in zip(bodies, ids, hidden, streams):
        with stream:
            solo.append(body(x, h))
    for stream, start in zip(streams, starts):
        stream.restore(start["torch"], None)
    draws = []
    for body, x, stream in zip(bodies, ids, streams):
        with stream:
            draws.append(body.draw_random(*x.shape))
    grouped = grouped_forward(bodies, ids, hidden, draws)
    for k, mine in enumerate(solo):
        theirs = grouped.member(k)
        torch.testing.assert_close(mine.output, theirs.output, rtol=0, atol=1e-14)
        torch.testing.assert_close(mine.last_raw_output, theirs.last_raw_output, rtol=0, atol=1e-14)
        for (h1, c1), (h2, c2) in zip(mine.hidden, theirs.hidden):
            torch.testing.assert_close(h1, h2, rtol=0, atol=1e-14)
            torch.testing.assert_close(c1, c2, rtol=0, atol=1e-14)


def test_the_groups_masks_are_each_members_own_bit_for_bit():
    """In float32, as a GPU trains: the masks made for the whole group from the members' draws
    (stacked, thresholded and scaled at once) are exactly those each member's solo forward makes,
    a member without a dropout given ones (its noise zeros)."""
    from model.body import BodyMasks
    from model.group import group_masks
    bodies = [AWDLSTMBody(30, 6, 9, 6, 3, *dropouts, emb_noise=noise).train()
              for dropouts, noise in [((0.2, 0.1, 0.3, 0.1, 0.4), 0.0), ((0, 0, 0, 0, 0), 0.0),
                                      ((0.4, 0.3, 0.45, 0.07, 0.5), 0.2)]]
    solo, draws = [], []
    for seed, (body, steps) in enumerate(zip(bodies, (7, 5, 6))):
        torch.manual_seed(seed)
        solo.append(body.draw_masks(steps, 4))
        torch.manual_seed(seed)
        draws.append(body.draw_random(steps, 4))
    group = group_masks(draws, [b.rates() for b in bodies], steps=7)
    for k, (mine, body) in enumerate(zip(solo, bodies)):
        for field in ("words", "inputs"):
            own = getattr(mine, field)
            expected = torch.ones_like(getattr(group, field)[k]) if own is None else own
            assert torch.equal(getattr(group, field)[k], expected), (k, field)
        for field in ("weight_hh", "outputs"):
            for layer, own in enumerate(getattr(mine, field)):
                stacked = getattr(group, field)[layer][k]
                assert torch.equal(stacked, torch.ones_like(stacked) if own is None else own), (k, field, layer)
        n = len(mine.noise) if mine.noise is not None else 0
        assert torch.equal(group.noise[k, :n], mine.noise) if n else not group.noise[k].any()
        assert not group.noise[k, n:].any()
    assert isinstance(group, BodyMasks)


def test_no_two_parameters_of_a_group_share_gradient_memory(tiny_models):
    """After a batched step every member's every parameter has a .grad of its own memory:
    autograd keeps slices of the stacked gradients as the members' .grad, and two that overlapped
    (bias_ih's and bias_hh's, once) would both change under one's in-place clipping or a second
    chunk's accumulation."""
    from experiment.group import grouped_losses
    models = tiny_models(["softmax", "softmax", "mos"])
    ids = [torch.randint(0, 50, (n, 3)) for n in (6, 4, 6)]
    draws = [m.body.draw_random(*x.shape) for m, x in zip(models, ids)]
    bodies = grouped_forward([m.body for m in models], ids, [m.init_hidden(3) for m in models], draws)
    streams = [RandomStream(torch.device("cpu")) for _ in models]
    nll, loss = grouped_losses(models, bodies, [torch.randint(0, 50, (n, 3)) for n in (6, 4, 6)], streams,
                               [(2.0, 1.0)] * 3)
    loss.sum().backward()
    spans = sorted((p.grad.data_ptr(), p.grad.data_ptr() + p.grad.numel() * p.grad.element_size(), name)
                   for m in models for name, p in m.named_parameters() if p.grad is not None)
    assert len(spans) == sum(1 for m in models for p in m.parameters())
    for (_, end, first), (start, _, second) in zip(spans, spans[1:]):
        assert end <= start, f"{first} and {second} share gradient memory"


def test_a_stream_draws_what_the_global_generator_would_in_its_thread_only():
    torch.manual_seed(5)
    stream = RandomStream(torch.device("cpu"))
    expected = torch.rand(6)
    other = torch.rand(3)                    # the global stream moves on; the run's does not
    seen = {}

    def draw(name):
        from model.body import keep_mask
        with stream:
            seen[name] = keep_mask((6,), 0.5, torch.empty(0))
    thread = threading.Thread(target=draw, args=("thread",))
    thread.start()
    thread.join()
    assert torch.equal(seen["thread"], (expected >= 0.5).float() * 2)
    assert not torch.equal(torch.rand(3), other)   # outside the stream: the global one
    assert stream.state()["cuda"] is None


# ---------------------------------------------------------------------- a group equals its solo runs
@pytest.mark.parametrize("step, captured, tolerance", [("batched", False, 1e-10), ("batched", True, 1e-10),
                                                      ("solo", False, 0.0)])
def test_a_group_through_the_et_asgd_switch_equals_its_solo_runs(step, captured, tolerance, tiny, float64,
                                                                 tmp_path, monkeypatch):
    """Two seeds of Softmax and one MoS, ET-ASGD after epoch 1, 3 epochs: each member's weights,
    averages, validation losses and switch equal its solo run's. `captured`: the batched body's
    time loops as CUDA replays them (padded, from captured buffers; the replay emulated here)."""
    from model.kernels import grouped_lstm
    monkeypatch.setattr(grouped_lstm, "CAPTURE", captured)
    monkeypatch.setattr(grouped_lstm.Loops, "captures", {})
    monkeypatch.setattr(grouped_lstm.Loops, "captured_members", None)
    schedule = [*tiny, "train.epochs=3", "train.asgd_trigger=et", "train.asgd_switch_epoch=1"]
    runs = [("softmax", 1), ("softmax", 2), ("mos", 1)]
    for head, seed in runs:
        assert train.main(member(head, seed, tmp_path / f"solo-{head}-{seed}", *schedule)) == 0
    assert train.main(group(*[member(h, s, tmp_path / f"group-{h}-{s}", *schedule) for h, s in runs],
                            step=step)) == 0
    for head, seed in runs:
        assert_same_run(tmp_path / f"solo-{head}-{seed}", tmp_path / f"group-{head}-{seed}", tolerance)
        assert last(tmp_path / f"group-{head}-{seed}")["progress"]["asgd_start_epoch"] == 2
    steps = {last(tmp_path / f"group-softmax-{s}")["progress"]["step"] for s in (1, 2)}
    assert len(steps) == 2                   # each seed its own sequence lengths
    info = json.loads((tmp_path / "group-mos-1" / "run.json").read_text())
    assert info["groups"][0]["runs"] == [str(tmp_path / f"group-{h}-{s}") for h, s in runs]
    assert info["groups"][0]["step"] == step
    assert json.loads((tmp_path / "group-mos-1" / "group_exit.json").read_text())["exit_code"] == 0


def test_a_group_whose_members_take_different_nt_asgd_decisions_equals_its_solo_runs(tiny, float64, tmp_path):
    """NT-ASGD with nonmono 1: one member's validation loss rises and it switches, the other's
    keeps falling and it stays on SGD; a third stops early on its plateau rule."""
    schedule = [*tiny, "train.epochs=4", "train.asgd_trigger=nt", "train.nonmono=1"]
    runs = {"switches": ("softmax", 1, ["train.lr=30"]), "stays": ("softmax", 2, ["train.lr=1"]),
            "stops": ("softmax", 3, ["train.asgd_trigger=start", "train.plateau_gain=0.5",
                                     "train.plateau_window=1"])}
    for name, (head, seed, own) in runs.items():
        assert train.main(member(head, seed, tmp_path / f"solo-{name}", *schedule, *own)) == 0
    assert train.main(group(*[member(h, s, tmp_path / f"group-{name}", *schedule, *own)
                              for name, (h, s, own) in runs.items()])) == 0
    for name in runs:
        assert_same_run(tmp_path / f"solo-{name}", tmp_path / f"group-{name}", 1e-10)
    progress = {name: last(tmp_path / f"group-{name}")["progress"] for name in runs}
    assert progress["switches"]["asgd_start_epoch"] is not None
    assert progress["stays"]["asgd_start_epoch"] is None
    assert progress["stops"]["finished"] and progress["stops"]["epoch"] <= 4   # before the cap


@pytest.mark.parametrize("threads", [1, 2])
def test_the_solo_step_side_by_side_is_the_solo_run_bit_for_bit(threads, tiny, float64, tmp_path):
    schedule = [*tiny, "train.epochs=2", "train.asgd_switch_epoch=1"]
    runs = [("softmax", 1), ("mos", 2)]
    for head, seed in runs:
        assert train.main(member(head, seed, tmp_path / f"solo-{head}", *schedule)) == 0
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert train.main(group(*[member(h, s, tmp_path / f"group-{h}", *schedule) for h, s in runs],
                                step="solo")) == 0
    finally:
        torch.set_num_threads(before)
    for head, _ in runs:
        assert_same_run(tmp_path / f"solo-{head}", tmp_path / f"group-{head}", 0.0)


def test_members_stepping_ahead_side_by_side_stop_and_resume_as_their_solo_runs(
        tiny, float64, tmp_path, monkeypatch, capsys):
    """On two threads a CPU group's members step ahead side by side (train.steps_ahead), meeting
    only when each has read STEPS_AHEAD steps' text or its epoch ended: run.max_steps still stops
    each at that step, a signal stops each after its own current step with its last.pt, and the
    runs resumed end as their solo runs, bit for bit, through the ASGD switch."""
    import experiment.group
    monkeypatch.setattr(experiment.group, "STEPS_AHEAD", 7)
    schedule = [*tiny, "train.epochs=2", "train.asgd_switch_epoch=1"]
    runs = [("softmax", 1), ("mos", 2)]
    for head, seed in runs:
        assert train.main(member(head, seed, tmp_path / f"solo-{head}", *schedule)) == 0
    dirs = [tmp_path / f"group-{head}" for head, _ in runs]
    meetings, steps = [], []
    real_call, real_step = experiment.group.SideBySide.__call__, train.Trainer.train_step

    def meet(self, trainers):
        meetings.append(len(trainers))
        return real_call(self, trainers)

    def step(self):
        steps.append(self.run_dir)
        if self.run_dir == dirs[1] and steps.count(dirs[1]) == 45:
            os.kill(os.getpid(), signal.SIGTERM)
            # Python runs the handler in the main thread when it next gets the interpreter: on a
            # loaded machine a worker could finish more steps first. The signal is to arrive
            # during this step, so the step waits until it has (what the test checks is the stop).
            waited = time.monotonic()
            while self.signals.received is None and time.monotonic() - waited < 30:
                time.sleep(0.001)
        return real_step(self)
    monkeypatch.setattr(experiment.group.SideBySide, "__call__", meet)
    monkeypatch.setattr(train.Trainer, "train_step", step)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert train.main(group(*[member(h, s, d, *schedule, "run.max_steps=30") for (h, s), d in zip(runs, dirs)],
                                step="solo")) == 0
        assert [last(d)["progress"]["step"] for d in dirs] == [30, 30]
        assert len(meetings) < 30 / 3                 # not once a step: about every 7 steps' text
        resume = group(*[["--resume", str(d), "run.max_steps=100000"] for d in dirs], step="solo")
        assert train.main(resume) == 128 + signal.SIGTERM
        stopped = [last(d)["progress"]["step"] for d in dirs]
        assert stopped[1] == 45 and 30 < stopped[0] < 45 + 7, stopped
        err = capsys.readouterr().err
        assert all(f"{d}: stopped: SIGTERM after step {s};" in err for d, s in zip(dirs, stopped)), err
        assert train.main(resume) == 0
    finally:
        torch.set_num_threads(before)
    for head, d in zip((h for h, _ in runs), dirs):
        assert_same_run(tmp_path / f"solo-{head}", d, 0.0)


def test_train_asks_mkl_for_bitwise_products_unless_the_user_chose():
    """Without it, on an Intel CPU (MKL's AVX-512 kernels) the side-by-side step above differed
    from the solo run in the last bit (a worker thread's memory lies elsewhere); on an AMD CPU
    it did not, so the setting itself is checked here, in a process of its own."""
    code = "import os, train; print(os.environ['MKL_CBWR'])"
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    repo = Path(__file__).resolve().parents[1]
    for own, expected in ((None, "AUTO,STRICT"), ("COMPATIBLE", "COMPATIBLE")):
        result = subprocess.run([sys.executable, "-c", code], env={**env, **({"MKL_CBWR": own} if own else {})},
                                cwd=repo, capture_output=True, text=True, timeout=120)
        assert result.stdout.strip() == expected, result.stderr


# ---------------------------------------------------------------------- stopping and resuming
def test_a_group_stopped_and_resumed_ends_bit_identical_to_one_never_stopped(tiny, float64, tmp_path):
    schedule = [*tiny, "train.epochs=2", "train.asgd_switch_epoch=1"]
    runs = [("softmax", 1), ("mos", 2)]
    assert train.main(group(*[member(h, s, tmp_path / f"whole-{h}", *schedule) for h, s in runs])) == 0
    assert train.main(group(*[member(h, s, tmp_path / f"parts-{h}", *schedule, "run.max_steps=37")
                              for h, s in runs])) == 0
    assert {last(tmp_path / f"parts-{h}")["progress"]["step"] for h, _ in runs} == {37}
    assert train.main(group(*[["--resume", str(tmp_path / f"parts-{h}"), "run.max_steps=100000"]
                              for h, _ in runs])) == 0
    for head, _ in runs:
        assert_same_run(tmp_path / f"whole-{head}", tmp_path / f"parts-{head}", 0.0)
        assert len(json.loads((tmp_path / f"parts-{head}" / "run.json").read_text())["groups"]) == 2


def test_a_run_started_in_a_group_and_continued_alone_and_the_reverse_end_as_solo_runs(
        tiny, float64, tmp_path):
    schedule = [*tiny, "train.epochs=2", "train.asgd_switch_epoch=1"]
    solo = {s: tmp_path / f"solo-{s}" for s in (1, 2)}
    for seed, run_dir in solo.items():
        assert train.main(member("softmax", seed, run_dir, *schedule)) == 0
    # seed 1 starts in a group (with seed 3) and ends alone; seed 2 starts alone and ends in a group.
    assert train.main(group(member("softmax", 1, tmp_path / "a", *schedule, "run.max_steps=30"),
                            member("softmax", 3, tmp_path / "c", *schedule, "run.max_steps=30"))) == 0
    assert train.main(["--resume", str(tmp_path / "a"), "run.max_steps=100000"]) == 0
    assert train.main(member("softmax", 2, tmp_path / "b", *schedule, "run.max_steps=30")) == 0
    assert train.main(group(["--resume", str(tmp_path / "b"), "run.max_steps=100000"],
                            ["--resume", str(tmp_path / "c"), "run.max_steps=100000"])) == 0
    assert_same_run(solo[1], tmp_path / "a", 1e-10)
    assert_same_run(solo[2], tmp_path / "b", 1e-10)
    # how a run's last sitting in a group ended: gone once it went on alone, else that sitting's
    assert not (tmp_path / "a" / "group_exit.json").exists()
    ended = json.loads((tmp_path / "c" / "group_exit.json").read_text())
    assert (ended["exit_code"], ended["epochs_done"], ended["message"][:5]) == (0, 2, "done:")


def test_a_member_that_ends_first_says_so_as_it_leaves(tiny, tmp_path, monkeypatch, capsys):
    """A newcomer's short run had no group_exit.json, nor its "done" line, until its group's
    last member ended: both come as it leaves, with the epochs it did."""
    short, longer = tmp_path / "short", tmp_path / "longer"
    seen = []
    real_step = train.Trainer.train_step

    def step(self):
        if self.run_dir == longer:
            seen.append((short / "group_exit.json").is_file())
        return real_step(self)
    monkeypatch.setattr(train.Trainer, "train_step", step)
    assert train.main(group(member("softmax", 1, short, *tiny, "train.epochs=1"),
                            member("softmax", 2, longer, *tiny, "train.epochs=2"), step="solo")) == 0
    assert seen[0] is False and seen[-1] is True
    for run_dir, epochs in ((short, 1), (longer, 2)):
        ended = json.loads((run_dir / "group_exit.json").read_text())
        assert (ended["exit_code"], ended["epochs_done"]) == (0, epochs)
        assert ended["step"] == last(run_dir)["progress"]["step"]
    out = capsys.readouterr().out
    assert out.index(f"{short}: done:") < out.index(f"{longer}: done:")


def test_a_finetuning_member_says_its_starting_weights_as_a_solo_finetuning_does(tiny_run, tmp_path, capsys):
    """Each finetuning member prints the line its solo run prints: the loaded weights' validation
    perplexity, which stays in its best.pt until an epoch beats it."""
    start = math.exp(torch.load(tiny_run / "best.pt", weights_only=True)["val_loss"])
    dirs = [tmp_path / "ft1", tmp_path / "ft2"]
    assert train.main(["--group", *[f"--finetune {tiny_run} train.epochs=1 train.seed={seed} run.dir={d}"
                                    for seed, d in enumerate(dirs, 1)], "--group-step", "solo"]) == 0
    out = capsys.readouterr().out
    assert out.count(f"starting weights ({tiny_run / 'best.pt'}): valid ppl {start:.2f}") == 2


def test_a_member_that_diverges_leaves_and_the_others_go_on(tiny, tmp_path, capsys):
    schedule = [*tiny, "train.epochs=1"]
    assert train.main(group(member("softmax", 1, tmp_path / "fine", *schedule),
                            member("softmax", 2, tmp_path / "wild", *schedule, "train.lr=1e30",
                                   "train.clip=0"))) == 3
    ended = json.loads((tmp_path / "wild" / "group_exit.json").read_text())
    assert ended["exit_code"] == 3 and "non-finite" in ended["message"]
    assert json.loads((tmp_path / "fine" / "group_exit.json").read_text())["exit_code"] == 0
    assert last(tmp_path / "fine")["progress"]["finished"]
    assert not (tmp_path / "wild" / "last.pt").exists()      # nothing of the bad step saved
    assert f"{tmp_path / 'wild'}: stopped: non-finite" in capsys.readouterr().err


def test_sigterm_stops_every_member_with_its_last_pt_and_the_group_resumes(tiny, tmp_path):
    schedule = [*tiny, "train.epochs=3", "run.checkpoint_every_steps=1000000"]
    dirs = [tmp_path / "a run", tmp_path / "b"]     # a space: the printed commands must quote it
    command = [sys.executable, "train.py", *group(member("softmax", 1, dirs[0], *schedule),
                                                  member("softmax", 2, dirs[1], *schedule), step="solo")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    for line in process.stdout:                       # the first epoch's lines: training is under way
        if "epoch    1 | step" in line:
            break
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, err
    assert all((d / "last.pt").is_file() for d in dirs)
    assert "continue the group with python train.py --group" in err
    resume = err.strip().splitlines()[-1].split("continue the group with ", 1)[1]
    # the same command again: refused, with the command that continues the group (not one run's)
    again = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 2 and again.stderr == (
        f"error: {dirs[0]}, {dirs[1]} already hold a run (this group's, stopped?); continue the group with "
        f"{resume}, or choose another run.dir\n")
    done = subprocess.run([sys.executable, *shlex.split(resume)[1:]], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert all(last(d)["progress"]["finished"] for d in dirs)


def test_a_signal_between_two_members_updates_stops_both_after_the_same_step(tiny, tmp_path, monkeypatch, capsys):
    """With each member's step one after another (the CPU's way), a signal that comes during the
    second member's step, after the first member's update read no signal, still stops both after
    that step: the same step in both messages and both last.pt."""
    dirs = [tmp_path / "a", tmp_path / "b"]
    calls = []
    real_step = train.Trainer.train_step

    def step(self):
        calls.append(self.run_dir)
        if calls.count(dirs[1]) == 4 and self.run_dir == dirs[1]:    # the second member's fourth step
            assert calls.count(dirs[0]) == 4                          # after the first's fourth update
            os.kill(os.getpid(), signal.SIGTERM)
        return real_step(self)
    monkeypatch.setattr(train.Trainer, "train_step", step)
    schedule = [*tiny, "train.epochs=1", "run.checkpoint_every_steps=1000000"]
    assert train.main(group(member("softmax", 1, dirs[0], *schedule), member("mos", 2, dirs[1], *schedule),
                            step="solo")) == 128 + signal.SIGTERM
    assert calls.count(dirs[0]) == calls.count(dirs[1]) == 4
    err = capsys.readouterr().err
    assert all(f"{d}: stopped: SIGTERM after step 4;" in err for d in dirs), err
    assert [last(d)["progress"]["step"] for d in dirs] == [4, 4]


# ---------------------------------------------------------------------- bad input
@pytest.mark.parametrize("case, expected", [
    ("shapes", r"--group: model\.nhid is 24 for .* but 32 for .*; a group's runs share"),
    # a newcomer's slice beside the full corpus: the batched step crashed in torch.stack
    ("corpus", r"--group: the corpus is \S+ for .* but \S+/other/ptb for .*; a group's runs read one corpus$"),
    ("same dir", r"--group: members 1 and 2 both train in \S+; give each run its own run.dir$"),
    ("flag first", r"--group member 2 \('--resum runs/g1'\): --resum: a member takes a config and key=value"),
    ("finished", r"--group: .* has already finished training"),
    ("member", r"--group member 2 \('configs/ptb_mini/softmax.yaml --seed 3'\): --seed: a member takes"),
    ("data dir", r"--group member 2 \('configs/ptb_mini/softmax.yaml --data-dir /x'\): --data-dir: a member "
                 r"takes .* \(--data-dir is the group's: give it beside --group\)$"),
    ("unquoted", r"--group member 2 \('train.seed=3'\): a key=value override, not a config file; each run "
                 r"is one quoted argument"),
    ("typo", r"--group member 2 \('.*model.emsze=16'\): override 'model.emsze=16': unknown key model.emsze"),
])
def test_bad_groups_are_one_line_and_write_nothing(case, expected, tiny, tiny_run, tmp_path, capsys):
    a = member("softmax", 1, tmp_path / "a", *tiny)
    elsewhere = tmp_path / "other"
    shutil.copytree(Path(tiny[0].split("=", 1)[1]) / "ptb", elsewhere / "ptb")
    others = {"shapes": [member("softmax", 2, tmp_path / "b", *tiny, "model.nhid=32")],
              "corpus": [member("softmax", 2, tmp_path / "b", *tiny, f"data.data_dir={elsewhere}")],
              "same dir": [member("mos", 2, tmp_path / "a", *tiny)],
              "finished": [["--resume", str(tiny_run)]]}
    if case == "member":
        arguments = ["--group", shlex.join(a), f"{MINI}/softmax.yaml --seed 3"]
    elif case == "data dir":
        arguments = ["--group", shlex.join(a), f"{MINI}/softmax.yaml --data-dir /x"]
    elif case == "flag first":
        arguments = ["--group", shlex.join(a), "--resum runs/g1"]
    elif case == "unquoted":
        arguments = ["--group", shlex.join(a), "train.seed=3"]
    elif case == "typo":
        arguments = group(a, member("softmax", 2, tmp_path / "b", *tiny, "model.emsze=16"))
    else:
        arguments = group(a, *others[case])
    before = sorted(tiny_run.iterdir())
    assert train.main(arguments) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    import re
    assert re.fullmatch(f"error: {expected}.*", err), err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    assert sorted(tiny_run.iterdir()) == before


def test_a_dry_run_prints_each_config_and_says_the_group_would_start(tiny, tmp_path, capsys):
    """A newcomer's --dry-run printed the members' configs and never said whether the group itself
    would start (its checks pass) nor how: its last line does; nothing is written."""
    assert train.main([*group(member("softmax", 1, tmp_path / "a", *tiny), member("mos", 2, tmp_path / "b", *tiny),
                              step="solo"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("model:") >= 2
    assert out.rstrip().splitlines()[-1] == ("--dry-run: the group would start: 2 runs on cpu, one step of all "
                                             "at a time (solo step); nothing written")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize("threads, step, shares", [(2, "solo", True), (1, "solo", False), (2, "batched", False)])
def test_members_side_by_side_share_the_main_heap(monkeypatch, tiny, tmp_path, threads, step, shares):
    """A CPU group whose members will step side by side in threads has glibc give every thread
    the main heap (experiment/loading.py's one_heap_for_every_thread: a thread's own arena maps a
    step's large tensors anew at every step), before the members are built; a group stepping on
    one thread or batched keeps glibc's default, as a run alone does."""
    import experiment.group
    calls = []
    monkeypatch.setattr(experiment.group, "one_heap_for_every_thread", lambda: calls.append(True) or True)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert train.main([*group(member("softmax", 1, tmp_path / "a", *tiny), member("softmax", 2, tmp_path / "b", *tiny),
                                  step=step), "--dry-run"]) == 0
    finally:
        torch.set_num_threads(previous)
    assert calls == ([True] if shares else [])


def test_a_group_is_refused_under_torchrun(monkeypatch, capsys, tiny, tmp_path):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert train.main(group(member("softmax", 1, tmp_path / "a", *tiny))) == 2
    assert "not torchrun" in capsys.readouterr().err


def test_a_full_disk_stops_the_group_in_one_line_and_keeps_every_last_pt(tiny, tmp_path, capsys, monkeypatch):
    """The first last.pt of each run fits (step 3), the next write does not (step 6): the group
    stops (exit 1, one line naming the file and how to continue), each run's last.pt as it was."""
    from conftest import enospc_after
    real_save, full, calls = torch.save, enospc_after(4096), {"n": 0}

    def save(obj, f):
        calls["n"] += 1
        (real_save if calls["n"] <= 2 else full)(obj, f)
    monkeypatch.setattr(torch, "save", save)
    dirs = [tmp_path / "a", tmp_path / "b"]
    schedule = [*tiny, "run.checkpoint_every_steps=3"]
    assert train.main(group(*[member("softmax", s, d, *schedule) for s, d in zip((1, 2), dirs)], step="solo")) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"error: cannot write {dirs[0] / 'last.pt'} (No space left on device)")
    assert "the group stopped (each run continues from its last.pt: python train.py --group" in err
    assert [last(d)["progress"]["step"] for d in dirs] == [3, 3]


def test_a_full_disk_as_the_group_starts_is_exit_code_1(tiny, tmp_path, capsys, monkeypatch):
    """A member's config.yaml that cannot be written: a write failed (1), as for one run, not bad
    input (2)."""
    monkeypatch.setattr(os, "fsync", disk_full)
    dirs = [tmp_path / "a", tmp_path / "b"]
    assert train.main(group(*[member("softmax", s, d, *tiny) for s, d in zip((1, 2), dirs)], step="solo")) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"error: cannot write {dirs[0] / 'config.yaml'} (No space left on device); " \
                  f"{dirs[0] / 'config.yaml'} was not written"


def test_a_run_directory_in_use_refuses_the_group_and_leaves_nothing(tiny, tmp_path, capsys):
    from experiment.run_directory import RunLock
    busy = tmp_path / "busy"
    busy.mkdir()
    with RunLock(busy):
        assert train.main(group(member("softmax", 1, tmp_path / "new", *tiny),
                                member("softmax", 2, busy, *tiny))) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"error: {busy} is in use by PID {os.getpid()}")
    assert not (tmp_path / "new").exists()          # made by the refused group: removed
    assert sorted(p.name for p in busy.iterdir()) == [".lock"]


@pytest.mark.parametrize("step", ["solo", "batched", None])
def test_every_step_after_a_validation_trains_in_train_mode(step, tiny, tmp_path, monkeypatch):
    """Validation leaves the model in eval mode and the step sets train mode back only when it is
    not (setting it costs a group's host time): every training step of every epoch, alone and in a
    group, runs with every module in train mode (dropout on)."""
    modes = []
    begin = train.Trainer.begin_step

    def recording(self):
        batch = begin(self)
        modes.append(all(m.training for m in self.model.modules()))
        return batch
    monkeypatch.setattr(train.Trainer, "begin_step", recording)
    schedule = [*tiny, "train.epochs=3"]
    if step is None:
        assert train.main(member("softmax", 1, tmp_path / "solo", *schedule)) == 0
    else:
        assert train.main(group(member("softmax", 1, tmp_path / "a", *schedule),
                                member("mos", 2, tmp_path / "b", *schedule), step=step)) == 0
    assert len(modes) > 3 * 10 and all(modes)
