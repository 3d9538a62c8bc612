"""Train an AWD-LSTM language model with a pluggable output head (docs/reference.md sections 2 and 3).

    python train.py configs/ptb/softmax.yaml                    # train the PTB Softmax baseline
    python train.py configs/ptb/softmax.yaml train.lr=30 run.dir=runs/x
    python train.py configs/ptb/softmax.yaml --dry-run          # resolved config + param count
    python train.py --resume runs/x                             # continue an interrupted run
    python train.py --finetune runs/x                           # AWD-LSTM's second stage
    torchrun --nproc_per_node 4 train.py configs/wt2/mos.yaml   # one run on 4 GPUs (DDP)

One optimizer step:
  1. draw seq_len (variable BPTT) and scale every param group's lr by seq_len / bptt;
  2. for each column chunk of `small_batch_size` sequences (gradient accumulation): forward
     from that chunk's carried (detached) hidden state, loss = NLL + AR + TAR, backward
     (each chunk is its own forward, so it draws its own dropout masks, as in the MoS code);
  3. clip the global gradient norm, take the SGD / ASGD step; stop (exit code 3, before
     anything is saved) if the loss, the gradient norm or any weight is non-finite.
One epoch: steps over the whole training stream, then validation (on the averaged weights
once ASGD runs), the best-by-validation checkpoint, the NT-/ET-ASGD switch, last.pt.

Under torchrun (experiment/distributed.py) each of N processes owns an equal block of the batch's
columns and cuts it into chunks of `small_batch_size`; each chunk's loss keeps its weight, its
share of the whole batch, and the gradients are summed across processes before step 3, which
every process then takes alike. Rank 0 validates and writes the run directory.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import re
import signal
import sys
import time
from pathlib import Path
from typing import NamedTuple

import torch
from tqdm import tqdm

from data import DataError, load_corpus
from data.batching import SequenceLengthSampler, batchify, get_batch
from experiment import checkpoint
from experiment.averaged_sgd import AveragedSGD
from experiment.checkpoint import CheckpointError
from experiment.config import Config, ConfigError, load_config, parse_override
from experiment.distributed import DistributedError, World, exit_process
from experiment.evaluation import evaluate_nll, perplexity
from experiment.loading import keep_freed_host_memory, set_deterministic, set_float32_precision
from experiment.progress import EpochProgress, TrainingProgress
from experiment.run_directory import RunDirectoryError, RunLock, finetune_overrides, write_text_atomic
from launch.runs import run_name
from model import build_model, count_parameters


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


def extremes(tensors) -> torch.Tensor:
    """The smallest and largest entry of every tensor: all finite exactly when every entry is
    (aminmax propagates NaN; unlike a norm it cannot overflow, and it is as cheap on a CPU)."""
    return torch.stack([value for t in tensors for value in torch.aminmax(t.detach())])


def resume_command(run_dir: Path, world: World) -> str:
    if not world.distributed:
        return f"python train.py --resume {run_dir}"
    return f"torchrun (with {world.size} processes in all) train.py --resume {run_dir}"


def describe_last_checkpoint(run_dir: Path) -> str:
    """Which checkpoint a stopped run can be continued from, read from the file itself."""
    path = run_dir / "last.pt"
    if not path.is_file():
        return f"no checkpoint has been written yet (none in {run_dir})"
    try:
        progress = TrainingProgress.read(path)
    except Exception:
        return f"{path} is untouched (but not readable as a checkpoint)"
    return f"the last checkpoint, {path} (epoch {progress.epoch}, step {progress.step}), is untouched"


def column_chunks(batch_size: int, small_batch_size: int) -> list[tuple[int, int]]:
    return [(s, min(s + small_batch_size, batch_size)) for s in range(0, batch_size, small_batch_size)]


class Trainer:
    def __init__(self, config: Config, model, corpus, run_dir: Path, device: torch.device,
                 world: World | None = None):
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
        self.optimizer = self.make_optimizer(AveragedSGD if averaging_from_start else torch.optim.SGD)
        self.params = [p for group in self.optimizer.param_groups for p in group["params"]]
        # Where training stands, all of it saved in last.pt so a resumed run continues exactly.
        self.progress = TrainingProgress(asgd_start_epoch=1 if averaging_from_start else None)
        self.signal_received = None    # set by the signal handler
        self.stop_signal = None        # the signal that stops training, agreed by every rank
        self.writer = None

    # ------------------------------------------------------------------ optimizer
    def make_optimizer(self, kind):
        """SGD or AveragedSGD over the model, with head parameter groups that have their own lr."""
        t = self.config.train
        extra = self.model.head.extra_param_groups()
        special = {id(p) for group in extra for p in group["params"]}
        main = [p for p in self.model.parameters() if p.requires_grad and id(p) not in special]
        groups = [{"params": main, "lr": t.lr}] + [dict(g) for g in extra]
        for group in groups:
            group["base_lr"] = group["lr"]
        if kind is torch.optim.SGD:
            return torch.optim.SGD(groups, lr=t.lr, weight_decay=t.wdecay)
        return AveragedSGD(groups, lr=t.lr, weight_decay=t.wdecay)

    @property
    def averaging(self) -> bool:
        return isinstance(self.optimizer, AveragedSGD)

    def non_monotone(self, val_loss: float) -> bool:
        """[AWD] Algorithm 1: more than `nonmono` losses recorded and the new one is worse
        than the best of all but the last `nonmono` (val_history does not hold val_loss yet)."""
        n, history = self.config.train.nonmono, self.progress.val_history
        return len(history) > n and val_loss > min(history[:-n])

    def should_switch_to_asgd(self, val_loss: float) -> bool:
        t = self.config.train
        if self.averaging or t.asgd_trigger in ("never", "start"):
            return False
        if t.asgd_trigger == "et":
            return self.progress.epoch >= t.asgd_switch_epoch
        return self.non_monotone(val_loss)

    # ------------------------------------------------------------------ one step
    def train_step(self) -> float:
        t, p = self.config.train, self.progress
        seq_len = self.sampler.sample()
        for group in self.optimizer.param_groups:
            group["lr"] = group["base_lr"] * seq_len / t.bptt
        inputs, targets = get_batch(self.train_data, p.position, seq_len)
        self.training_model.train()
        self.optimizer.zero_grad(set_to_none=True)
        totals = torch.zeros(2, device=self.device)        # (NLL, loss) of this process's chunks
        for c, (start, end) in enumerate(self.chunks):
            with self.world.accumulating(self.training_model, last_chunk=c == len(self.chunks) - 1):
                out = self.training_model(inputs[:, start:end], detach(p.hidden[c]), targets[:, start:end])
                p.hidden[c] = out.hidden
                nll, loss = regularized_loss(out, t.alpha, t.beta)
                weight = (end - start) / t.batch_size       # the chunk's share of the whole batch
                loss = loss * weight
                loss.backward()
            totals += torch.stack([nll.detach() * weight, loss.detach()])
        if t.clip > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, t.clip)
        else:
            grad_norm = global_norm([p.grad for p in self.params if p.grad is not None])
        self.optimizer.step()
        # One device sync per step for every check: a finite loss can still give an infinite
        # gradient, and a finite gradient times a huge lr can still give infinite weights. Under
        # torchrun the same collective tells every rank the whole batch's loss, any rank's
        # non-finite value and any rank's stop signal, so all take the same decisions.
        checks = torch.cat([totals, grad_norm.reshape(1), extremes(self.params)])
        checks, self.stop_signal = self.world.agree_on_step(checks, self.signal_received)
        step_nll, step_loss, norm = checks[:3]
        if not all(map(math.isfinite, checks)):
            raise TrainingStopped(self.non_finite_message(step_loss, norm), 3)
        tokens = targets.numel() * self.world.size
        p.step += 1
        p.position += seq_len        # the sampled length, as in the original code
        p.epoch_nll_sum += step_nll * tokens
        p.epoch_tokens += tokens
        return step_nll

    def non_finite_message(self, loss: float, grad_norm: float) -> str:
        if not math.isfinite(loss):
            what = f"non-finite loss ({loss})"
        elif not math.isfinite(grad_norm):
            what = f"non-finite gradient norm ({grad_norm}) with a finite loss ({loss:.4g})"
        else:
            what = (f"non-finite weights after the update (gradient norm {grad_norm:.4g}, loss "
                    f"{loss:.4g}; is train.lr too large?)")
        return (f"{what} at step {self.progress.step + 1} (epoch {self.progress.epoch}); nothing of this step was "
                f"saved; {describe_last_checkpoint(self.run_dir)}")

    # ------------------------------------------------------------------ one epoch
    def train_epoch(self) -> bool:
        """Train to the end of the epoch; False if run.max_steps or a signal stopped it first."""
        run, p = self.config.run, self.progress
        if p.hidden is None:
            p.hidden = [self.model.init_hidden(end - start) for start, end in self.chunks]
        steps = self.train_data.size(0)
        display = (EpochProgress(self.config, p.epoch, p.step, p.position, steps - 2)
                   if self.world.is_main else SilentProgress())
        started = time.time()
        try:
            while p.position < steps - 1 - 1:
                if (run.max_steps and p.step >= run.max_steps) or self.stop_signal:
                    p.epoch_seconds += time.time() - started
                    self.save_last()
                    return False
                nll = self.train_step()
                mean_nll = display.update(p.step, p.position, nll)
                if mean_nll is not None:
                    self.scalar("train/step_loss", mean_nll)
                # Not after the epoch's last step: end_epoch saves last.pt right after validating,
                # and a checkpoint at the step where the epoch's results are logged would leave
                # them in TensorBoard (purge_step = step + 1) if the run were killed in between.
                if (run.checkpoint_every_steps and p.step % run.checkpoint_every_steps == 0
                        and p.position < steps - 2):
                    p.epoch_seconds += time.time() - started
                    started = time.time()
                    self.save_last()
        finally:
            display.close()
        p.epoch_seconds += time.time() - started
        return True

    def end_epoch(self) -> None:
        """Validate, keep the best model, maybe switch to ASGD, log, write last.pt."""
        t, p = self.config.train, self.progress
        val_loss = self.validate()
        if val_loss < p.best_val:
            p.best_val = val_loss
        optimizer_name = "ASGD" if self.averaging else "SGD"
        train_nll = p.epoch_train_nll
        record = {"epoch": p.epoch, "step": p.step, "optimizer": optimizer_name,
                  "lr": t.lr, "seconds": round(p.epoch_seconds, 3),
                  "train_loss": train_nll, "train_ppl": perplexity(train_nll),
                  "val_loss": val_loss, "val_ppl": perplexity(val_loss),
                  "best_val_ppl": perplexity(p.best_val)}
        if self.should_switch_to_asgd(val_loss):
            self.optimizer = self.make_optimizer(AveragedSGD)
            p.asgd_start_epoch = p.epoch + 1
            record["switched_to_asgd"] = True
        elif t.early_stop_nonmono and self.averaging and self.non_monotone(val_loss):
            p.finished = True             # finetuning's end ([AWD] finetune.py)
            record["early_stop"] = True
        p.val_history.append(val_loss)
        if self.world.is_main:
            self.log_epoch(record)
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
                    self.save_best(val_loss)
        return self.world.broadcast(val_loss)

    def fit(self) -> None:
        previous_handlers = self.install_signal_handlers()
        try:
            while not self.progress.finished:
                if not self.train_epoch():
                    break
                self.end_epoch()
                self.stop_signal = self.world.agree_on_signal(self.signal_received)
                if self.stop_signal:
                    break
        finally:
            for signum, handler in previous_handlers.items():
                signal.signal(signum, handler)
        if self.stop_signal:
            raise TrainingStopped(f"stopped by {signal.Signals(self.stop_signal).name} at step "
                                  f"{self.progress.step}; saved {self.run_dir / 'last.pt'}; continue with "
                                  f"{resume_command(self.run_dir, self.world)}", 128 + self.stop_signal)

    # ------------------------------------------------------------------ feedback
    def scalar(self, name: str, value: float) -> None:
        if self.writer is not None:
            self.writer.add_scalar(name, value, self.progress.step)

    def log_epoch(self, record: dict) -> None:
        line = (f"epoch {record['epoch']:4d} | step {record['step']:7d} | "
                f"train ppl {record['train_ppl']:8.2f} | valid ppl {record['val_ppl']:8.2f} | "
                f"lr {record['lr']:g} | {record['seconds']:7.1f} s | {record['optimizer']}"
                + (" | switching to ASGD" if record.get("switched_to_asgd") else "")
                + (" | no longer improving: done" if record.get("early_stop") else ""))
        tqdm.write(line)
        sys.stdout.flush()                 # a log file shows the epoch now, not at exit
        with open(self.run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        for key in ("train_ppl", "val_ppl", "seconds"):
            self.scalar(f"epoch/{key}", record[key])
        # The optimizer this epoch trained with, as metrics.jsonl says (not the one it switched to).
        self.scalar("epoch/asgd", float(record["optimizer"] == "ASGD"))

    def install_signal_handlers(self) -> dict:
        """SIGTERM / Ctrl-C: finish the current step, save last.pt, exit. A second one kills a
        single process; under torchrun a signal can come twice (from the scheduler and from
        torchrun, which passes on what it receives), so it does not: torchrun's SIGKILL after
        its --shutdown_timeout is the hard stop."""
        def handler(signum, frame):
            self.signal_received = signum
            if not self.world.distributed:
                signal.signal(signum, signal.SIG_DFL)
        return {signum: signal.signal(signum, handler) for signum in (signal.SIGINT, signal.SIGTERM)}

    # ------------------------------------------------------------------ checkpoints
    def save_best(self, val_loss: float) -> None:
        checkpoint.save_atomic({
            "format": checkpoint.FORMAT, "kind": "best", "config": self.config.to_dict(),
            **self.vocab, "model": self.model.state_dict(),
            "epoch": self.progress.epoch, "step": self.progress.step, "val_loss": val_loss,
            "averaged": self.averaging}, self.run_dir / "best.pt")

    def save_last(self) -> None:
        """last.pt, written by rank 0 with every rank's random-number state and hidden states
        (the hidden states in rank order: those of the single-process run's chunks)."""
        p = self.progress
        hidden = None if p.hidden is None else [[(h.cpu(), c.cpu()) for h, c in chunk] for chunk in p.hidden]
        ranks = self.world.gather((checkpoint.rng_state(self.sampler, self.device), hidden))
        if not self.world.is_main:
            return
        rngs, hiddens = zip(*ranks)
        hidden = None if p.hidden is None else [chunk for rank_hidden in hiddens for chunk in rank_hidden]
        checkpoint.save_atomic({
            "format": checkpoint.FORMAT, "kind": "last", "config": self.config.to_dict(),
            **self.vocab, "model": self.model.state_dict(),
            "optimizer": {"averaged": self.averaging, "state": self.optimizer.state_dict()},
            "progress": dataclasses.replace(p, hidden=hidden).to_dict(),
            "world_size": self.world.size, "rng": rngs[0], "rng_of_other_ranks": list(rngs[1:])},
            self.run_dir / "last.pt")

    def load_last(self, ckpt: dict, path: Path) -> None:
        """Continue from last.pt (saved by as many processes as this run has: see
        check_world_size), each rank with its own random numbers and hidden states."""
        checkpoint.load_model_state(self.model, ckpt["model"], path)
        kind = AveragedSGD if ckpt["optimizer"]["averaged"] else torch.optim.SGD
        self.optimizer = self.make_optimizer(kind)
        self.optimizer.load_state_dict(ckpt["optimizer"]["state"])
        self.progress = TrainingProgress.from_dict(ckpt["progress"], self.device)
        if self.progress.hidden is not None:
            first = self.world.rank * len(self.chunks)
            self.progress.hidden = self.progress.hidden[first: first + len(self.chunks)]
        checkpoint.restore_rng_state(rank_rng_state(ckpt, self.world.rank), self.sampler, self.device, path)


class SilentProgress:
    """What the ranks other than 0 show of an epoch: nothing (rank 0 reports for all)."""

    def update(self, step: int, position: int, nll: float) -> None:
        return None

    def close(self) -> None:
        pass


class averaged_weights:
    """Context manager: the model holds the ASGD averages inside, its own weights after."""

    def __init__(self, model, optimizer):
        self.model, self.optimizer, self.saved = model, optimizer, []

    def __enter__(self):
        if isinstance(self.optimizer, AveragedSGD):
            with torch.no_grad():
                for p in self.model.parameters():
                    average = self.optimizer.averaged(p)
                    if average is not p:
                        self.saved.append((p, p.detach().clone()))
                        p.copy_(average)
        return self

    def __exit__(self, *exc):
        with torch.no_grad():
            for p, original in self.saved:
                p.copy_(original)
        self.saved = []
        return False


# ---------------------------------------------------------------------- command line

def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Train an AWD-LSTM language model with a pluggable output head.",
        epilog="Overrides are key=value with dotted keys, e.g. train.lr=30 head.k=3 "
               "run.max_steps=100 run.device=cpu. See README.md for every key.")
    parser.add_argument("config", nargs="?", help="config file, e.g. configs/ptb/softmax.yaml")
    parser.add_argument("overrides", nargs="*", help="key=value overrides")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last.pt")
    parser.add_argument("--finetune", metavar="RUN_DIR",
                        help="second training stage: start from RUN_DIR/best.pt with ASGD from the "
                             "first step until NT-ASGD's rule says it stopped improving; writes "
                             "RUN_DIR/finetune unless run.dir is given")
    parser.add_argument("--dry-run", action="store_true",
                        help="build data and model, print the resolved config and a JSON summary, exit")
    parser.add_argument("--data-dir", help="folder holding ptb/ and wikitext-2/ (default: $AWD_DATA_DIR)")
    args = parser.parse_intermixed_args(argv)
    if args.config and "=" in args.config:   # `train.py --resume DIR key=value`: no config file
        args.overrides.insert(0, args.config)
        args.config = None
    if args.data_dir:
        args.overrides.append(f"data.data_dir={args.data_dir}")
    if sum(map(bool, (args.config, args.resume, args.finetune))) != 1:
        parser.error("give one of: a config file, --resume RUN_DIR, --finetune RUN_DIR")
    return args


RESUMABLE_OVERRIDES = ("run.", "data.data_dir")


def resolve_run(args) -> tuple[Config, Path, dict | None]:
    """The config, the run directory and (when resuming) the checkpoint to continue from."""
    if args.resume:
        run_dir = Path(args.resume)
        ckpt_path = run_dir / "last.pt"
        ckpt = checkpoint.load(ckpt_path)
        checkpoint.require_kind(ckpt, "last", ckpt_path, "--resume continues a run from the "
                                "last.pt train.py writes")
        for text in args.overrides:
            keys, value = parse_override(text)
            key = ".".join(keys)
            if key == "run.dir" and Path(str(value)).resolve() != run_dir.resolve():
                raise ConfigError(f"override {text!r}: a resumed run stays in {run_dir}; copy "
                                  f"the directory and resume the copy to continue it elsewhere")
            if not key.startswith(RESUMABLE_OVERRIDES):
                raise ConfigError(f"override {text!r}: only run.* and data.data_dir can change "
                                  f"when resuming; {key} is fixed by {ckpt_path}")
        config = load_config(None, list(args.overrides) + [f"run.dir={run_dir}"], base=ckpt["config"])
        return config, run_dir, ckpt
    if args.finetune:
        source = Path(args.finetune)
        config = load_config(source / "config.yaml", finetune_overrides(source) + list(args.overrides))
        return config, Path(config.run.dir), None
    config = load_config(args.config, args.overrides)
    if config.run.dir:
        run_dir = Path(config.run.dir)
    else:
        run_dir = Path("runs") / run_name(config.data.dataset, Path(args.config), (), config.train.seed)
        config = load_config(args.config, list(args.overrides) + [f"run.dir={run_dir}"])
    return config, run_dir, None


def run_to_resume(run_dir: Path) -> RunLock:
    """The lock of a run directory that holds a last.pt (taken before reading it: no other
    process writes it then)."""
    if not (run_dir / "last.pt").is_file():
        raise CheckpointError(f"{run_dir / 'last.pt'}: checkpoint not found; --resume needs a "
                              f"run directory in which train.py saved last.pt")
    return RunLock(run_dir)


def check_splits(config: Config, corpus) -> None:
    """Every split long enough for its batch size (the test split's is used by evaluate.py
    after training: better to hear it now than after the last epoch)."""
    t = config.train
    corpus.check_batchable("train", t.batch_size, "train.batch_size", min_rows=3)
    corpus.check_batchable("valid", t.eval_batch_size, "train.eval_batch_size")
    corpus.check_batchable("test", t.test_batch_size, "train.test_batch_size")


def run_identity(config: Config, model, corpus) -> dict:
    """What run.json records about a run, and what a checkpoint continuing it must match."""
    return {"params": count_parameters(model), "vocab_size": corpus.vocab_size,
            "dataset": config.data.dataset, "head": config.head_name, "seed": config.train.seed}


def check_same_run(run_dir: Path, ckpt_path: Path, identity: dict) -> None:
    """Refuse a last.pt that is not the run run.json describes (copied from another run)."""
    path = run_dir / "run.json"
    if not path.is_file():
        return
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e}); it should describe the run") from None
    for key, value in identity.items():
        if key in saved and saved[key] != value:
            raise CheckpointError(f"{ckpt_path}: {key} is {value!r} in the checkpoint but "
                                  f"{saved[key]!r} in {path}: it belongs to another run")


def check_world_size(ckpt: dict, world: World, path: Path) -> None:
    """A last.pt holds the random-number and hidden states of as many processes as trained it."""
    saved = ckpt.get("world_size", 1)
    if saved != world.size:
        raise CheckpointError(f"{path}: saved by {saved} process(es), resumed by {world.size}; "
                              f"resume it with {saved} (torchrun: --nnodes times --nproc_per_node; "
                              f"python train.py: 1): each process's random numbers and hidden "
                              f"states are in the checkpoint")


def rank_rng_state(ckpt: dict, rank: int) -> dict:
    """The random-number state last.pt holds for process `rank`."""
    return [ckpt["rng"], *ckpt.get("rng_of_other_ranks", [])][rank]


def load_initial_weights(model, path: str, corpus) -> None:
    try:
        init = checkpoint.load(path)
        checkpoint.check_vocabulary(init, corpus, path)
        checkpoint.load_model_state(model, init["model"], path)
    except CheckpointError as e:
        raise CheckpointError(f"train.init_from: {e}") from None


def keep_epochs(path: Path, completed: int) -> None:
    """Cut metrics.jsonl to the epochs the checkpoint has completed (a run killed after an
    epoch's line but before that epoch's last.pt redoes the epoch and writes the line again)."""
    if not path.is_file():
        return
    lines, kept = path.read_text(encoding="utf-8").splitlines(keepends=True), []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            break                      # a line cut short by a crash: it and what follows go
        if not line.endswith("\n") or record.get("epoch", completed + 1) > completed:
            break
        kept.append(line)
    if len(kept) < len(lines):
        write_text_atomic(path, "".join(kept))


def warn_if_cpu_by_default(config: Config, device: torch.device, params: int) -> None:
    if config.run.device == "auto" and device.type == "cpu" and params > 1_000_000:
        # The figures: benchmarks/bench_step.py on a 2-core VM (1.6 s a step, ~680 steps an
        # epoch) and [SB]'s ~55 s an epoch on a V100.
        print(f"warning: run.device=auto found no usable CUDA GPU, so this {params / 1e6:.1f}M-"
              f"parameter model trains on the CPU, many times slower than on a GPU (the PTB "
              f"Softmax model: ~18 min an epoch on 2 CPU cores, ~1 min on a V100); the progress "
              f"lines show the real pace; set run.device=cpu to do this on purpose", file=sys.stderr)


class PreparedRun(NamedTuple):
    config: Config
    run_dir: Path
    device: torch.device
    corpus: object
    model: torch.nn.Module
    identity: dict
    resume_ckpt: dict | None


class RunRefused(Exception):
    """A failure of some rank before training, raised on every rank (rank 0 reports it)."""


SETUP_ERRORS = (ConfigError, CheckpointError, DataError, RunDirectoryError)


def on_every_rank(world: World, step, *args):
    """step(*args), then RunRefused on every rank if it failed on any (in one process: if it
    failed), so that no rank goes on to wait for one that has stopped."""
    try:
        result, error = step(*args), None
    except SETUP_ERRORS as e:
        result, error = None, str(e)
    error = world.first_error(error)
    if error is not None:
        raise RunRefused(error)
    return result


def main(argv=None) -> int:
    args = parse_args(argv)
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
            return 2
        return run_training(trainer, prepared, world)


def prepare_run(args, world: World, held: contextlib.ExitStack) -> PreparedRun | None:
    """The run, checked before anything is written into the run directory (rank 0 takes its
    lock); None after --dry-run's report."""
    if args.resume and world.is_main:
        held.enter_context(run_to_resume(Path(args.resume)))
    config, run_dir, resume_ckpt = resolve_run(args)
    device = world.device(config.run.device)
    corpus = load_corpus(config.data.dataset, config.data.data_dir,
                         allow_modified=config.data.allow_modified_corpus)
    check_splits(config, corpus)
    world.columns(config.train.batch_size)          # an equal share of the batch for each process
    set_float32_precision(config.run.tf32)
    set_deterministic(config.run.deterministic)
    keep_freed_host_memory()
    torch.manual_seed(config.train.seed)
    model = build_model(config, corpus.vocab_size)
    identity = run_identity(config, model, corpus)
    if args.dry_run:
        if world.is_main:
            print(config.to_yaml(), end="")
            print(json.dumps({**identity, "device": str(device)}))
        return None
    if resume_ckpt is None and config.train.init_from:
        load_initial_weights(model, config.train.init_from, corpus)
    if resume_ckpt is not None:
        ckpt_path = run_dir / "last.pt"
        checkpoint.check_vocabulary(resume_ckpt, corpus, ckpt_path)
        check_same_run(run_dir, ckpt_path, identity)
        check_world_size(resume_ckpt, world, ckpt_path)
        checkpoint.training_device_cuda_state(rank_rng_state(resume_ckpt, world.rank), device, ckpt_path)
        checkpoint.check_finite(checkpoint.optimizer_tensors(resume_ckpt), ckpt_path, "optimizer state")
    elif world.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        held.enter_context(RunLock(run_dir))
        if (run_dir / "last.pt").exists():
            raise RunDirectoryError(f"{run_dir} already holds a run; continue it with python "
                                    f"train.py --resume {run_dir} or choose another run.dir")
    return PreparedRun(config, run_dir, device, corpus, model, identity, resume_ckpt)


def start_trainer(run: PreparedRun, world: World) -> Trainer:
    """The trainer, joined to the other processes and continued from last.pt when resuming;
    rank 0 writes config.yaml (and run.json for a new run)."""
    run.model.to(run.device)
    world.connect(run.device)
    world.seed_random_stream(run.config.train.seed)
    trainer = Trainer(run.config, run.model, run.corpus, run.run_dir, run.device, world)
    if run.resume_ckpt is not None:
        trainer.load_last(run.resume_ckpt, run.run_dir / "last.pt")   # shapes and finite weights checked
    if world.is_main:
        keep_epochs(run.run_dir / "metrics.jsonl", completed=trainer.progress.epoch - 1)
        write_text_atomic(run.run_dir / "config.yaml", run.config.to_yaml())
        if run.resume_ckpt is None:
            write_text_atomic(run.run_dir / "run.json", json.dumps(
                {**run.identity, "device": str(run.device), "world_size": world.size,
                 "torch": torch.__version__}, indent=1) + "\n")
    return trainer


def run_training(trainer: Trainer, run: PreparedRun, world: World) -> int:
    """Train to the end; rank 0 reports (every rank takes the same decisions)."""
    config, run_dir, device = run.config, run.run_dir, run.device
    if world.is_main:
        warn_if_cpu_by_default(config, device, count_parameters(trainer.model))
        print(f"run {run_dir} | {config.head_name} on {config.data.dataset} | "
              f"{count_parameters(trainer.model):,} parameters | device {device}"
              + (f" | {world.size} processes" if world.distributed else "")
              + (f" | resumed at epoch {trainer.progress.epoch}, step {trainer.progress.step}"
                 if run.resume_ckpt is not None else ""), flush=True)
    if config.run.tensorboard and world.is_main:
        from torch.utils.tensorboard import SummaryWriter  # imported only when used: it is slow
        # purge_step: events logged after last.pt was saved are dropped; they are logged again.
        trainer.writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=trainer.progress.step + 1,
                                       flush_secs=30)
    try:
        trainer.fit()
    except TrainingStopped as e:
        if world.is_main:
            print(f"stopped: {e}", file=sys.stderr)
        return e.exit_code
    except (RunDirectoryError, OSError) as e:          # a full disk, a vanished directory
        reason = e if isinstance(e, RunDirectoryError) else f"cannot write into {run_dir} ({e.strerror or e})"
        print(f"error: {reason}; training stopped at step {trainer.progress.step}", file=sys.stderr)
        return 1
    except RuntimeError as e:
        if not world.distributed:
            raise
        # Another process ended (a crash, a SIGKILL): the collective this one waited in failed.
        first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
        first_line = re.sub(r"^\[[^\]]*\]\s*", "", first_line)[:200]     # gloo's [file:line] prefix
        print(f"error: rank {world.rank} stopped at step {trainer.progress.step} ({first_line}); "
              f"{describe_last_checkpoint(run_dir)}", file=sys.stderr)
        return 1
    finally:
        if trainer.writer is not None:
            trainer.writer.close()
    if world.is_main:
        best = (f"best valid ppl {perplexity(trainer.progress.best_val):.2f}" if trainer.progress.val_history
                else "not validated yet")
        print(f"done: {trainer.progress.step} steps, {best}; evaluate with python evaluate.py {run_dir}")
    return 0


if __name__ == "__main__":
    exit_process(main())
