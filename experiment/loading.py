"""Device choice and loading a trained model from a run directory or checkpoint file."""
from __future__ import annotations

import functools
import os
import platform
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from data import DataError, load_corpus
from data.corpus import describe_text_change, differing_splits
from data.download import missing_split_files
from model import LanguageModel, build_model, word_counts
from . import checkpoint
from .config import DEVICE_CHOICES, DEVICE_NAME, Config, ConfigError, config_from_dict
from .progress import TrainingProgress
from .run_directory import trained_corpus


def select_device(name: str = "auto", option: str = "run.device") -> torch.device:
    """auto: CUDA when present (cuDNN is then used by the LSTMs), else CPU. A device that this
    machine cannot use is a ConfigError naming `option` (the config key or command-line flag)."""
    if not DEVICE_NAME.fullmatch(name):
        raise ConfigError(f"{option}: expected {DEVICE_CHOICES}, got {name!r}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"{option}: {name!r} requested but CUDA is not available here")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"{option}: {name!r} requested but this machine has "
                              f"{torch.cuda.device_count()} CUDA device(s) (cuda:0 ...)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{option}: 'mps' requested but the Apple MPS backend is not available "
                          f"here (it needs macOS on Apple silicon and a PyTorch built with MPS)")
    return device


@functools.lru_cache(maxsize=None)
def processor_name() -> str:
    """The CPU's model name, so that CPU times from different machines are not compared unawares
    (read once: every command's line names it)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        text = ""
    return processor_from_cpuinfo(text) or platform.processor() or platform.machine() or "unknown"


def processor_from_cpuinfo(text: str) -> str | None:
    """The first processor's model name in /proc/cpuinfo's `text`. A virtual machine may report
    a bare "AMD EPYC" for processors of several generations, so the x86 family and model
    numbers follow it where they are given: "AMD EPYC (family 25, model 17)"."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if not key.strip():
            break                               # the end of the first processor's block
        fields.setdefault(key.strip(), value.strip())
    if "model name" not in fields:
        return None
    if "cpu family" in fields and "model" in fields:
        return f"{fields['model name']} (family {fields['cpu family']}, model {fields['model']})"
    return fields["model name"]


def code_version() -> dict:
    """Which code trains: the repository's git commit and whether tracked files differ from it
    (run.json keeps one entry per change of it over a run's sittings, so that runs of one cell
    trained on different code can be told apart). {"commit": None} outside a git checkout."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip()
        changed = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                 capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {"commit": None}
    return {"commit": commit, "modified": bool(changed)}


def device_name(device: torch.device) -> str:
    """What run.json records of where a run trained: the device and its model (the GPU's name,
    or the processor's), so that reports can say which runs of a cell came from which machine."""
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return f"{device} ({processor_name()})" if device.type == "cpu" else str(device)


def set_float32_precision(tf32: bool) -> None:
    """IEEE float32 everywhere (tf32=False), or TensorFloat-32 in cuDNN (the LSTMs) and cuBLAS
    (matmuls) on Ampere and later GPUs: ~3 decimal digits per input, faster.

    PyTorch lets cuDNN RNNs use TF32 by default; the papers' runs were float32. So train.py
    sets this from run.tf32 (default false) and every loaded model is evaluated in float32.
    No effect on CPU. (The legacy flags are used on purpose: setting torch's newer
    per-operator precision API makes reading these flags an error for other code.)"""
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32


def set_deterministic(enabled: bool) -> None:
    """run.deterministic: deterministic algorithms everywhere, so that a GPU run repeats bit for
    bit on the same GPU model and software (PyTorch raises where an operation has none). cuBLAS
    needs its workspace setting before its first call, cuDNN picks no algorithm by timing, and
    the PLIF's slope gradient sums its buckets in a fixed order (model/kernels/plif.py). No
    effect on CPU results, which are deterministic anyway."""
    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(enabled)
    torch.backends.cudnn.deterministic = enabled
    torch.backends.cudnn.benchmark = False


# glibc's mallopt parameters
M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8


def glibc_mallopt():
    """glibc's mallopt, or None where there is none (off Linux; musl has no mallopt)."""
    import ctypes
    import ctypes.util
    import sys
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return None


def keep_freed_host_memory() -> bool:
    """Keep the memory of freed tensors in the process's heap for the next ones (Linux, glibc).

    glibc serves every allocation above a threshold (at most 32 MB) with a fresh mmap and
    returns it to the system on free, so a training step that makes tensors of T x B x V floats
    (56 MB at PTB's V with 1,400 tokens) has the kernel map and zero-fill them anew at every
    step: measured on the miniature PTB model, 140-170 ms of system time beside 190 ms of
    computation a step, on one core. With mmap off and no trimming, the heap reuses them (the
    process keeps its peak memory). Numbers are unchanged; only where memory comes from.
    Returns whether it applied (False off glibc, where nothing is done)."""
    mallopt = glibc_mallopt()
    return mallopt is not None and all([mallopt(M_MMAP_MAX, 0), mallopt(M_TRIM_THRESHOLD, 2 ** 31 - 1)])


def one_heap_for_every_thread() -> bool:
    """Every thread's memory from the main heap (glibc's arenas limited to one), for a process
    whose threads each make a step's large tensors: a CPU group's members side by side
    (experiment/group.py's SideBySide). glibc gives a thread an arena of its own, made of heaps
    of at most 64 MB, which maps such a tensor anew and unmaps it when it is freed, whatever
    keep_freed_host_memory says: on the miniature at 2 threads, 11,000-15,000 page faults and
    23 ms of system time a step of the pair, against 1-2 ms in one heap. Not for a run alone:
    its OpenMP threads would queue for the one heap's lock (2-3% of a step at 2 threads). Call
    it before the threads first allocate: a thread keeps the arena it was given. Returns whether
    it applied (False off glibc)."""
    mallopt = glibc_mallopt()
    return mallopt is not None and bool(mallopt(M_ARENA_MAX, 1))


def memory_refused(error: RuntimeError) -> str | None:
    """What the CPU allocator refused, 'building it asked for a tensor of N bytes', where `error`
    is its refusal (a size with a typo's zeros, head.knots=100000000000), else None."""
    if "can't allocate memory" not in str(error):
        return None
    asked = re.search(r"allocate (\d+) bytes", str(error))
    return f"building it asked for a tensor of {int(asked.group(1)):,} bytes" if asked else "building it asked for a tensor"


def initial_model(config: Config, corpus) -> LanguageModel:
    """The model a new run of `config` starts from, exactly as train.py builds it: the global
    random stream seeded with train.seed, then the model built on the CPU. The stream goes on
    from there into training (the dropout masks), so whatever rebuilds a run's start (report.py
    diagnose) calls this and nothing else."""
    torch.manual_seed(config.train.seed)
    try:
        return build_model(config, corpus.vocab_size, word_counts(corpus.train, corpus.vocab_size))
    except RuntimeError as e:
        # a size in the config beyond this machine (head.knots=100000000000, a typo's zeros): one
        # line naming the sizes, not the CPU allocator's traceback
        refused = memory_refused(e)
        if refused is None:
            raise
        sizes = {**{f"model.{key}": value for key, value in config.to_dict()["model"].items()},
                 **{f"head.{key}": value for key, value in config.to_dict()["head"].items()}}
        settings = " ".join(f"{key}={value}" for key, value in sizes.items() if isinstance(value, int)
                            and not isinstance(value, bool))
        raise ConfigError(f"the model does not fit in this machine's memory ({refused}): "
                          f"its integer sizes are {settings}; is one too large?") from None


@dataclass
class TrainedModel:
    path: Path            # the checkpoint file
    run_dir: Path         # where results of analyses are written
    config: Config
    corpus: object
    model: LanguageModel
    checkpoint: dict

    def weights(self) -> dict:
        """Which weights the model holds (checkpoint_weights), read once: a checkpoint of a run's
        starting weights reads the checkpoint they came from."""
        if self._weights is None:
            self._weights = checkpoint_weights(self.checkpoint, self.path)
        return self._weights

    _weights: dict | None = field(default=None, repr=False)


def checkpoint_weights(ckpt: dict, path: Path | None = None) -> dict:
    """Which weights a checkpoint holds: from best.pt those validated after its epoch (the ASGD
    averages once averaging runs); from last.pt the model's own weights where training stands,
    after its last complete epoch or within the epoch in progress (the averages are in its
    optimizer state); before the first step of a run from train.init_from (a finetuning's
    best.pt until an epoch beats them), the weights of that checkpoint (starting_weights), looked
    for from `path`, the checkpoint's file, where it is relative. JSON-ready, for the results
    evaluate.py and rank.py write."""
    if ckpt.get("kind") == "last":
        p = TrainingProgress.from_dict(ckpt["progress"])
        complete = p.position == 0           # at an epoch boundary: `epoch` is the next one
        held = {"epoch": p.completed_epochs if complete else p.epoch, "epoch_complete": complete,
                "step": p.step, "weights": "raw", "asgd": ckpt["optimizer"]["averaged"]}
    else:
        held = {"epoch": ckpt["epoch"], "epoch_complete": True, "step": ckpt["step"],
                "weights": "averaged" if ckpt["averaged"] else "raw", "asgd": ckpt["averaged"]}
    init_from = ckpt["config"]["train"].get("init_from")
    if held["step"] == 0 and init_from:
        return {**held, **starting_weights(located_init_from(init_from, path), ckpt["model"])}
    return held


def located_init_from(init_from: str, checkpoint_path: Path | None) -> str:
    """A run's train.init_from as this process can read it. A relative one is relative to the
    folder training started in (sweep.py's plans name a finetuning's start so, from the folder
    that holds the plan's), which a later evaluate.py may not share: where it is not found from
    here, the first folder above the run's checkpoint that holds it (its weights are compared
    before they are told)."""
    given = Path(init_from)
    if given.is_absolute() or given.exists() or checkpoint_path is None:
        return init_from
    for folder in Path(checkpoint_path).resolve().parents:
        if (folder / given).is_file():
            return str(folder / given)
    return init_from


def starting_weights(init_from: str, model_state: dict) -> dict:
    """The weights and asgd of a run's weights before its first step, which are those of its
    train.init_from checkpoint (a finetuning's: the trained run's best.pt, the ASGD averages
    where it averaged), with that checkpoint's own record under starting_weights. The run's
    checkpoint cannot say it: its `averaged` is of the run's own optimizer, which has not
    averaged anything yet. Told only where the file still holds the same weights; else
    "unknown", with the reason."""
    try:
        source = checkpoint.load(init_from, map_location="cpu")
    except checkpoint.CheckpointError as e:
        return unknown_starting_weights(init_from, f"it cannot be read now ({e})")
    if source["model"].keys() != model_state.keys() or not all(
            torch.equal(source["model"][name], tensor) for name, tensor in model_state.items()):
        return unknown_starting_weights(init_from, "it now holds other weights")
    record = checkpoint_weights(source, Path(init_from))
    return {"weights": record["weights"], "asgd": record["asgd"],
            "starting_weights": {"checkpoint": str(init_from), **record}}


def unknown_starting_weights(init_from: str, reason: str) -> dict:
    return {"weights": "unknown", "asgd": None,
            "starting_weights": {"checkpoint": str(init_from), "unknown": reason}}


def describe_weights(w: dict) -> str:
    """checkpoint_weights() in words, e.g. "weights after epoch 2 (step 96), raw"."""
    source = w.get("starting_weights")
    if source is not None:
        where = f"the starting weights (before this run's first training step) from {source['checkpoint']}"
        if "unknown" in source:
            return f"{where}, which are not known: {source['unknown']}"
        return f"{where}, its {describe_weights(source)}"
    if w["step"] == 0:
        where = "the weights before this run's first training step (its initial weights)"
    elif w["epoch_complete"]:
        where = f"weights after epoch {w['epoch']} (step {w['step']})"
    else:
        where = f"weights from within epoch {w['epoch']} (step {w['step']}, the epoch unfinished)"
    if w["weights"] == "averaged":
        return f"{where}, the ASGD averages"
    return f"{where}, raw" + (" (not the ASGD averages validation uses)" if w["asgd"] else "")


def check_named_data_dir(data_dir: str | None, dataset: str) -> None:
    """A --data-dir the user named that lacks the corpus is a typo or the wrong folder: said in
    one line, rather than downloaded into (downloading is for the run's own data dir)."""
    if data_dir is None:
        return
    missing = missing_split_files(Path(data_dir).expanduser() / dataset)
    if missing:
        raise DataError(f"--data-dir {data_dir}: no {missing[0].name} in {missing[0].parent}: give "
                        f"the folder that holds {dataset}/, or leave --data-dir out for the run's own")


def load_trained(path: str | Path, device: torch.device, data_dir: str | None = None,
                 name: str = "best.pt", allow_modified_corpus: bool | None = None) -> TrainedModel:
    """Load a run directory's `name` checkpoint (or a checkpoint file) with its corpus and model,
    ready to evaluate in IEEE float32. The corpus may be a modified one where the run's
    data.allow_modified_corpus or the caller's --allow-modified-corpus says so
    (`allow_modified_corpus`; None: the caller has no such option)."""
    set_float32_precision(False)
    keep_freed_host_memory()
    ckpt_path = checkpoint.existing_checkpoint(path, name)
    ckpt = checkpoint.load(ckpt_path, map_location="cpu")
    config = config_from_dict(ckpt["config"], source=str(ckpt_path))
    check_named_data_dir(data_dir, config.data.dataset)
    corpus = load_corpus(config.data.dataset, data_dir or config.data.data_dir,
                         allow_modified=config.data.allow_modified_corpus or bool(allow_modified_corpus),
                         allowed_by=None if allow_modified_corpus is None else "give --allow-modified-corpus")
    checkpoint.check_vocabulary(ckpt, corpus, ckpt_path)
    note_other_text(ckpt_path.parent, corpus)
    model = build_model(config, corpus.vocab_size)
    checkpoint.load_model_state(model, ckpt["model"], ckpt_path)
    model.to(device).eval()
    return TrainedModel(ckpt_path, ckpt_path.parent, config, corpus, model, ckpt)


def note_other_text(run_dir: Path, corpus) -> None:
    """Say so (stderr) where the validation or test text differs from the one the run trained
    beside (run.json's corpus record): the numbers are of this text, and a report leaves result
    files of other text out of the run's row."""
    trained, used = trained_corpus(run_dir), corpus.record()
    changed = differing_splits(trained, used, ("valid", "test"))
    if changed:
        print(f"note: {run_dir} trained beside other text: {describe_text_change(trained, used, changed)}; "
              f"what follows is of this text", file=sys.stderr)
