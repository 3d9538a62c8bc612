"""Train an AWD-LSTM language model with a pluggable output head (docs/reference.md sections 2 and 3).

    python train.py configs/ptb/softmax.yaml                    # train the PTB Softmax baseline
    python train.py configs/ptb/softmax.yaml train.lr=30 run.dir=runs/x
    python train.py configs/ptb/softmax.yaml --dry-run          # resolved config + param count
    python train.py --resume runs/x                             # continue an interrupted run
    python train.py --finetune runs/x                           # AWD-LSTM's second stage
    torchrun --nproc_per_node 4 train.py configs/wt2/mos.yaml   # one run on 4 GPUs (DDP)
    python train.py --group "configs/ptb_mini/softmax.yaml train.seed=1" "configs/ptb_mini/mos.yaml"
                                                                # several runs in lockstep, one process

One optimizer step:
  1. draw seq_len (variable BPTT) and scale every param group's lr by seq_len / bptt;
  2. for each column chunk of `small_batch_size` sequences (gradient accumulation): forward
     from that chunk's carried (detached) hidden state, loss = NLL + AR + TAR, backward
     (each chunk is its own forward, so it draws its own dropout masks, as in the MoS code);
  3. clip the global gradient norm, take the SGD / ASGD step; stop (exit code 3, before
     anything is saved) if the loss, the gradient norm or any weight is non-finite.
One epoch: steps over the whole training stream, then validation (on the averaged weights
once ASGD runs), the best-by-validation checkpoint, the NT-/ET-ASGD switch or, on ASGD, the
early stops (train.early_stop_nonmono, train.plateau_gain), last.pt. A run started from trained
weights (train.init_from: finetuning) validates them before its first step: they are best.pt
until an epoch beats them, as in [AWD]'s finetune.py.

Under torchrun (experiment/distributed.py) each of N processes owns an equal block of the batch's
columns and cuts it into chunks of `small_batch_size`; each chunk's loss keeps its weight, its
share of the whole batch, and the gradients are summed across processes before step 3, which
every process then takes alike. Rank 0 validates and writes the run directory.

The loop (`train_runs`) takes one step of every run it trains at a time: a run alone, or a
group's runs (--group), whose steps experiment/group.py takes together: each run's step is the
same 1-3 in phases (begin_step, then the chunks' losses and the update, then end_step), its bodies,
same-class heads, losses and updates computed together on a GPU (experiment/group.py, model/group.py),
and each run validates when its own epoch ends.

Around the algorithm, in experiment/: which run a command line means and the checks before it
starts (training_run.py), what best.pt and last.pt hold (checkpoint.py), what is shown and
logged (progress.py), the averaged SGD and the averaged weights (averaged_sgd.py), group runs
(group.py).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from pathlib import Path
from typing import NamedTuple

from experiment.cli import keep_training_without_a_reader, run_script, quiet_interrupt_while_starting

if __name__ == "__main__":        # (not when a test imports the script)
    quiet_interrupt_while_starting()   # before torch's import, which takes seconds: a Ctrl-C there is one line

# Intel's MKL may sum a matrix product in another order depending on where its inputs lie in
# memory: on an Intel CPU a group's runs, side by side in threads, differed from their solo runs
# in the last bit. Strict conditional numerical reproducibility keeps its products bitwise the same
# whatever the alignment and the thread count; MKL reads it at its first call, and a user's own
# MKL_CBWR is kept. (60 steps of the miniature took 16.6-17.0 s with it, 17.7-18.1 s without.)
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

import torch  # noqa: E402

from data.batching import SequenceLengthSampler, batchify, get_batch
from experiment import checkpoint
from experiment.averaged_sgd import AveragedSGD, averaged_weights, make_optimizer, step_optimizers
from experiment.config import Config
from experiment.loading import code_version, device_name
from experiment.distributed import DistributedError, World, exit_process
from evaluation.loop import evaluate_nll
from experiment.progress import (EpochProgress, RunLog, SilentProgress, TrainingProgress, clock,
                                 epoch_record, keep_epochs, peak_gpu_memory, reset_peak_gpu_memory)
from experiment.run_directory import GROUP_EXIT, RunDirectoryError, write_text_atomic
from experiment.training_run import (PreparedRun, RunRefused, StopSignals, finish_message,
                                     lost_process_message, non_finite_message, on_every_rank,
                                     parse_args, prepare_run, report_start, signal_stop_message)
from model import count_parameters
from model.random_stream import GlobalRandomStream


class TrainingStopped(Exception):
    """Training ended early; the message says why and `exit_code` what the process returns."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def detach(hidden):
    return [(h.detach(), c.detach()) for h, c in hidden]


def regularized_loss(out, alpha: float, beta: float):
    """(mean NLL, NLL + AR + TAR) of one forward given its targets ([AWD] section 4.6,
    docs/reference.md section 3).

    AR penalises the dropped last-layer output g (the head's input); TAR penalises the change
    of the raw last-layer output between consecutive time steps.
    """
    nll = -out.target_log_probs.mean()
    ar = alpha * out.dropped_output.pow(2).mean()
    tar = beta * (out.last_raw_output[1:] - out.last_raw_output[:-1]).pow(2).mean()
    return nll, nll + ar + tar


def global_norm(tensors) -> torch.Tensor:
    """The 2-norm of all `tensors` as one vector, as clip_grad_norm_ computes it; a tensor on
    their device, read at the caller's one sync per step."""
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t.detach()) for t in tensors]))


def extremes(tensors, multi_tensor: bool | None = None) -> torch.Tensor:
    """Values that are all finite exactly when every entry of every tensor is: on a CPU the
    smallest and largest entry of each (aminmax propagates NaN; unlike a 2-norm it cannot
    overflow), on a GPU (multi_tensor, by default where the tensors are on CUDA) the largest
    magnitude of each, the infinity norm, which propagates NaN too, computed for all of them by one
    multi-tensor kernel instead of one launch per tensor (a group run's step checks every run's
    weights). On a CPU the infinity norm costs 15 times aminmax, whose launches cost nothing there."""
    detached = [t.detach() for t in tensors]
    if detached[0].is_cuda if multi_tensor is None else multi_tensor:
        return torch.stack(torch._foreach_norm(detached, float("inf")))
    return torch.stack([value for t in detached for value in torch.aminmax(t)])


def non_monotone(val_loss: float, history: list, n: int) -> bool:
    """[AWD] Algorithm 1: more than `n` (train.nonmono) losses recorded and the new one is worse
    than the best of all but the last `n` (the validation history does not hold val_loss yet)."""
    return len(history) > n and val_loss > min(history[:-n])


def plateaued(val_loss: float, history: list, window: int, gain: float) -> bool:
    """The best validation perplexity, with val_loss, is less than `gain` (a fraction) lower than
    it was `window` epochs ago (the validation history does not hold val_loss yet)."""
    losses = history + [val_loss]
    return len(losses) > window and 1 - math.exp(min(losses) - min(losses[:-window])) < gain


def column_chunks(batch_size: int, small_batch_size: int) -> list[tuple[int, int]]:
    return [(s, min(s + small_batch_size, batch_size)) for s in range(0, batch_size, small_batch_size)]


class StepBatch(NamedTuple):
    seq_len: int                 # the sampled length (the position moves on by it)
    inputs: torch.Tensor         # (seq_len', B): shortened at the end of the stream
    targets: torch.Tensor


class Trainer:
    """One run's training on this process: the step, the epoch, validation and the ASGD switch;
    `train_runs` is the loop. Where it stands is `progress`; experiment/checkpoint.py saves it
    in last.pt."""

    def __init__(self, config: Config, model, corpus, run_dir: Path, device: torch.device,
                 world: World | None = None, label: str | None = None):
        self.config, self.model, self.run_dir, self.device = config, model, run_dir, device
        self.world = world = world or World()
        t = config.train
        # This process's block of the batch's columns (all of them in a single process).
        self.train_data = batchify(corpus.train, t.batch_size, device)[:, world.columns(t.batch_size)].contiguous()
        self.val_data = batchify(corpus.valid, t.eval_batch_size, device)
        self.vocab = {"vocab_size": corpus.vocab_size, "vocab_sha256": corpus.vocab_sha256}
        self.chunks = column_chunks(self.train_data.size(1), config.small_batch_size)
        # The same sequence lengths on every rank: the sampler's stream derives from the seed only.
        self.sampler = SequenceLengthSampler(t.bptt, t.max_seq_len_delta, t.seed)
        self.training_model = world.parallel(model, device, config.run.ddp_reduce)
        averaging_from_start = t.asgd_trigger == "start"
        self.optimizer = make_optimizer(model, t, AveragedSGD if averaging_from_start else torch.optim.SGD)
        self.params = [p for group in self.optimizer.param_groups for p in group["params"]]
        # Where training stands, all of it saved in last.pt so a resumed run continues exactly.
        self.progress = TrainingProgress(asgd_start_epoch=1 if averaging_from_start else None)
        self.signals = StopSignals(world)    # the signal received, set by its handler
        self.stop_signal = None        # the signal that stops training, agreed by every rank
        self.warned_diverging = False
        # Where its masks' random numbers come from: the process's generators, or in a group its
        # own (experiment/group.py). last.pt saves its state.
        self.random_stream = GlobalRandomStream(device)
        self.label = label             # in a group: the run's name before each of its lines
        self.run_log = RunLog(run_dir, label)   # the epochs' lines, metrics.jsonl, TensorBoard (rank 0)

    @property
    def averaging(self) -> bool:
        return isinstance(self.optimizer, AveragedSGD)

    def should_switch_to_asgd(self, val_loss: float) -> bool:
        t = self.config.train
        if self.averaging or t.asgd_trigger in ("never", "start"):
            return False
        if t.asgd_trigger == "et":
            return self.progress.epoch >= t.asgd_switch_epoch
        return non_monotone(val_loss, self.progress.val_history, t.nonmono)

    # ------------------------------------------------------------------ one step
    def train_step(self) -> float:
        """One optimizer step (the module docstring's 1-3); its mean training NLL."""
        batch = self.begin_step()
        self.step_totals = torch.zeros(2, device=self.device)   # (NLL, loss) of this process's chunks
        for c, (start, end) in enumerate(self.chunks):
            with self.world.accumulating(self.training_model, last_chunk=c == len(self.chunks) - 1):
                out = self.training_model(batch.inputs[:, start:end], detach(self.progress.hidden[c]),
                                          batch.targets[:, start:end])
                self.chunk_loss(c, out).backward()
        # Under torchrun the same collective tells every rank the whole batch's loss, any rank's
        # non-finite value and any rank's stop signal, so all take the same decisions.
        checks, self.stop_signal = self.world.agree_on_step(self.update(), self.signals.received)
        return self.end_step(checks, batch)

    def begin_step(self) -> StepBatch:
        """Step 1: the step's length (and lr), its data, the gradients zeroed."""
        t = self.config.train
        seq_len = self.sampler.sample()
        for group in self.optimizer.param_groups:
            group["lr"] = group["base_lr"] * seq_len / t.bptt
        inputs, targets = get_batch(self.train_data, self.progress.position, seq_len)
        # Validation leaves the model in eval mode; setting train mode every step would cost a
        # group of many small runs more host time than its GPU work.
        if not (self.model.training and self.training_model.training):
            self.training_model.train()
        self.optimizer.zero_grad(set_to_none=True)
        return StepBatch(seq_len, inputs, targets)

    def chunk_loss(self, c: int, out) -> torch.Tensor:
        """Step 2 for column chunk `c`, given its forward: carry its hidden state, and the loss to
        back-propagate, weighted by the chunk's share of the whole batch."""
        t = self.config.train
        self.progress.hidden[c] = out.hidden
        nll, loss = regularized_loss(out, t.alpha, t.beta)
        start, end = self.chunks[c]
        weight = (end - start) / t.batch_size
        loss = loss * weight
        self.step_totals += torch.stack([nll.detach() * weight, loss.detach()])
        return loss

    def update(self) -> torch.Tensor:
        """Step 3 up to its checks: clip, SGD / ASGD step; the checks (the step's NLL and loss,
        the gradient norm, every weight's `extremes`) as one tensor on the device, not yet read."""
        t = self.config.train
        if t.clip > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, t.clip)
        else:
            grad_norm = global_norm([p.grad for p in self.params if p.grad is not None])
        step_optimizers([self.optimizer])
        # Read at one device sync per step for every check: a finite loss can still give an
        # infinite gradient, and a finite gradient times a huge lr can still give infinite weights.
        return torch.cat([self.step_totals, grad_norm.reshape(1), extremes(self.params)])

    def end_step(self, checks: list[float], batch: StepBatch) -> float:
        """The checks read: stop if any is non-finite (TrainingStopped, exit code 3, nothing of
        the step saved), else count the step."""
        p = self.progress
        step_nll, step_loss, norm = checks[:3]
        if not all(map(math.isfinite, checks)):
            raise TrainingStopped(non_finite_message(step_loss, norm, p, self.run_dir), 3)
        tokens = batch.targets.numel() * self.world.size
        p.step += 1
        p.position += batch.seq_len        # the sampled length, as in the original code
        p.epoch_nll_sum += step_nll * tokens
        p.epoch_tokens += tokens
        return step_nll

    # ------------------------------------------------------------------ one epoch
    def start_epoch(self) -> None:
        """The epoch's hidden states (zero at its start), its progress display, its GPU peak."""
        p = self.progress
        if p.hidden is None:
            p.hidden = [self.model.init_hidden(end - start) for start, end in self.chunks]
        self.display = (EpochProgress(self.config, p.epoch, p.step, p.position, self.last_position,
                                      device=self.device, label=self.label)
                        if self.world.is_main else SilentProgress())
        reset_peak_gpu_memory(self.device)                    # the epoch's peak, in metrics.jsonl

    @property
    def last_position(self) -> int:
        """The epoch ends when the position reaches it (every input has a target)."""
        return self.train_data.size(0) - 2

    @property
    def epoch_done(self) -> bool:
        return self.progress.position >= self.last_position

    @property
    def step_limit_reached(self) -> bool:
        max_steps = self.config.run.max_steps
        return bool(max_steps) and self.progress.step >= max_steps

    def after_step(self, nll: float) -> None:
        """The step's line or bar, its TensorBoard scalar, and last.pt every
        run.checkpoint_every_steps steps."""
        run, p = self.config.run, self.progress
        mean_nll = self.display.update(p.step, p.position, nll)
        if mean_nll is not None:
            self.run_log.scalar("train/step_loss", mean_nll, p.step)
            self.warn_if_diverging(mean_nll)
        # Not after the epoch's last step: end_epoch saves last.pt right after validating,
        # and a checkpoint at the step where the epoch's results are logged would leave
        # them in TensorBoard (purge_step = step + 1) if the run were killed in between.
        if run.checkpoint_every_steps and p.step % run.checkpoint_every_steps == 0 and not self.epoch_done:
            self.save_last()

    def warn_if_diverging(self, mean_nll: float) -> None:
        """Say once, on stderr, when a run's training loss is worse than a uniform guess over the
        vocabulary by more than one nat: a finite loss there means training has diverged (a
        learning rate too large for some parameters, a head's learned scalar say), which the
        non-finite check stops only once something overflows."""
        uniform = math.log(self.vocab["vocab_size"])
        if mean_nll > uniform + 1 and not self.warned_diverging:
            self.warned_diverging = True
            print(f"warning: {self.label + ': ' if self.label else ''}training loss {mean_nll:.2f} at step "
                  f"{self.progress.step} is above log(vocabulary size) + 1 = {uniform + 1:.2f}, worse than a "
                  f"uniform guess: training has diverged (a learning rate too large for some parameters? a "
                  f"head's own parameters can have their own, docs/heads.md); it goes on unless a value "
                  f"becomes non-finite", file=sys.stderr, flush=True)

    def close_epoch(self) -> None:
        self.display.close()

    def end_epoch(self) -> None:
        """Validate, keep the best model, maybe switch to ASGD, log, write last.pt."""
        t, p = self.config.train, self.progress
        started = clock()
        val_loss = self.validate()
        p.add_time(started, training=False)
        if val_loss < p.best_val:
            p.best_val = val_loss
        # The epoch's cost is every process's CPU time: under torchrun, the sum over the ranks.
        record = epoch_record(p, val_loss, "ASGD" if self.averaging else "SGD", t.lr,
                              cpu_seconds=self.world.sum(p.epoch_cpu_seconds),
                              peak_memory=peak_gpu_memory(self.device))
        if self.should_switch_to_asgd(val_loss):
            self.optimizer = make_optimizer(self.model, t, AveragedSGD)
            p.asgd_start_epoch = p.epoch + 1
            record["switched_to_asgd"] = True
        elif self.averaging and (
                (t.early_stop_nonmono and non_monotone(val_loss, p.val_history, t.nonmono))  # [AWD] finetune.py
                or (t.plateau_gain and plateaued(val_loss, p.val_history, t.plateau_window, t.plateau_gain))):
            p.finished = True
            record["early_stop"] = True
        p.val_history.append(val_loss)
        if self.world.is_main:
            self.run_log.log_epoch(record)
        p.start_next_epoch()
        p.finished = p.finished or p.epoch > t.epochs
        self.save_last()

    def validate(self) -> float:
        """The validation loss (of the ASGD averages once ASGD runs), keeping best.pt; under
        torchrun rank 0 validates while the others wait for its result (the NT-ASGD switch and
        early stop are decided on every rank from it)."""
        val_loss = math.nan
        if self.world.is_main:
            with averaged_weights(self.model, self.optimizer):
                val_loss = evaluate_nll(self.model, self.val_data, self.config.train.bptt)
                if val_loss < self.progress.best_val:
                    checkpoint.save_best(self, val_loss)
        return self.world.broadcast(val_loss)

    def validate_starting_weights(self) -> float:
        """A run started from trained weights (train.init_from: finetuning) scores them first, as
        [AWD]'s and [MoS]'s finetune.py do: best.pt holds them until an epoch beats them, so the
        run never ends with a best model worse than the one it started from."""
        started = clock()
        self.progress.best_val = self.validate()
        self.progress.add_time(started, training=False)
        return self.progress.best_val

    def save_last(self) -> None:
        """last.pt (its layout is in experiment/checkpoint.py)."""
        checkpoint.save_last(self)


# ---------------------------------------------------------------------- the loop
def train_runs(trainers: list[Trainer], take_step, on_end=None) -> dict[Trainer, TrainingStopped | None]:
    """Train each run of `trainers` (a run alone, or a group's members) to its end, one step of
    every run still training at a time: `take_step(running)` gives each one's step NLL, or the
    TrainingStopped its step raised (a non-finite value: exit code 3), or None where it took
    several steps itself (`steps_ahead`, each followed by its after_step). Each run validates when
    its own epoch ends, and leaves when it is finished (its epochs, an early stop), reaches
    run.max_steps, or its step stopped it; the others go on. A signal stops them all after the
    current step (runs stepping ahead: each after its own), each saving last.pt. The time of each
    call is shared out evenly among the runs that stepped (their epochs' seconds and CPU seconds
    in metrics.jsonl).

    Returns each run's end: None when it ended without an error (finished, or at run.max_steps),
    else its TrainingStopped; `on_end(trainer, end)` is called as each run leaves (a group says
    so then, not when its last member ends)."""
    ends: dict[Trainer, TrainingStopped | None] = {t: None for t in trainers}
    running = [t for t in trainers if not t.progress.finished]
    in_epoch: list[Trainer] = []

    def leave(t: Trainer, end: TrainingStopped | None) -> None:
        ends[t] = end
        running.remove(t)
        if on_end is not None:
            on_end(t, end)
    with trainers[0].signals:            # one handler: every run of a group shares it
        since = clock()
        while running:
            for t in [t for t in running if t.stop_signal or t.step_limit_reached]:
                if t in in_epoch:            # (at an epoch's end, end_epoch has just saved)
                    t.close_epoch()
                    in_epoch.remove(t)
                    t.save_last()
                leave(t, TrainingStopped(signal_stop_message(t.stop_signal, t.progress.step, t.run_dir, t.world),
                                         128 + t.stop_signal) if t.stop_signal else None)
            for t in running:
                if t not in in_epoch:
                    t.start_epoch()
                    in_epoch.append(t)
            stepped = list(running)
            for t, result in zip(stepped, take_step(stepped) if stepped else []):
                if isinstance(result, TrainingStopped):
                    t.close_epoch()
                    in_epoch.remove(t)
                    leave(t, result)
                elif result is not None:
                    t.after_step(result)
            # A signal stops every run after this round of steps: each run's own update reads it,
            # and a signal that comes between two runs' updates would otherwise let the first step
            # once more. (Side by side on a CPU, with train.steps_ahead, a round holds each member's
            # own steps, so the members may stop a few steps apart; each resumes from its own.)
            received = next((t.stop_signal for t in running if t.stop_signal), None)
            for t in running:
                t.stop_signal = t.stop_signal or received
            since = share_time(stepped, since)
            for t in [t for t in running if t.epoch_done]:
                t.close_epoch()
                in_epoch.remove(t)
                t.end_epoch()            # validation: its own time, charged to its own epoch
                t.stop_signal = t.world.agree_on_signal(t.signals.received)
                if t.progress.finished:
                    leave(t, None)
            since = clock()
    return ends


def share_time(trainers: list[Trainer], since: tuple[float, float]) -> tuple[float, float]:
    """Charge the time since `since` (a clock()) to the epochs of `trainers` in equal parts;
    the clock now."""
    now = clock()
    for t in trainers:
        t.progress.add_seconds((now[0] - since[0]) / len(trainers), (now[1] - since[1]) / len(trainers))
    return now


def steps_ahead(t: Trainer, steps: int) -> TrainingStopped | None:
    """One run's steps until its position has moved `steps` x bptt (each step followed by its
    after_step), or sooner to its epoch's end, run.max_steps or a stop signal: None, or the
    TrainingStopped a step raised. A CPU group's members take their steps this way side by side
    (experiment/group.py), each on its own core, meeting when each has read about as much text:
    meeting at every step, a member would wait each time for the one whose sampled BPTT length is
    longer (6% of a pair's time at the miniature's lengths: bptt 70, one step in twenty 35, each
    with a spread of 5), and meeting every so many steps, for the one whose lengths summed longer."""
    until = t.progress.position + steps * t.config.train.bptt
    while True:
        try:
            with t.random_stream:
                nll = t.train_step()
        except TrainingStopped as e:
            return e
        t.after_step(nll)
        if t.progress.position >= until or t.epoch_done or t.step_limit_reached or t.stop_signal:
            return None


def steps_one_by_one(trainers: list[Trainer]) -> list:
    """Each run's own step (train_step), one after another, each drawing from its own stream."""
    results = []
    for t in trainers:
        try:
            with t.random_stream:
                results.append(t.train_step())
        except TrainingStopped as e:
            results.append(e)
    return results


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.group:
        from experiment.group import run_group
        return run_group(args.group, args.group_step, args.dry_run)
    try:
        world = World.from_environment()
    except DistributedError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with contextlib.ExitStack() as held:     # the other processes and the run directory's lock
        try:
            held.enter_context(world.joined())
            prepared = on_every_rank(world, prepare_run, args, world, held)
            if prepared is None:                 # --dry-run
                return 0
            trainer = on_every_rank(world, start_trainer, prepared, world)
        except DistributedError as e:            # this process could not join the others
            print(f"error: {e}", file=sys.stderr)
            return 2
        except RunRefused as e:
            if world.is_main:
                print(f"error: {e}", file=sys.stderr)
            return e.exit_code
        return run_training(trainer, prepared, world)


def start_trainer(run: PreparedRun, world: World, random_stream=None, label: str | None = None) -> Trainer:
    """The trainer, joined to the other processes and continued from last.pt when resuming;
    rank 0 writes config.yaml (and run.json for a new run). A group's member brings its own
    random stream and the label of its lines (experiment/group.py)."""
    run.model.to(run.device)
    world.connect(run.device)
    world.seed_random_stream(run.config.train.seed)
    trainer = Trainer(run.config, run.model, run.corpus, run.run_dir, run.device, world, label)
    if random_stream is not None:
        trainer.random_stream = random_stream
    if run.resume_ckpt is not None:
        checkpoint.load_last(trainer, run.resume_ckpt, run.run_dir / "last.pt")   # shapes, finite weights checked
    elif run.config.train.init_from:
        trainer.validate_starting_weights()
    # A finished run resumed has nothing to train: its directory stays as the run left it.
    if world.is_main and not (run.resume_ckpt is not None and trainer.progress.finished):
        keep_epochs(run.run_dir / "metrics.jsonl", completed=trainer.progress.epoch - 1)
        (run.run_dir / GROUP_EXIT).unlink(missing_ok=True)     # an earlier sitting's, in a group
        write_text_atomic(run.run_dir / "config.yaml", run.config.to_yaml())
        record_run(run, world, trainer.progress.epoch)
    return trainer


def record_run(run: PreparedRun, world: World, epoch: int) -> None:
    """run.json of a new run, with the code it starts on; a resumed run's gets one more "code"
    entry where this sitting's code differs from the last one's (the epoch it took over at)."""
    path = run.run_dir / "run.json"
    version = {"from_epoch": epoch, **code_version()}
    if run.resume_ckpt is None or not path.is_file():
        info = {**run.identity, "device": str(run.device), "device_name": device_name(run.device),
                "world_size": world.size, "torch": torch.__version__, "code": [version],
                "corpus": run.corpus.record()}     # the text it trains on (check_same_text)
    else:
        info = json.loads(path.read_text(encoding="utf-8"))
        last = (info.get("code") or [{}])[-1]
        if all(last.get(key) == version.get(key) for key in ("commit", "modified")):
            return
        info.setdefault("code", []).append(version)
    write_text_atomic(path, json.dumps(info, indent=1) + "\n")


def run_training(trainer: Trainer, run: PreparedRun, world: World) -> int:
    """Train to the end; rank 0 reports (every rank takes the same decisions)."""
    config, run_dir = run.config, run.run_dir
    if world.is_main:
        report_start(run, world, trainer.progress, count_parameters(trainer.model))
    if config.run.tensorboard and world.is_main and not trainer.progress.finished:
        trainer.run_log.open_tensorboard(trainer.progress.step)
    try:
        stopped = train_runs([trainer], steps_one_by_one)[trainer]
        if stopped is not None:
            if world.is_main:
                print(f"stopped: {stopped}", file=sys.stderr)
            return stopped.exit_code
    except (RunDirectoryError, OSError) as e:          # a full disk, a vanished directory
        reason = e if isinstance(e, RunDirectoryError) else f"cannot write into {run_dir} ({e.strerror or e})"
        print(f"error: {reason}; training stopped at step {trainer.progress.step}", file=sys.stderr)
        return 1
    except RuntimeError as e:
        if not world.distributed:
            raise
        print(lost_process_message(e, world, trainer.progress.step, run_dir), file=sys.stderr)
        return 1
    finally:
        trainer.run_log.close()
    if world.is_main:
        print(finish_message(trainer.progress, config, run_dir, world))
    return 0


if __name__ == "__main__":
    keep_training_without_a_reader()
    run_script(main, exit_process, one_process=False)     # a stop before training starts: one line (nothing to save)
