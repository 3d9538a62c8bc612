"""Config loading: base files, overrides, strict validation with one-line errors."""
from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from experiment.config import ConfigError, build_section, config_from_dict, load_config

PTB = "configs/ptb/softmax.yaml"


def error_of(path=PTB, overrides=()):
    with pytest.raises(ConfigError) as info:
        load_config(path, list(overrides))
    message = str(info.value)
    assert "\n" not in message
    return message


def test_head_file_merges_over_its_base():
    config = load_config(PTB)
    assert config.data.dataset == "ptb" and config.head_name == "softmax"
    assert (config.model.emsize, config.model.nhid, config.train.lr, config.train.seed) == (400, 1150, 20.0, 141)
    wt2 = load_config("configs/wt2/softmax.yaml")
    assert (wt2.model.dropouti, wt2.model.dropouth, wt2.train.lr, wt2.train.batch_size) == (0.65, 0.2, 30.0, 80)


def test_overrides_are_typed():
    config = load_config(PTB, ["train.lr=30", "train.small_batch_size=10", "run.tensorboard=false",
                               "train.asgd_trigger=nt", "model.dropout=0"])
    assert config.train.lr == 30.0 and isinstance(config.train.lr, float)
    assert config.small_batch_size == 10
    assert config.run.tensorboard is False and config.train.asgd_trigger == "nt"
    assert load_config(PTB).small_batch_size == 20      # null means the whole batch


def test_gpu_run_options_default_to_exact_resumes_without_deterministic_kernels():
    default = load_config(PTB).run
    assert default.ddp_reduce == "ordered" and default.deterministic is False
    chosen = load_config(PTB, ["run.ddp_reduce=allreduce", "run.deterministic=true"]).run
    assert chosen.ddp_reduce == "allreduce" and chosen.deterministic is True


@pytest.mark.parametrize("override, expected", [
    ("train.lr=abc", "train.lr: expected a finite float32 number, got 'abc'"),
    ("train.batch_size=2.5", "train.batch_size: expected an integer"),
    ("train.foo=1", "unknown key train.foo"),
    ("model.dropout=1.5", "model.dropout: expected a probability in [0, 1), got 1.5"),
    ("model.wdrop=-0.1", "model.wdrop: expected a probability"),
    ("train.lr=0", "train.lr: expected a value > 0"),
    ("train.asgd_trigger=sometimes", "train.asgd_trigger: expected one of 'et', 'nt', 'start', 'never'"),
    ("run.tensorboard=maybe", "run.tensorboard: expected true or false"),
    ("head.name=nope", "head.name: expected one of"),
    ("head.name=[mos]", "head.name: expected one of softmax, "),     # was a TypeError: unhashable type
    ("head.name={mos: 1}", "head.name: expected one of softmax, "),
    ("head=softmax", "head: expected a mapping of keys (name: and the head's options, e.g. head.name=softmax), "
                     "got 'softmax'"),
    ("head=3", "head: expected a mapping of keys"),
    ("head=null", "missing required key head.name (one of softmax, "),
    # an empty value was YAML's null: train.init_from=$UNSET trained from random weights
    ("train.init_from=", "empty value; write train.init_from=null to clear the setting, or give a value"),
    ("data.data_dir= ", "empty value; write data.data_dir=null"),
    ("run.dir=", "empty value; write run.dir=null"),
    ("data.data_dir=~", "~ alone is YAML's null; write data.data_dir=null to clear the setting, or give the folder's full path"),
    ("head.name=gss", "missing required key head.c of the gss head (a finite float32 number)"),
    ("head.k=2", "unknown key head.k (the softmax head takes no keys)"),
    ("model.nhidlast=300", "nhidlast must equal emsize"),
    ("train.small_batch_size=21", "small_batch_size: expected at most batch_size"),
    ("train.seed=99999999999999999999", "train.seed: expected an integer in [0, 2**63 - 1], got 99999999999999999999"),
    ("train.seed=-1", "train.seed: expected an integer in [0, 2**63 - 1], got -1"),
    ("run.device=gpu", "run.device: expected auto"),
    ("run.ddp_reduce=ring", "run.ddp_reduce: expected one of 'ordered', 'allreduce', got 'ring'"),
    ("run.deterministic=sometimes", "run.deterministic: expected true or false"),
    ("lr=3", "unknown section 'lr'"),
    ("trian.lr=1", "unknown section 'trian'"),        # a newcomer's typo: the override is named too
    ("train.lr", "expected key=value"),
    # YAML 1.1 read a leading 0 as octal, 0b as binary and a:b as base 60: other numbers, silently
    ("train.epochs=1:30", "train.epochs: expected an integer, got '1:30'"),
    ("train.lr=1:00", "train.lr: expected a finite float32 number, got '1:00'"),
    ("train.seed=0b101", "train.seed: expected an integer"),
    ("train.seed=0x1f", "train.seed: expected an integer"),
    # a value that is not YAML was kept as its raw text (a folder named '"runs/x')
    ('run.dir="runs/x', "the value is not valid YAML"),
    ("train={lr: 1", "the value is not valid YAML"),
    ("head={name: mos, name: softmax}", "key 'name' is written twice; keep one"),
])
def test_bad_values_name_the_override_and_key(override, expected):
    message = error_of(overrides=[override])
    assert expected in message
    if "=" in override:
        assert f"override {override!r}" in message


def test_a_config_without_a_head_names_its_file_and_the_missing_key():
    """train.py configs/ptb_mini/base.yaml said "config: head.name: expected one of ..., got None"."""
    assert error_of("configs/ptb_mini/base.yaml").startswith(
        "configs/ptb_mini/base.yaml: missing required key head.name (one of softmax, ")


def test_a_base_that_is_not_there_is_named_from_the_file_that_names_it(tmp_path):
    child = tmp_path / "child.yaml"
    for base in ("nowhere.yaml", "''"):
        child.write_text(f"base: {base}\nhead: {{name: softmax}}\n")
        message = error_of(child)
        assert message.startswith(f"{child}: base: "), message
    child.write_text("base: nowhere.yaml\n")
    assert error_of(child) == (f"{child}: base: nowhere.yaml: no such config file ({tmp_path / 'nowhere.yaml'}; "
                               f"a base is relative to the file that names it)")


def test_a_file_that_changes_its_bases_head_is_told_why_its_options_remain(tmp_path):
    child = tmp_path / "child.yaml"
    mos = Path("configs/ptb_mini/mos.yaml").resolve()
    child.write_text(f"base: {mos}\nhead: {{name: softmax}}\n")
    message = error_of(child)
    assert message.startswith(f"{mos}: unknown key head.components (the softmax head takes no keys; ")
    assert (f"{child} changes head.name: a file's head: merges over its base's, so base it on a config of "
            f"the new head") in message


def test_numbers_are_decimal_in_files_and_overrides(tmp_path):
    """seed: 0042 was 34 (octal) in a file while sweep.py --seeds 0042 gave 42."""
    assert load_config(PTB, ["train.seed=010", "train.epochs=08"]).train.seed == 10
    config = tmp_path / "c.yaml"
    config.write_text(f"base: {Path(PTB).resolve()}\ntrain: {{seed: 0042, epochs: 1_000}}\n")
    loaded = load_config(config)
    assert (loaded.train.seed, loaded.train.epochs) == (42, 1000)
    assert "train.epochs: expected an integer, got '1:30'" in error_of(config, overrides=["train.epochs=1:30"])


def test_errors_in_files_name_the_file(tmp_path):
    (tmp_path / "base.yaml").write_text("data: {dataset: ptb}\nmodel: {emsize: 4, nhid: 4, nhidlast: 4}\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: base.yaml\nhead: {name: softmax}\ntrain: {lr: 1, batch_size: 2, epochs: 1, seed: 1, bptt: fast}\n")
    message = error_of(bad)
    assert str(bad) in message and "train.bptt: expected an integer, got 'fast'" in message
    missing = tmp_path / "missing.yaml"
    missing.write_text("base: base.yaml\nhead: {name: softmax}\ntrain: {lr: 1, batch_size: 2, seed: 1}\n")
    assert f"{missing}: missing required key train.epochs" in error_of(missing)
    # an empty file: the file is named, not "config", nor the last override that touched the section
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    for overrides in ([], ["data.data_dir=/x"]):
        with pytest.raises(ConfigError) as raised:
            load_config(empty, overrides)
        assert str(raised.value) == f"{empty}: missing required key data.dataset (one of 'ptb', 'wikitext-2')"
    assert "config file not found" in error_of(tmp_path / "nope.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("train: [1, 2\n")
    assert "not valid YAML" in error_of(broken)
    loop = tmp_path / "loop.yaml"
    loop.write_text("base: loop.yaml\n")
    assert "cycle" in error_of(loop)
    # a bad value in a base file names the base file, not the config that chains to it
    (tmp_path / "bad_base.yaml").write_text("base: base.yaml\nmodel: {dropout: 1.5}\n")
    child = tmp_path / "child.yaml"
    child.write_text("base: bad_base.yaml\nhead: {name: softmax}\ntrain: {lr: 1, batch_size: 2, epochs: 1, seed: 1}\n")
    assert error_of(child) == f"{tmp_path / 'bad_base.yaml'}: model.dropout: expected a probability in [0, 1), got 1.5"


def test_another_head_over_a_file_that_sets_its_heads_options_says_how_to_clear_them():
    message = error_of("configs/ptb_mini/mos.yaml", overrides=["head.name=softmax"])
    assert message.startswith("configs/ptb_mini/mos.yaml: unknown key head.components (the softmax head takes no keys; ")
    assert "'head={}' head.name=..." in message
    assert load_config("configs/ptb_mini/mos.yaml", ["head={}", "head.name=softmax"]).head_name == "softmax"


def test_a_tilde_in_run_dir_or_a_plans_out_is_the_home_folder(tmp_path):
    """Quoted (`'run.dir=~/x'`) or written in a file, it made a folder named "~" in the current one."""
    from launch.plans import load_plan
    config = load_config("configs/ptb/softmax.yaml", ["run.dir=~/runs/x"])
    assert config.run.dir == str(Path.home() / "runs" / "x")
    plan = tmp_path / "plan.yaml"
    plan.write_text("title: t\nout: ~/results/t\nexperiments:\n  - config: configs/ptb/softmax.yaml\n")
    assert load_plan(plan).out == Path.home() / "results" / "t"


@dataclasses.dataclass(frozen=True)
class OptionsWritten310Style:       # a new head's Options, written as the repository's code writes types
    cap: float | None = None
    mode: int | str = 1


def test_options_typed_x_or_none_take_their_values():
    """`float | None` (types.UnionType, not typing.Union) refused every value, None included:
    "head.cap: expected float | None, got 2.0"."""
    def build(values):
        return build_section(OptionsWritten310Style, values, "head", {"head.cap": "x.yaml"}, owner="the new head")

    assert build({"cap": 2}).cap == 2.0 and build({"cap": None}).cap is None
    assert build({"mode": "k"}).mode == "k"
    with pytest.raises(ConfigError, match=r"^x\.yaml: head\.cap: expected a finite float32 number or null, got 'x'$"):
        build({"cap": "x"})
    with pytest.raises(ConfigError, match=r"head\.mode: expected an integer or a string, got None$"):
        build({"mode": None})


def test_an_option_typed_as_no_config_value_is_read_says_so():
    """A head's `sizes: tuple[int, ...]` said "head.sizes: expected tuple[int, ...], got [3, 4]",
    as if another value would do."""
    @dataclasses.dataclass(frozen=True)
    class OptionsWithATuple:
        sizes: tuple[int, ...] = (1, 2)

    with pytest.raises(ConfigError) as info:
        build_section(OptionsWithATuple, {"sizes": [3, 4]}, "head", {"head.sizes": "x.yaml"}, owner="the new head")
    assert str(info.value).startswith("x.yaml: head.sizes: the new head types this option tuple[int, ...], "
                                      "which no config value is read as; its Options field needs a type a "
                                      "config gives: int, float, bool, str, a Literal or one of these or None")


@dataclasses.dataclass(frozen=True)
class OptionsCheckedInTheirOwnWords:
    tau: float = 1.0
    lr: float = 0.1

    def __post_init__(self):
        if self.lr > self.tau:
            raise ValueError("lr: expected at most tau")
        if self.tau > 5:
            raise ValueError("temperature too high")


@pytest.mark.parametrize("values, expected", [
    # a message naming no key was "config: head.temperature too high"
    ({"tau": 6}, "x.yaml: head: temperature too high"),
    # a key the Options name but no source set (its default) was blamed on "config"
    ({"tau": 0.01}, "x.yaml: head.lr: expected at most tau"),
])
def test_an_options_check_is_blamed_on_the_source_that_chose_the_head(values, expected):
    origin = {"head.name": "x.yaml", "head.tau": "override 'head.tau=...'"}
    with pytest.raises(ConfigError) as info:
        build_section(OptionsCheckedInTheirOwnWords, values, "head", origin, owner="the new head")
    assert str(info.value) == expected


def test_resolved_config_round_trips():
    config = load_config(PTB, ["train.lr=7", "run.max_steps=3"])
    assert config_from_dict(config.to_dict()) == config


def test_train_py_reports_one_line_and_starts_nothing(tmp_path):
    proc = subprocess.run([sys.executable, "train.py", PTB, "model.dropout=1.5",
                           f"run.dir={tmp_path / 'run'}"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: override 'model.dropout=1.5': model.dropout: expected a probability in [0, 1), got 1.5"
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------- guard rails

def float_keys() -> list[str]:
    """Every float-valued key of every section and of every head's options."""
    import dataclasses
    import typing

    from experiment.config import SECTIONS
    from model.heads import HEADS

    def floats(cls) -> list[str]:
        hints = typing.get_type_hints(cls)
        return [f.name for f in dataclasses.fields(cls)
                if hints[f.name] is float or float in typing.get_args(hints[f.name])]

    keys = [f"{section}.{name}" for section, cls in SECTIONS.items() for name in floats(cls)]
    for head, cls in HEADS.items():
        keys += [f"head.name={head} head.{name}" for name in floats(cls.Options)]
    return keys


@pytest.mark.parametrize("key", float_keys())
@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", ".NaN", "1e39", "-1e300"])
def test_non_finite_values_are_refused_for_every_float_key(key, value):
    *head, key = key.split()
    gss_needs = ["head.c=0", "head.k=2"] if head == ["head.name=gss"] else []
    message = error_of(overrides=[*head, *gss_needs, f"{key}={value}"])
    assert re.search(f"{re.escape(key)}: expected a finite float32 number( or null)?, got", message), message


def test_there_are_float_keys_in_every_section_and_head_option_family():
    keys = " ".join(float_keys())
    for key in ("model.dropout", "train.lr", "train.clip", "train.wdecay", "train.alpha",
                "head.c", "head.k", "head.bound", "head.dropoutl"):
        assert key in keys


def test_non_finite_values_in_files_are_refused(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: " + str((Path(PTB).parent / "base.yaml").resolve()) +
                   "\nhead: {name: softmax}\ntrain: {clip: .nan}\n")
    assert f"{bad}: train.clip: expected a finite float32 number, got nan" in error_of(bad)


@pytest.mark.parametrize("text, expected", [
    ("1e-6", 1e-6), ("1e30", 1e30), ("1E+3", 1000.0), ("-2.5e-1", -0.25), ("1.0e5", 1e5),
    (".5e1", 5.0), ("3", 3.0), ("0.25", 0.25),
])
def test_every_ordinary_way_to_write_a_number_is_a_number(text, expected, tmp_path):
    assert load_config(PTB, [f"train.wdecay={text.lstrip('-')}"]).train.wdecay == abs(expected)
    assert load_config(PTB, ["head.name=gss", f"head.c={text}", "head.k=2"]).head.c == expected
    in_file = tmp_path / "numbers.yaml"
    in_file.write_text(f"base: {Path(PTB).resolve()}\ntrain:\n  lr: {text.lstrip('-')}\n")
    assert load_config(in_file).train.lr == abs(expected)


def test_a_key_written_twice_in_a_file_is_an_error_naming_file_and_key(tmp_path):
    twice = tmp_path / "twice.yaml"
    twice.write_text(f"base: {Path(PTB).resolve()}\ntrain:\n  lr: 30\n  clip: 0.1\n  lr: 10\n")
    message = error_of(twice)
    assert str(twice) in message and "'lr'" in message and "twice" in message and "line 5" in message
    sections = tmp_path / "sections.yaml"
    sections.write_text(f"base: {Path(PTB).resolve()}\ntrain: {{lr: 30}}\ntrain: {{clip: 0.1}}\n")
    assert "'train'" in error_of(sections)


def test_unreadable_config_files_are_one_line(tmp_path):
    assert f"{tmp_path}: is a directory" in error_of(tmp_path)
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("head: {name: softmax}  # café\n".encode("latin-1"))
    assert f"{latin1}: not UTF-8 text" in error_of(latin1)


@pytest.mark.parametrize("device", ["cuda:abc", "gpu", "cuda:0:1", "cpu:0x", "cuda:-1"])
def test_device_names_are_checked(device):
    assert "run.device: expected auto, cpu, mps, cuda or cuda:N" in error_of(overrides=[f"run.device={device}"])


def test_docs_configs_lists_every_choice_of_every_key():
    """docs/configs.md names each value a key with a fixed set of choices takes (asgd_trigger:
    start, which the finetuning uses, was missing), in that key's section row."""
    import dataclasses
    import typing
    from experiment.config import SECTIONS
    rows = {line.split("|")[1].strip(" `"): line for line in
            (Path(__file__).resolve().parent.parent / "docs" / "configs.md").read_text(encoding="utf-8").splitlines()
            if line.startswith("| `")}
    checked = 0
    for section, cls in SECTIONS.items():
        for field in dataclasses.fields(cls):
            kind = typing.get_type_hints(cls)[field.name]
            if typing.get_origin(kind) is typing.Literal:
                row = rows[section]
                assert f"`{field.name}`" in row, (section, field.name)
                after = row.split(f"`{field.name}`", 1)[1]
                for choice in typing.get_args(kind):
                    assert f"`{choice}`" in after, f"docs/configs.md: {section}.{field.name}: `{choice}` missing"
                checked += 1
    assert checked >= 3                 # data.dataset, train.asgd_trigger, run.ddp_reduce
