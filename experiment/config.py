"""Run configuration: YAML files plus `key=value` overrides, strictly validated.

A config file may name a base file (`base: base.yaml`, relative to itself); the file is
merged over its base section by section. Command-line overrides use dotted keys
(`train.lr=30`, `head.k=3`) and are parsed as YAML scalars. Every key must exist in the
schema below (or in the chosen head's Options), every value must have the right type and
a possible value; the first problem is raised as one ConfigError line naming the file or
override, the key and what was expected.

The resolved config is a plain nested dict (`Config.to_dict`), saved as config.yaml in
every run directory and inside every checkpoint.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

import yaml

from model.heads import HEADS


class ConfigError(Exception):
    """A config problem; str(error) is one line naming where, which key and what was expected."""


def _in_unit_interval(name: str, value: float) -> None:
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name}: expected a probability in [0, 1), got {value}")


# Seeds: what torch's generators and the DDP ranks' derived seeds (experiment/distributed.py) take.
SEED_RANGE = "an integer in [0, 2**63 - 1]"


def seed_problem(value) -> str | None:
    """Why `value` is not a seed (one clause), or None when it is one."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        return f"expected {SEED_RANGE}, got {value}"
    return None


def _positive(name: str, value) -> None:
    if value is not None and not value > 0:
        raise ValueError(f"{name}: expected a value > 0, got {value}")


@dataclass(frozen=True)
class DataConfig:
    dataset: Literal["ptb", "wikitext-2"]
    data_dir: Optional[str] = None          # null: $AWD_DATA_DIR, else corpora/ in the repository
    allow_modified_corpus: bool = False     # accept split files whose sha256 is not the published one

    def __post_init__(self):
        # Kept as an absolute path: config.yaml is read again by evaluate.py, rank.py and
        # --resume from other working directories, where a relative folder names other text.
        if self.data_dir is not None:
            if not str(self.data_dir).strip():
                raise ValueError("data_dir: expected a folder holding the dataset's folder, or null "
                                 "for $AWD_DATA_DIR (else corpora/ in the repository)")
            object.__setattr__(self, "data_dir", os.path.abspath(os.path.expanduser(str(self.data_dir))))


@dataclass(frozen=True)
class ModelConfig:
    emsize: int                # d_emb: embedding size = tied decoder row size
    nhid: int                  # hidden size of the inner LSTM layers
    nhidlast: Optional[int]    # output size of the last LSTM layer (= emsize for linear heads);
                               # null: the same as emsize, so that a grid over emsize moves both
    nlayers: int = 3
    dropout: float = 0.4       # locked dropout on the last layer's output
    dropouth: float = 0.3      # locked dropout between LSTM layers
    dropouti: float = 0.4      # locked dropout on the embedding output
    dropoute: float = 0.1      # embedding dropout: whole words
    wdrop: float = 0.5         # DropConnect on the hidden-to-hidden matrices
    emb_noise: float = 0.0     # std of Gaussian noise on the embedding output in training; 0: off

    def __post_init__(self):
        if self.nhidlast is None:          # resolved here: the saved config holds the number
            object.__setattr__(self, "nhidlast", self.emsize)
        for name in ("emsize", "nhid", "nhidlast", "nlayers"):
            _positive(name, getattr(self, name))
        for name in ("dropout", "dropouth", "dropouti", "dropoute", "wdrop"):
            _in_unit_interval(name, getattr(self, name))
        if not 0.0 <= self.emb_noise < float("inf"):
            raise ValueError(f"emb_noise: expected a standard deviation >= 0, got {self.emb_noise}")


@dataclass(frozen=True)
class TrainConfig:
    lr: float
    batch_size: int
    epochs: int
    seed: int
    small_batch_size: Optional[int] = None  # columns per forward/backward; null: batch_size
    bptt: int = 70
    max_seq_len_delta: int = 40             # seq_len is capped at bptt + this
    clip: float = 0.25                      # global gradient-norm clipping; 0 disables
    wdecay: float = 1.2e-6
    alpha: float = 2.0                      # AR: activation regularisation
    beta: float = 1.0                       # TAR: temporal activation regularisation
    asgd_trigger: Literal["et", "nt", "start", "never"] = "et"   # start: average from step 1
    asgd_switch_epoch: int = 200            # ET-ASGD: epochs 1..N use SGD, averaging from N+1
    nonmono: int = 5                        # NT-ASGD: non-monotone interval
    early_stop_nonmono: bool = False        # end training when the NT-ASGD rule fires on ASGD
    # On ASGD, end training once the best validation perplexity has improved by less than this
    # fraction over the last plateau_window epochs (0.01: 1%); null: never
    plateau_gain: Optional[float] = None
    plateau_window: int = 5
    init_from: Optional[str] = None         # checkpoint whose model weights start the run
    # The lr of the finetuning stage (train.py --finetune); null: train.lr, as [AWD] finetune.py,
    # whose default is the training one. MoS's README finetunes at 25 on PTB, 20 on WT2.
    finetune_lr: Optional[float] = None
    eval_batch_size: int = 10
    test_batch_size: int = 1

    def __post_init__(self):
        for name in ("lr", "finetune_lr", "batch_size", "epochs", "small_batch_size", "bptt",
                     "asgd_switch_epoch", "nonmono", "plateau_window", "eval_batch_size", "test_batch_size"):
            _positive(name, getattr(self, name))
        for name in ("max_seq_len_delta", "clip", "wdecay", "alpha", "beta"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: expected a value >= 0, got {getattr(self, name)}")
        if self.plateau_gain is not None and not 0 < self.plateau_gain < 1:
            raise ValueError(f"plateau_gain: expected a fraction in (0, 1), e.g. 0.01 for 1%, "
                             f"or null, got {self.plateau_gain}")
        if problem := seed_problem(self.seed):
            raise ValueError(f"seed: {problem}")
        if self.small_batch_size is not None and self.small_batch_size > self.batch_size:
            raise ValueError(f"small_batch_size: expected at most batch_size ({self.batch_size}), "
                             f"got {self.small_batch_size}")

    def unused_early_stops(self) -> str | None:
        """Why the early stops set here stop nothing, or None: they act on ASGD only, and
        asgd_trigger never never switches to it."""
        stops = self.early_stops()
        if self.asgd_trigger != "never" or not stops:
            return None
        return (f"train.{' and train.'.join(stops)} stop a run on ASGD only, and train.asgd_trigger=never "
                f"never switches to it: {'they stop' if len(stops) > 1 else 'it stops'} nothing here "
                f"(the run trains train.epochs epochs)")

    def switch_after_the_end(self) -> str | None:
        """Why this run will not average, or None: ET-ASGD switches after asgd_switch_epoch, and
        train.epochs ends the run there or before (a shortened full-size run, say, which a reader
        of its numbers would take for an averaged one)."""
        if self.asgd_trigger != "et" or self.epochs > self.asgd_switch_epoch:
            return None
        stops = self.early_stops()
        verbs = ("act", "stop") if len(stops) > 1 else ("acts", "stops")
        unused = (f"; train.{' and train.'.join(stops)}, which {verbs[0]} on ASGD only, {verbs[1]} nothing"
                  if stops else "")
        return (f"train.asgd_trigger=et switches to averaged SGD after epoch {self.asgd_switch_epoch} "
                f"(train.asgd_switch_epoch), and train.epochs={self.epochs} ends the run "
                f"{'there' if self.epochs == self.asgd_switch_epoch else 'before'}: it trains with plain "
                f"SGD throughout{unused}")

    def early_stops(self) -> list[str]:
        """The early stops set (both act on ASGD only)."""
        return [name for name, value in (("plateau_gain", self.plateau_gain),
                                         ("early_stop_nonmono", self.early_stop_nonmono)) if value]


# What run.device (and the --device options of evaluate.py, rank.py, report.py) accept.
DEVICE_NAME = re.compile(r"auto|cpu|mps|cuda(:[0-9]+)?")
DEVICE_CHOICES = "auto, cpu, mps, cuda or cuda:N (N a GPU index)"


@dataclass(frozen=True)
class RunConfig:
    dir: Optional[str] = None                   # null: runs/<dataset>-<config name>-seed<seed>
    device: str = "auto"                        # auto (CUDA when present), cpu, cuda, cuda:1, ...
    max_steps: Optional[int] = None             # stop after this many optimizer steps (smoke tests)
    checkpoint_every_steps: Optional[int] = None  # also save last.pt every N steps
    log_interval: int = 200                     # steps between progress lines / loss updates
    tensorboard: bool = True
    tf32: bool = False                          # TensorFloat-32 in cuDNN LSTMs / matmuls (GPUs)
    # deterministic algorithms everywhere (GPU runs repeat bit for bit, at some cost in speed)
    deterministic: bool = False
    # how DDP sums the ranks' gradients: "ordered" (rank order: resumes are exact) or
    # "allreduce" (NCCL's ring all-reduce: less traffic, the sum's order depends on the buckets)
    ddp_reduce: Literal["ordered", "allreduce"] = "ordered"

    def __post_init__(self):
        if self.dir and self.dir.startswith("~"):
            # `run.dir=~/runs/x` (quoted, or in a file) would be a folder named "~" here, and
            # the printed `--resume ~/runs/x` another path once the shell expands it.
            object.__setattr__(self, "dir", str(Path(self.dir).expanduser()))
        for name in ("max_steps", "checkpoint_every_steps", "log_interval"):
            _positive(name, getattr(self, name))
        if not DEVICE_NAME.fullmatch(self.device):
            raise ValueError(f"device: expected {DEVICE_CHOICES}, got {self.device!r}")


SECTIONS = {"data": DataConfig, "model": ModelConfig, "train": TrainConfig, "run": RunConfig}


@dataclass(frozen=True)
class Config:
    data: DataConfig
    model: ModelConfig
    train: TrainConfig
    run: RunConfig
    head_name: str
    head: Any = field(default=None)             # the head's Options instance

    @property
    def small_batch_size(self) -> int:
        return self.train.small_batch_size or self.train.batch_size

    def to_dict(self) -> dict:
        out = {name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS}
        out["head"] = {"name": self.head_name, **dataclasses.asdict(self.head)}
        return out

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


# ---------------------------------------------------------------- loading and merging

class _StrictLoader(yaml.SafeLoader):
    """YAML as a person means it: a key written twice in one mapping is an error (PyYAML keeps
    the last one), 1e-6 or 1e30 are numbers (YAML 1.1 wants a dot and a signed exponent, so
    PyYAML reads them as strings), and numbers are decimal: YAML 1.1 read seed: 010 as 8 (octal),
    0b101 as 5 and epochs: 1:30 as 90 (base 60), each a silently different setting; here 010 is
    10, and 0b101, 0x1f or 1:30 are text, which a numeric key refuses."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen and key != "<<":
                raise _DuplicateKey(key, key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


class _DuplicateKey(Exception):
    def __init__(self, key, mark):
        super().__init__(key)
        self.key, self.mark = key, mark


_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers
            if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^[-+]?[0-9][0-9_]*$"), list("-+0123456789"))
_StrictLoader.add_constructor(       # PyYAML's own reads a leading 0 as octal
    "tag:yaml.org,2002:int", lambda loader, node: int(loader.construct_scalar(node).replace("_", "")))
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)?\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                  |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
                  |[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


def parse_yaml(text: str):
    """One YAML document with the rules of _StrictLoader."""
    return yaml.load(text, Loader=_StrictLoader)


def read_yaml(path: Path, what: str = "config file") -> dict:
    """The mapping a YAML file holds (strict rules), or a ConfigError line naming the file."""
    try:
        text = path.read_text(encoding="utf-8")
        data = parse_yaml(text)
    except FileNotFoundError:
        raise ConfigError(f"{path}: {what} not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, expected a YAML {what}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset "
                          f"{e.start}); expected a YAML {what}") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the {what} ({e.strerror or e})") from None
    except _DuplicateKey as e:
        raise ConfigError(f"{path}: line {e.mark.line + 1}: key {e.key!r} is written twice in "
                          f"the same mapping; keep one") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        problem = " ".join(str(getattr(e, "problem", None) or e).split())
        raise ConfigError(f"{path}:{where} not valid YAML ({problem})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of keys at the top level")
    return data


def _merge(into: dict, new: dict, origin: dict, source: str, prefix: str = "") -> None:
    """Deep-merge `new` into `into`, recording for each leaf key which source set it."""
    for key, value in new.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value, origin, source, path + ".")
        else:
            into[key] = value
            if isinstance(value, dict):
                for sub in value:
                    origin[f"{path}.{sub}"] = source
            origin[path] = source


def _load_file(path: Path, origin: dict, seen: tuple = ()) -> dict:
    """The file's keys merged over its base files' (each key's origin: the file that set it,
    named as reached from the path given, so that an error names the base file it came from)."""
    resolved = path.resolve()
    if resolved in seen:
        raise ConfigError(f"{resolved}: base files include each other in a cycle")
    data = read_yaml(resolved)
    base = data.pop("base", None)
    merged: dict = {}
    if base is not None:
        if not isinstance(base, str) or not base.strip():
            raise ConfigError(f"{path}: base: expected a file name, got {base!r}")
        base_path = Path(os.path.normpath(path.parent / base))
        if not base_path.is_file():      # named from the file that says base:, which is the one to fix
            raise ConfigError(f"{path}: base: {base}: no such config file ({base_path}; a base is "
                              f"relative to the file that names it)")
        merged = _load_file(base_path, origin, seen + (resolved,))
    _merge(merged, data, origin, str(path))
    return merged


def parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected key=value, e.g. train.lr=30")
    key, raw = text.split("=", 1)
    if not raw.strip():
        # YAML reads an empty value as null, which quietly cleared a setting (an unset shell
        # variable in train.init_from=$CKPT trained from random weights)
        raise ConfigError(f"override {text!r}: empty value; write {key.strip()}=null to clear the "
                          f"setting, or give a value")
    if raw.strip() == "~":
        # YAML's null too, where data.data_dir=~ meant the home folder
        raise ConfigError(f"override {text!r}: ~ alone is YAML's null; write {key.strip()}=null to clear "
                          f"the setting, or give the folder's full path")
    try:
        value = parse_yaml(raw)
    except _DuplicateKey as e:
        raise ConfigError(f"override {text!r}: key {e.key!r} is written twice; keep one") from None
    except yaml.YAMLError as e:
        # it was taken as the raw text: run.dir="runs/x (a quote left open) became a folder named
        # with the quote, {lr: 1 (a brace left open) "not a mapping"
        problem = " ".join(str(getattr(e, "problem", None) or e).split())
        raise ConfigError(f"override {text!r}: the value is not valid YAML ({problem}); close its quotes "
                          f"or brackets, or quote the whole value, e.g. '{key.strip()}=\"...\"'") from None
    return key.strip().split("."), value


def overrides_setting(section: str, values: dict) -> list[str]:
    """`section.key=value` overrides that set `values`, each written as YAML reads it back
    (None as null: str(None) was the string 'None')."""
    return [f"{section}.{key}={yaml.safe_dump(value).splitlines()[0]}" for key, value in values.items()]


def _apply_override(raw: dict, text: str, origin: dict) -> None:
    keys, value = parse_override(text)
    node = raw
    if keys[0] not in raw:          # a section the override brings (a typo's): the override names it
        origin[keys[0]] = f"override {text!r}"
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {text!r}: {key} is not a section")
    node[keys[-1]] = value
    origin[".".join(keys)] = f"override {text!r}"


# ---------------------------------------------------------------- typing and validation

FLOAT32_MAX = 3.4028234663852886e38

# The types a config value is read as (_coerce), besides a Literal's values and unions of these.
_SCALAR_NAMES = {int: "an integer", float: "a finite float32 number", str: "a string", bool: "true or false"}


def _is_union(tp) -> bool:
    """Optional[X] or Union[X, Y], or the same written X | None (types.UnionType, which
    typing.Union is not: a head's `cap: float | None` option refused every value)."""
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _type_name(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if _is_union(tp):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        nullable = len(args) < len(typing.get_args(tp))
        return " or ".join(_type_name(a) for a in args) + (" or null" if nullable else "")
    return _SCALAR_NAMES.get(tp, str(tp))


def readable_type(tp) -> bool:
    """Whether _coerce can read a config value as `tp`: a head's option of another type (a list,
    a tuple) could be set by no config, whatever it wrote."""
    if _is_union(tp):
        return all(arg is type(None) or readable_type(arg) for arg in typing.get_args(tp))
    return typing.get_origin(tp) is Literal or tp in _SCALAR_NAMES


def _coerce(tp, value):
    """Return value as type tp, or raise TypeError. Integers are accepted for floats; inf, nan
    and numbers beyond float32's range are not (the models compute in float32, and no setting
    of this repository means anything with them)."""
    origin = typing.get_origin(tp)
    if _is_union(tp):
        if value is None and type(None) in typing.get_args(tp):
            return None
        for arg in typing.get_args(tp):
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value)
            except TypeError:
                pass
        raise TypeError
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        raise TypeError
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise TypeError
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise TypeError
    if tp is float:
        if (isinstance(value, (int, float)) and not isinstance(value, bool)
                and math.isfinite(value) and abs(value) <= FLOAT32_MAX):
            return float(value)
        raise TypeError
    if tp is str:
        if isinstance(value, str):
            return value
        raise TypeError
    raise TypeError


def build_section(cls, values: dict, section: str, origin: dict, owner: str = ""):
    """Instantiate dataclass `cls` from `values`, with one-line errors naming key and source;
    `owner` names what the section's keys belong to (a head: "the gss head") in those errors."""
    def chosen_by() -> str:
        """What a problem of no key that a source set is blamed on: for a head, what chose it
        (whatever set head.name); for another section, the config file named."""
        return (origin.get(f"{section}.name", origin.get(section, "config")) if owner
                else origin.get("", "config"))

    def where(key: str) -> str:
        return origin.get(f"{section}.{key}", chosen_by())

    if not isinstance(values, dict):
        raise ConfigError(f"{origin.get(section, 'config')}: {section}: expected a mapping of keys")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    for key in values:
        if key not in known:
            valid = (f"valid keys{' of ' + owner if owner else ''}: {', '.join(sorted(known))}" if known
                     else f"{owner or 'this section'} takes no keys")
            named_by = origin.get(f"{section}.name")
            if owner and str(named_by).startswith("override") and not where(key).startswith("override"):
                # head.name changed (an override) over a file that set another head's options
                valid += (f"; {where(key)} sets it for its own head: to change the head, clear its "
                          f"options too: 'head={{}}' head.name=... with the new head's options")
            elif owner and named_by not in (None, where(key)) and not where(key).startswith("override"):
                # a file that changes its base's head: its head: mapping merges over the base's
                valid += (f"; {where(key)} sets it for its own head and {named_by} changes head.name: "
                          f"a file's head: merges over its base's, so base it on a config of the new "
                          f"head (or give 'head={{}}' head.name=... on the command line)")
            raise ConfigError(f"{where(key)}: unknown key {section}.{key} ({valid})")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.name not in values:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                # (another section's key on the config file named, not on the last override
                # that touched the section)
                raise ConfigError(f"{chosen_by()}: missing required key {section}.{f.name}"
                                  f"{' of ' + owner if owner else ''} ({_type_name(hints[f.name])})")
            continue
        if not readable_type(hints[f.name]):
            raise ConfigError(f"{where(f.name)}: {section}.{f.name}: {owner or cls.__name__} types this "
                              f"option {_type_name(hints[f.name])}, which no config value is read as; its "
                              f"Options field needs a type a config gives: int, float, bool, str, a Literal "
                              f"or one of these or None (docs/heads.md, Adding a head)")
        try:
            kwargs[f.name] = _coerce(hints[f.name], values[f.name])
        except TypeError:
            raise ConfigError(f"{where(f.name)}: {section}.{f.name}: expected "
                              f"{_type_name(hints[f.name])}, got {values[f.name]!r}") from None
    try:
        return cls(**kwargs)
    except ValueError as e:
        # "<key>: <what was expected>" by the Options' convention; a message that names no key
        # ("temperature too high") is the section's, not "head.temperature too high" of "config"
        key = str(e).split(":", 1)[0]
        if key in known:
            raise ConfigError(f"{where(key)}: {section}.{e}") from None
        raise ConfigError(f"{chosen_by()}: {section}: {e}") from None


def _resolve(raw: dict, origin: dict) -> Config:
    for key in raw:
        if key not in SECTIONS and key != "head":
            raise ConfigError(f"{origin.get(key, 'config')}: unknown section {key!r} "
                              f"(valid: {', '.join(list(SECTIONS) + ['head'])})")
    sections = {name: build_section(cls, raw.get(name, {}), name, origin)
                for name, cls in SECTIONS.items()}
    head = raw.get("head")
    if head is not None and not isinstance(head, dict):
        raise ConfigError(f"{origin.get('head', 'config')}: head: expected a mapping of keys (name: and "
                          f"the head's options, e.g. head.name=softmax), got {head!r}")
    head_raw = dict(head or {})
    head_name = head_raw.pop("name", None)
    # a list or mapping (name: [mos]) cannot be looked up in HEADS: it is refused as any wrong name
    if not isinstance(head_name, str) or head_name not in HEADS:
        # a missing name is blamed on whatever set the head section last (`head=null` empties
        # it), or on the config file where no source set a head at all
        if "name" in (head or {}):
            raise ConfigError(f"{origin.get('head.name')}: head.name: expected one of {', '.join(HEADS)}, "
                              f"got {head_name!r}")
        raise ConfigError(f"{origin.get('head', origin.get('', 'config'))}: missing required key head.name "
                          f"(one of {', '.join(HEADS)})")
    head_cls = HEADS[head_name]
    head_options = build_section(head_cls.Options, head_raw, "head", origin, owner=f"the {head_name} head")
    model = sections["model"]
    if head_cls.requires_nhidlast_equal_emsize and model.nhidlast != model.emsize:
        raise ConfigError(f"{origin.get('model.nhidlast', 'config')}: model.nhidlast: the "
                          f"{head_name} head ties its decoder to the embedding, so nhidlast must "
                          f"equal emsize ({model.emsize}), got {model.nhidlast} (model.nhidlast=null "
                          f"follows emsize)")
    return Config(head_name=head_name, head=head_options, **sections)


def load_config(path: str | Path | None, overrides: list[str] = (), base: dict | None = None) -> Config:
    """Load a config file (or start from `base`, a resolved config dict) and apply overrides."""
    origin: dict = {}
    raw: dict = {}
    if base is not None:
        _merge(raw, base, origin, "saved run config")
    if path is not None:
        from_files: dict = {}              # each key's file: the config's own or a base file
        _merge(raw, _load_file(Path(path), from_files), origin, str(path))
        origin.update(from_files)
        origin[""] = str(path)             # the config as a whole: what a missing key is blamed on
    for text in overrides:
        _apply_override(raw, text, origin)
    return _resolve(raw, origin)


def config_from_dict(data: dict, source: str = "checkpoint") -> Config:
    origin: dict = {}
    raw: dict = {}
    _merge(raw, data, origin, source)
    return _resolve(raw, origin)
