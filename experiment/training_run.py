"""A training run around train.py's algorithm: how it starts and how it stops.

Before the first step (`prepare_run`, on every process of a torchrun): which run a train.py
command line means (a new run, a finetuning, or --resume RUN_DIR, whose last.pt fixes all but
run.* and the data folder), and the checks made before anything is written into the run
directory: the splits fit their batch sizes, a last.pt belongs to the run its run.json describes
and was saved by as many processes as resume it, and its state is finite. A failure on any
process stops every process (`on_every_rank`), with one line from rank 0.

While it trains: `StopSignals` turns SIGTERM, SIGHUP or Ctrl-C into a stop after the current
step. What rank 0 says when the run starts (`report_start`) and why it stopped
(`non_finite_message`, `signal_stop_message`, `lost_process_message`), each stop naming the
checkpoint it can be continued from (`describe_last_checkpoint`, `resume_command`), and what it
says when training ends without an error (`finish_message`).
"""
from __future__ import annotations

import contextlib
import json
import math
import re
import shlex
import signal
import sys
from pathlib import Path
from typing import NamedTuple

import torch

from data import DataError, load_corpus
from data.corpus import ALLOWED_BY_CONFIG, describe_text_change, differing_splits
from evaluation.loop import perplexity
from model import count_parameters
from . import checkpoint
from .checkpoint import CheckpointError, saved_processes
from .cli import ArgumentParser, handle_stop_signal, leave_a_closed_terminal
from .config import Config, ConfigError, load_config, parse_override
from .distributed import World
from .loading import initial_model, keep_freed_host_memory, set_deterministic, set_float32_precision
from .progress import TrainingProgress, tensorboard_writer
from .run_directory import (FINETUNE_DIR, LOCK_NAME, RunDirectoryError, RunLock, check_run_dir_usable,
                            default_run_name, error_exit_code, finetune_config, folder_of_runs, held_elsewhere,
                            make_run_dir, refuse_if_in_use, trained_corpus)


def parse_args(argv=None):
    """train.py's command line."""
    parser = ArgumentParser(
        prog="train.py",
        description="Train an AWD-LSTM language model with a pluggable output head.",
        epilog="Overrides are key=value with dotted keys, e.g. train.lr=30 head.k=3 "
               "run.max_steps=100 run.device=cpu. See docs/configs.md for every key.")
    parser.add_argument("config", nargs="?", help="config file, e.g. configs/ptb/softmax.yaml")
    parser.add_argument("overrides", nargs="*", help="key=value overrides")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last.pt")
    parser.add_argument("--finetune", metavar="RUN_DIR",
                        help="second training stage: start from RUN_DIR/best.pt with ASGD from the "
                             "first step until NT-ASGD's rule says it stopped improving; writes "
                             "RUN_DIR/finetune unless run.dir is given")
    parser.add_argument("--dry-run", action="store_true",
                        help="build data and model, print the resolved config and a JSON summary, exit")
    parser.add_argument("--data-dir", help="folder holding ptb/ and wikitext-2/ (default: the config's data.data_dir, "
                                               "else $AWD_DATA_DIR, else the repository's corpora/; a corpus "
                                               "missing from the folder is downloaded into it)")
    parser.add_argument("--group", nargs="+", metavar="RUN",
                        help="train several runs in lockstep in this process, each RUN what train.py "
                             "takes for it alone, quoted: \"CONFIG key=value ...\", \"--resume RUN_DIR\" "
                             "or \"--finetune RUN_DIR\" (docs/training.md, 'Group runs')")
    parser.add_argument("--group-step", choices=("auto", "batched", "solo"), default="auto",
                        help="with --group: batched (the bodies in one batched pass; the default on "
                             "CUDA) or solo (each run's own step, side by side on the CPU's cores; "
                             "the default elsewhere)")
    args = parser.parse_intermixed_args(argv)
    if args.config and "=" in args.config:   # `train.py --resume DIR key=value`: no config file
        args.overrides.insert(0, args.config)
        args.config = None
    if args.group:
        if args.config or args.resume or args.finetune or args.overrides:
            parser.error("--group: give every run inside it (a config and its overrides, --resume "
                         "RUN_DIR or --finetune RUN_DIR, each quoted), nothing beside it")
        if args.data_dir:
            args.group = [f"{member} data.data_dir={shlex.quote(args.data_dir)}" for member in args.group]
        return args
    if args.group_step != "auto":
        parser.error("--group-step belongs to --group")
    if args.data_dir:
        args.overrides.append(f"data.data_dir={args.data_dir}")
    configs = [text for text in args.overrides if "=" not in text]
    if not (args.config or args.resume or args.finetune) and configs:
        # `train.py run.max_steps=3 configs/x.yaml`: an override before the config file
        parser.error(f"{configs[0]}: the config file comes before the overrides "
                     f"(train.py {configs[0]} key=value ...)")
    if sum(map(bool, (args.config, args.resume, args.finetune))) != 1:
        parser.error("give one of: a config file, --resume RUN_DIR, --finetune RUN_DIR, --group RUN ...")
    return args


RESUMABLE_OVERRIDES = ("run.", "data.data_dir")


def resolve_run(args) -> tuple[Config, Path, dict | None]:
    """The config, the run directory and (when resuming) the checkpoint to continue from."""
    if args.resume:
        run_dir = resume_directory(Path(args.resume), args.overrides)
        ckpt_path = run_dir / "last.pt"
        ckpt = checkpoint.load(ckpt_path)
        checkpoint.require_kind(ckpt, "last", ckpt_path, "--resume continues a run from the "
                                "last.pt train.py writes")
        config = load_config(None, list(args.overrides) + [f"run.dir={run_dir}"], base=ckpt["config"])
        return config, run_dir, ckpt
    if args.finetune:
        source = Path(args.finetune)
        if not source.is_dir():
            raise ConfigError(f"--finetune {source}: not a run directory (expected the folder of a "
                              f"trained run, holding config.yaml and best.pt)")
        if not (source / "best.pt").is_file():
            raise CheckpointError(f"--finetune {source}: the run has no validated model yet (no "
                                  f"best.pt, which finetuning starts from; train.py writes it at "
                                  f"the end of epoch 1)")
        if held_elsewhere(source / LOCK_NAME):      # its best.pt may change under the finetuning
            raise RunDirectoryError(f"--finetune {source}: the run is in use by another process "
                                    f"(training, or evaluate.py or rank.py reading it): finetune it "
                                    f"once that has ended, from its final best.pt")
        config = finetune_config(source, args.overrides)
        if Path(config.run.dir).resolve() == source.resolve():
            raise ConfigError(f"run.dir={config.run.dir}: the run being finetuned; a finetuning is a run of "
                              f"its own, written into {source / FINETUNE_DIR} unless run.dir names another folder")
        return config, Path(config.run.dir), None
    config = load_config(args.config, args.overrides)
    if config.run.dir:
        run_dir = Path(config.run.dir)
    else:
        run_dir = Path("runs") / default_run_name(config.data.dataset, Path(args.config), config.train.seed)
        config = load_config(args.config, list(args.overrides) + [f"run.dir={run_dir}"])
    return config, run_dir, None


def resume_directory(run_dir: Path, overrides) -> Path:
    """run_dir, checked as --resume's argument with its overrides before anything is read or
    locked: a directory holding last.pt, and only run.* and data.data_dir changed."""
    if run_dir.is_file():
        raise ConfigError(f"--resume {run_dir}: a file; --resume takes the run directory that holds "
                          f"last.pt ({run_dir.parent})")
    if not run_dir.is_dir():
        raise ConfigError(f"--resume {run_dir}: no such run directory")
    if what := folder_of_runs(run_dir):
        raise ConfigError(f"--resume {run_dir}: {what}; give one run's directory, "
                          f"or continue a plan's runs with sweep.py PLAN")
    if not (run_dir / "last.pt").is_file():
        raise CheckpointError(f"{run_dir / 'last.pt'}: checkpoint not found; --resume needs a run directory "
                              f"in which train.py saved last.pt" + (
                                  " (this run has not saved one yet: train.py writes it at the end of each "
                                  "epoch and when stopped; if it is not training, start it again with its "
                                  "train.py command)" if checkpoint.saved_nothing_yet(run_dir) else ""))
    for text in overrides:
        keys, value = parse_override(text)
        key = ".".join(keys)
        if key == "run.dir" and Path(str(value)).resolve() != run_dir.resolve():
            raise ConfigError(f"override {text!r}: a resumed run stays in {run_dir}; copy "
                              f"the directory and resume the copy to continue it elsewhere")
        if not key.startswith(RESUMABLE_OVERRIDES):
            raise ConfigError(f"override {text!r}: only run.* and data.data_dir can change "
                              f"when resuming; {key} is fixed by {run_dir / 'last.pt'} (to train "
                              f"on from its best model: train.py --finetune {run_dir})")
    return run_dir


def run_to_resume(run_dir: Path, overrides) -> RunLock:
    """The lock of a run directory that holds a last.pt (taken before reading it: no other
    process writes it then), after its arguments are checked (a refusal leaves it untouched)."""
    return RunLock(resume_directory(run_dir, overrides))


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


def check_belongs_to_run(run_dir: Path, ckpt_path: Path, identity: dict) -> None:
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


def check_same_text(run_dir: Path, corpus) -> None:
    """Refuse to resume on other training or validation text than the run's first sittings read
    (run.json's corpus record): a modified corpus of the same words passes the vocabulary check,
    and an epoch, the NT-ASGD switch and best.pt would then rest on two texts, recorded as one."""
    trained, used = trained_corpus(run_dir), corpus.record()
    changed = differing_splits(trained, used, ("train", "valid"))
    if changed:
        raise DataError(f"{run_dir}: the run trained on other text: {describe_text_change(trained, used, changed)}; "
                        f"resume it on the folder it trained on (data.data_dir or AWD_DATA_DIR), or "
                        f"start a new run on this text")


def check_world_size(ckpt: dict, world: World, path: Path) -> None:
    """A last.pt holds the random-number and hidden states of as many processes as trained it."""
    saved = ckpt.get("world_size", 1)
    if saved != world.size:
        raise CheckpointError(f"{path}: saved by {saved} process(es), resumed by {world.size}; "
                              f"resume it with {saved} (torchrun: --nnodes times --nproc_per_node; "
                              f"python train.py: 1): each process's random numbers and hidden "
                              f"states are in the checkpoint")


# What sets a model's parameters and their shapes, beside the vocabulary.
MODEL_SHAPE_KEYS = ("head.name", "model.emsize", "model.nhid", "model.nhidlast", "model.nlayers")


def load_initial_weights(model, path: str, corpus, config: Config) -> None:
    if Path(path).is_dir():
        raise CheckpointError(f"train.init_from: {path} is a folder; give a checkpoint file, e.g. "
                              f"{Path(path) / 'best.pt'}")
    init = None
    try:
        init = checkpoint.load(path)
        checkpoint.check_vocabulary(init, corpus, path)
        checkpoint.load_model_state(model, init["model"], path)
    except CheckpointError as e:
        # A list of missing keys or a mismatched shape says what does not fit, not why: the run
        # it comes from has another head or size, which is what a person changes.
        why = "" if init is None else model_difference(init.get("config") or {}, config)
        raise CheckpointError(f"train.init_from: {e}{why}") from None


def model_difference(saved: dict, config: Config) -> str:
    """Where a checkpoint's config (`saved`) builds another model than `config` ("; it is of a run
    with head.name=softmax, this config has head.name=mos"), or "" where they agree."""
    def value(settings: dict, key: str):
        section, name = key.split(".")
        return (settings.get(section) or {}).get(name)

    wanted = config.to_dict()
    differing = [key for key in MODEL_SHAPE_KEYS if saved and value(saved, key) != value(wanted, key)]
    if not differing:
        return ""

    def listed(settings: dict) -> str:
        return " ".join(f"{key}={value(settings, key)}" for key in differing)
    return f"; it is of a run with {listed(saved)}, this config has {listed(wanted)}"


def warn_if_cpu_by_default(config: Config, device: torch.device, params: int) -> None:
    if config.run.device == "auto" and device.type == "cpu" and params > 1_000_000:
        # A model this size trains many times slower on a CPU: say so, in case a GPU was meant.
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
    """A failure of some rank before training, raised on every rank (rank 0 reports it);
    `exit_code` is train.py's (error_exit_code)."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


SETUP_ERRORS = (ConfigError, CheckpointError, DataError, RunDirectoryError)


def on_every_rank(world: World, step, *args):
    """step(*args), then RunRefused on every rank if it failed on any (in one process: if it
    failed), so that no rank goes on to wait for one that has stopped."""
    try:
        result, error, exit_code = step(*args), None, 2
    except SETUP_ERRORS as e:
        result, error, exit_code = None, str(e), error_exit_code(e)
    error = world.first_error(error)
    if error is not None:
        raise RunRefused(error, exit_code)
    return result


def prepare_run(args, world: World, held: contextlib.ExitStack) -> PreparedRun | None:
    """The run, checked before anything is written into the run directory (rank 0 takes its
    lock); None after --dry-run's report."""
    if args.resume and world.is_main:
        held.enter_context(run_to_resume(Path(args.resume), args.overrides))
    config, run_dir, resume_ckpt = resolve_run(args)
    if resume_ckpt is not None:
        # Before the batch's split below: a count that does not divide train.batch_size would
        # be told to change the batch size, which a resume cannot; the count saved is the fix.
        check_world_size(resume_ckpt, world, run_dir / "last.pt")
    if config.run.tensorboard and world.is_main:      # rank 0 writes TensorBoard's scalars
        tensorboard_writer()
    device = world.device(config.run.device)
    # A resumed run cannot change data.allow_modified_corpus (nor its text: check_same_text), so
    # its refusal of a modified file does not suggest setting it.
    corpus = load_corpus(config.data.dataset, config.data.data_dir,
                         allow_modified=config.data.allow_modified_corpus,
                         allowed_by=ALLOWED_BY_CONFIG if resume_ckpt is None else None)
    check_splits(config, corpus)
    world.columns(config.train.batch_size)          # an equal share of the batch for each process
    set_float32_precision(config.run.tf32)
    set_deterministic(config.run.deterministic)
    keep_freed_host_memory()
    model = initial_model(config, corpus)
    identity = run_identity(config, model, corpus)
    if resume_ckpt is None and world.is_main:
        check_run_dir_usable(run_dir)
        if what := folder_of_runs(run_dir):       # `run.dir=runs`, meant as "under runs/"
            raise RunDirectoryError(f"run.dir {run_dir}: {what}; give the run a folder of its own, "
                                    f"e.g. run.dir={run_dir / 'NAME'}")
    if resume_ckpt is None and config.train.init_from:      # (a dry run checks the checkpoint too)
        load_initial_weights(model, config.train.init_from, corpus, config)
    if args.dry_run:
        if world.is_main:
            if resume_ckpt is None:    # what the run itself would refuse: a run.dir in use, holding a run
                refuse_if_in_use(run_dir)
                check_new_run_dir(run_dir)
            say_what_settings_leave_out(config)
            print(config.to_yaml(), end="")
            print(json.dumps({**identity, "device": str(device)}))
        return None
    if resume_ckpt is not None:
        ckpt_path = run_dir / "last.pt"
        checkpoint.check_vocabulary(resume_ckpt, corpus, ckpt_path)
        check_belongs_to_run(run_dir, ckpt_path, identity)
        check_same_text(run_dir, corpus)
        checkpoint.training_device_cuda_state(checkpoint.rank_rng_state(resume_ckpt, world.rank), device,
                                              ckpt_path)
        checkpoint.check_finite(checkpoint.optimizer_tensors(resume_ckpt), ckpt_path, "optimizer state")
    elif world.is_main:
        make_run_dir(run_dir)
        held.enter_context(RunLock(run_dir))
        check_new_run_dir(run_dir)
    return PreparedRun(config, run_dir, device, corpus, model, identity, resume_ckpt)


def check_new_run_dir(run_dir: Path) -> None:
    """RunDirectoryError if a new run cannot start in `run_dir`: it holds another run."""
    if (run_dir / "last.pt").exists():
        if holds_a_finished_run(run_dir):     # (the same command given again, say)
            quoted = shlex.quote(str(run_dir))
            raise RunDirectoryError(f"{run_dir} already holds a finished run; evaluate it with python "
                                    f"evaluate.py {quoted}, train on from its best model with python "
                                    f"train.py --finetune {quoted}, or choose another run.dir")
        raise RunDirectoryError(f"{run_dir} already holds a run; continue it with "
                                f"{resume_command(run_dir, saved_world(run_dir / 'last.pt'))} or choose another run.dir")
    if (run_dir / "eval_best.json").exists():
        # An evaluated run's result files without its checkpoint (committed results, say): a
        # new run would start that run's metrics.jsonl over beside its old evaluation. (A run
        # killed before its first last.pt has no evaluation: the same command starts it again.)
        raise RunDirectoryError(f"{run_dir} holds an evaluated run (eval_best.json) and no "
                                f"last.pt to resume it; choose another run.dir or move it away")


def holds_a_finished_run(run_dir: Path) -> bool:
    """Whether the last.pt in `run_dir` is of a run that has finished (False where unreadable:
    the resume's own line then says why)."""
    try:
        return TrainingProgress.read(run_dir / "last.pt").finished
    except Exception:
        return False


def saved_world(path: Path) -> World:
    """The processes that saved the last.pt at `path` (checkpoint.saved_processes): one, where it
    is unreadable (the resume's own line then says why)."""
    try:
        size = saved_processes(path)
    except CheckpointError:
        size = 1
    return World(size=size, distributed=size > 1)


def resume_command(run_dir: Path, world: World) -> str:
    quoted = shlex.quote(str(run_dir))      # the line is pasted into a shell; a path may hold a space
    if not world.distributed:
        return f"python train.py --resume {quoted}"
    # Pasteable on one node; over several, any --nnodes times --nproc_per_node that makes as many.
    return (f"torchrun --standalone --nproc_per_node {world.size} train.py --resume {quoted} "
            f"({world.size} process{'es' if world.size > 1 else ''} in all)")


def signal_stop_message(signum: int, step: int, run_dir: Path, world: World) -> str:
    """Why a signal stopped the run, where it saved and how to continue it (train.py prints it
    after "stopped: ")."""
    return (f"{signal.Signals(signum).name} after step {step}; saved {run_dir / 'last.pt'}; "
            f"continue with {resume_command(run_dir, world)}")


def finish_message(progress: TrainingProgress, config: Config, run_dir: Path, world: World) -> str:
    """What rank 0 prints when training ends without an error: every epoch done, or stopped by
    run.max_steps, which says whether best.pt exists yet and what can be done next."""
    evaluate = f"evaluate with python evaluate.py {shlex.quote(str(run_dir))}"
    best = f"best valid ppl {perplexity(progress.best_val):.2f}"
    if progress.finished:
        return f"done: {progress.step} steps, {best}; {evaluate}"
    where = (f"stopped: run.max_steps={config.run.max_steps} reached (step {progress.step}, "
             f"epoch {progress.epoch} of {config.train.epochs})")
    # run.max_steps is saved with the run: a plain --resume would stop at once where it stopped.
    resume = f"continue with {resume_command(run_dir, world)} run.max_steps=null (or a larger run.max_steps)"
    if progress.val_history or (run_dir / "best.pt").is_file():   # (a finetuning's starting weights)
        return f"{where}; {best}; {evaluate} (its best.pt), or {resume}"
    return (f"{where}, before the first validation, so there is no best.pt yet; {resume}, or "
            f"evaluate the weights where it stands with python evaluate.py {shlex.quote(str(run_dir / 'last.pt'))}")


def describe_last_checkpoint(run_dir: Path) -> str:
    """Which checkpoint a stopped run can be continued from, read from the file itself."""
    path = run_dir / "last.pt"
    if not path.is_file():
        return f"no checkpoint has been written yet (none in {run_dir})"
    try:
        progress = TrainingProgress.read(path)
    except Exception:
        return f"{path} is untouched (but not readable as a checkpoint)"
    return f"the last checkpoint, {path} ({progress.saved_where}), is untouched"


def non_finite_message(loss: float, grad_norm: float, progress: TrainingProgress, run_dir: Path) -> str:
    """Why a step stopped the run (train.py's step checks its loss, gradient norm and weights)."""
    if not math.isfinite(loss):
        what = f"non-finite loss ({loss})"
    elif not math.isfinite(grad_norm):
        what = f"non-finite gradient norm ({grad_norm}) with a finite loss ({loss:.4g})"
    else:
        what = (f"non-finite weights after the update (gradient norm {grad_norm:.4g}, loss "
                f"{loss:.4g}; is train.lr too large?)")
    return (f"{what} at step {progress.step + 1} (epoch {progress.epoch}); nothing of this step was "
            f"saved; {describe_last_checkpoint(run_dir)}")


def report_start(run: PreparedRun, world: World, progress: TrainingProgress, params: int) -> None:
    """Rank 0's first line: the run, its model and device, and where a resumed run continues;
    a finetuning's starting weights (validated before the first step) on the next."""
    config, run_dir, device = run.config, run.run_dir, run.device
    warn_if_cpu_by_default(config, device, params)
    if not progress.finished:
        say_what_settings_leave_out(config)
    print(f"run {run_dir} | {config.head_name} on {config.data.dataset} | "
          f"{params:,} parameters | device {device}"
          + (f" | {world.size} process{'es' if world.size > 1 else ''}" if world.distributed else "")
          + ("" if run.resume_ckpt is None else
             f" | resumed: finished after epoch {progress.epoch - 1}, step {progress.step}" if progress.finished else
             f" | resumed at epoch {progress.epoch}, step {progress.step}"), flush=True)
    if run.resume_ckpt is None and config.train.init_from:
        print(f"starting weights ({config.train.init_from}): valid ppl "
              f"{math.exp(progress.best_val):.2f}, in best.pt until an epoch beats them", flush=True)


def say_what_settings_leave_out(config: Config) -> None:
    """On stderr, once the run is not refused: early stops that cannot act (a warning), and an
    ET-ASGD switch after the last epoch (a note: the run will not average)."""
    if unused := config.train.unused_early_stops():
        print(f"warning: {unused}", file=sys.stderr)
    if no_averaging := config.train.switch_after_the_end():
        print(f"note: {no_averaging}", file=sys.stderr)


def lost_process_message(error: RuntimeError, world: World, step: int, run_dir: Path) -> str:
    """Another process ended (a crash, a SIGKILL): the collective this one waited in failed."""
    first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    first_line = re.sub(r"^\[[^\]]*\]\s*", "", first_line)[:200]     # gloo's [file:line] prefix
    # The others' states are in last.pt too: the whole run continues from it, as after a signal.
    resume = (f"; continue with {resume_command(run_dir, world)}" if (run_dir / "last.pt").is_file() else "")
    return (f"error: rank {world.rank} stopped at step {step} ({first_line}); "
            f"{describe_last_checkpoint(run_dir)}{resume}")


class StopSignals:
    """SIGTERM, SIGHUP (a closed terminal) or Ctrl-C (SIGINT): finish the current step, save
    last.pt, exit. A second Ctrl-C kills a single process (a person who will not wait). A
    repeated SIGTERM or SIGHUP is the same request again, not an insistence: a scheduler's time
    limit reaches every process of a job, and the launcher above passes it on as well (sweep.py,
    torchrun); nor does a second Ctrl-C kill a torchrun process, which torchrun's passing on may
    have caused. The hard stop is the SIGKILL a scheduler sends after its grace period (torchrun's
    after its --shutdown_timeout). Once a signal has stopped training, SIGTERM and SIGHUP are
    ignored until the process exits. SIGHUP under `nohup` and SIGINT in a shell script's
    background job were ignored when the process started, and stay so (handle_stop_signal).

        with StopSignals(world) as signals:
            ... signals.received: the signal that came (None: none yet) ...
    """

    def __init__(self, world: World):
        self.world, self.received, self.previous_handlers = world, None, {}

    def __enter__(self) -> "StopSignals":
        def handler(signum, frame):
            self.received = self.received or signum
            if signum == signal.SIGINT and not self.world.distributed:
                signal.signal(signum, signal.SIG_DFL)
            if signum == signal.SIGHUP:
                leave_a_closed_terminal()
        self.previous_handlers = {signum: handle_stop_signal(signum, handler)
                                  for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        return self

    def __exit__(self, *exc) -> bool:
        for signum, handler in self.previous_handlers.items():
            # Stopped by a signal, the process is on its way out: a SIGTERM or SIGHUP repeated
            # then is still the same request, not one to die of before the exit code is given.
            repeat = self.received is not None and signum != signal.SIGINT
            signal.signal(signum, signal.SIG_IGN if repeat else handler)
        return False
