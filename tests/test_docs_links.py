"""The pages (README.md and the guides docs/*.md) point at what exists: every relative link and
image resolves to a file of the repository, with its `#anchor` a heading of the target page, and
every repository path they name in code (`model/heads/mos.py`, `python sweep.py sweeps/x.yaml`)
exists. Examples of what a reader is asked to create are allowed by name, below, with the reason."""
from __future__ import annotations

import itertools
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# Paths the pages name that are not in the repository on purpose, each with its reason.
NOT_IN_THE_REPOSITORY = {
    "model/heads/temperature.py": 'the example head of "Adding a head" (docs/heads.md), written by the reader',
    "configs/ptb/temperature.yaml": 'the example head\'s PTB config, "Adding a head"',
    "configs/wt2/temperature.yaml": 'the example head\'s WikiText-2 config, "Adding a head"',
    "configs/ptb_mini/temperature.yaml": 'the example head\'s miniature config, "Adding a head"',
    "configs/ptb/NAME.yaml": 'a reader\'s head\'s config, NAME its registry name ("Adding a head")',
    "configs/ptb_mini/NAME.yaml": 'the same, the miniature\'s',
    "model/kernels/NAME.py": 'a reader\'s head\'s fused kernel ("Adding a head")',
    "tests/test_NAME.py": 'a reader\'s head\'s own test ("Adding a head")',
    "sweeps/cpu_d8.yaml": 'the example plan of "Adding an experiment" (docs/sweeps.md), written by the reader',
    "results/cpu_d8": "the folder the example plan's runs go to",
    "data/word-sim/": "a folder of Faruqui's eval-word-vectors repository, not of this one",
    "pointer.py": "the AWD-LSTM repository's neural cache, cited, not part of this repository",
    "dynamiceval.py": "the MoS repository's dynamic evaluation, cited, not part of this repository",
}

FENCE = re.compile(r"^```.*?^```[ \t]*$", re.S | re.M)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(([^()\s]+)\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
PATH_TOKEN = re.compile(r"[\w.{},/+-]+")


def rel(page: Path) -> str:
    return page.relative_to(REPO).as_posix()


def prose(text: str) -> str:
    """The page without its fenced code blocks and inline code spans."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())     # a link keeps its text
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings (outside code blocks), duplicates numbered as GitHub does."""
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", FENCE.sub("", page.read_text(encoding="utf-8")), re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> list[str]:
    return LINK.findall(prose(page.read_text(encoding="utf-8")))


def broken_link(page: Path, target: str) -> str | None:
    """Why `target`, a link of `page`, does not resolve; None when it does (or is not relative)."""
    if re.match(r"[a-z][a-z0-9+.-]*:", target):          # https:, mailto: ...
        return None
    path, _, anchor = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    if not dest.exists():
        return f"{rel(page)}: {target}: no file {path}"
    if REPO not in dest.parents and dest != REPO:
        return f"{rel(page)}: {target}: outside the repository"
    if anchor:
        if dest.suffix != ".md":
            return f"{rel(page)}: {target}: an anchor into a file that is not a page"
        if anchor not in anchors(dest):
            return f"{rel(page)}: {target}: {rel(dest)} has no heading #{anchor}"
    return None


def expand_braces(token: str) -> list[str]:
    """configs/{ptb,wt2}/x.yaml -> configs/ptb/x.yaml, configs/wt2/x.yaml (braces with a comma)."""
    parts = re.split(r"(\{[^{}]*,[^{}]*\})", token)
    options = [p[1:-1].split(",") if p.startswith("{") and "," in p else [p] for p in parts]
    return ["".join(choice) for choice in itertools.product(*options)]


def tracked_top_level() -> set[str]:
    """The first components of the repository's files (git's, or the folder's without git)."""
    try:
        files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                               check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        files = [p.relative_to(REPO).as_posix() for p in REPO.iterdir()]
    return {f.split("/")[0] for f in files}


def named_paths(page: Path, top: set[str]) -> list[str]:
    """Repository paths a page names in code (inline spans and fenced blocks): tokens whose first
    component is a top-level file or folder of the repository (so `runs/...`, `RUN_DIR/.lock`,
    `ptb/` under $AWD_DATA_DIR and other paths that are not the repository's are left out), and
    bare `*.py` names. Tokens with placeholders (`<head>`, `$OUT`, `...`) are left out."""
    text = page.read_text(encoding="utf-8")
    code = CODE_SPAN.findall(FENCE.sub("", text)) + [m.group(0) for m in FENCE.finditer(text)]
    out = []
    for token in (t for chunk in code for t in chunk.split()):
        token = token.strip("()[],;:'\"").rstrip(".")
        if not PATH_TOKEN.fullmatch(token) or "..." in token or token.startswith("/"):
            continue
        first = token.split("/")[0]
        if ("/" in token and first in top) or ("/" not in token and token.endswith(".py")):
            out.extend(expand_braces(token))
    return out


def path_exists(name: str) -> bool:
    if "/" in name:
        return (REPO / name).exists()
    return (REPO / name).exists() or any(REPO.glob(f"*/**/{name}"))   # e.g. bench_step.py


def test_the_pages_are_the_readme_and_the_guides():
    names = {rel(p) for p in PAGES}
    assert {"README.md", "docs/reference.md", "docs/published.md", "docs/training.md",
            "docs/results_cpu.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_relative_link_and_image_resolves(page):
    found = links(page)
    problems = [p for p in (broken_link(page, t) for t in found) if p]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_repository_path_named_in_code_exists(page):
    top = tracked_top_level()
    missing = sorted({p for p in named_paths(page, top)
                      if p not in NOT_IN_THE_REPOSITORY and not path_exists(p)})
    assert not missing, f"{rel(page)} names paths that do not exist: {missing}"


def test_the_allowed_paths_are_named_and_still_absent():
    """Each allowed path is still named by a page and still absent: a stale entry is removed."""
    top = tracked_top_level()
    named = {p for page in PAGES for p in named_paths(page, top)}
    for path, reason in NOT_IN_THE_REPOSITORY.items():
        assert path in named, f"{path} ({reason}) is no longer named by any page"
        assert not path_exists(path), f"{path} exists now: remove it from NOT_IN_THE_REPOSITORY"


def test_the_checks_catch_a_broken_link_anchor_and_path(tmp_path, monkeypatch):
    """The checks themselves: a missing file, a missing heading and a missing path are reported."""
    page = REPO / "docs" / "training.md"
    assert broken_link(page, "configs.md") is None
    assert broken_link(page, "gpus.md#multiple-gpus") is None
    assert broken_link(page, "../README.md#references") is None
    assert "no file" in broken_link(page, "configz.md")
    assert "no heading" in broken_link(page, "gpus.md#several-gpus")
    assert "no heading" in broken_link(page, "#no-such-section")
    assert slug("Many runs: sweep.py and experiment plans") == "many-runs-sweeppy-and-experiment-plans"
    assert slug("Reading against [SB] and [LMS]") == "reading-against-sb-and-lms"
    fake = tmp_path / "page.md"
    fake.write_text("See `model/heads/nothing.py` and `train.py`, `runs/x/best.pt`, `RUN_DIR/.lock`.\n"
                    "```bash\npython benchmarks/bench_nothing.py configs/{ptb,wt2}/softmax.yaml\n```\n"
                    "[a](docs/nowhere.md) ![b](results/cpu_ptb/report/curves.png)\n", encoding="utf-8")
    named = named_paths(fake, tracked_top_level())
    assert named == ["model/heads/nothing.py", "train.py", "benchmarks/bench_nothing.py",
                     "configs/ptb/softmax.yaml", "configs/wt2/softmax.yaml"]
    assert [p for p in named if not path_exists(p)] == ["model/heads/nothing.py",
                                                        "benchmarks/bench_nothing.py"]
    assert links(fake) == ["docs/nowhere.md", "results/cpu_ptb/report/curves.png"]


def test_the_readmes_cost_table_quotes_the_benchmarks_page():
    """The step costs under README's heads table, and Mixtape's step against MoS's below it, are
    figures docs/benchmarks.md gives with their commands: a number edited on the front page alone
    fails."""
    from tests.conftest import doc_section
    section = doc_section("README.md", "Output heads")
    rows = [line for line in section.splitlines() if line.startswith("| ") and " MB |" in line]
    assert len(rows) >= 3, "README's Output heads has no cost table"
    number = re.compile(r"\d[\d,]*(?:\.\d+)?")
    page = set(number.findall((REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")))
    for row in rows:
        quoted = set(number.findall(row.split("|", 2)[2])) - {"1", "15", "4", "32"}  # K, d, the unit
        assert quoted <= page, (row, quoted - page)
    against_mos = section[section.index("Mixtape's full step is"):section.index("On an H200")]
    quoted = set(number.findall(against_mos))
    assert quoted and quoted <= page, (against_mos, quoted - page)


def test_the_quick_start_says_where_the_corpora_come_from():
    """AWD_DATA_DIR, what else sets the folder, and that a missing corpus is downloaded."""
    from tests.conftest import doc_section
    text = " ".join(doc_section("README.md", "Quick start").split())
    for said in ("`AWD_DATA_DIR`", "`data.data_dir=DIR`", "`--data-dir DIR`", "`corpora/`",
                 "downloaded into it on first use", "SHA-256"):
        assert said in text, said


def test_the_first_runs_rank_lines_are_explained_where_it_points():
    """The README's first run shows rank.py's effective-rank line; docs/ranks.md explains it."""
    from tests.conftest import doc_section
    assert "(docs/ranks.md#what-rankpy-prints)" in doc_section("README.md", "Quick start")
    explained = doc_section("docs/ranks.md", "What rank.py prints")
    assert "effective rank eps 0.001: A, eps 0.0001: B, eps 1e-05: C" in explained
    assert "ε-effective rank" in explained and "Press rank 18" in explained


# The command lines a reader copies: the pages', and those of the launch scripts, the plans and the
# configs (their comments). Each option they give a repository script is one that script takes,
# and each `train.py` / `sweep.py` line on a repository config loads with its overrides.
COMMAND_SOURCES = [*PAGES, *sorted((REPO / "scripts").glob("*.sh")), *sorted((REPO / "sweeps").glob("*.yaml")),
                   *sorted((REPO / "configs").rglob("*.yaml"))]
TOP_LEVEL_SCRIPTS = {"train", "evaluate", "rank", "generate", "sweep", "report", "synthetic"}
OVERRIDE = re.compile(r"[a-z_]+\.[a-z_]+=\S+")


def command_lines(source: Path) -> list[str]:
    """A page's code (fenced blocks' lines and inline spans); a launch script's lines (continued
    lines joined); a YAML file's comments."""
    text = source.read_text(encoding="utf-8")
    if source.suffix == ".sh":
        return text.replace("\\\n", " ").splitlines()
    if source.suffix == ".yaml":                 # a span may go on to the next comment line
        comments = " ".join(line.split("#", 1)[1] for line in text.splitlines() if "#" in line)
        return CODE_SPAN.findall(comments)
    blocks = [line for m in FENCE.finditer(text) for line in m.group(0).splitlines()[1:-1]]
    return blocks + CODE_SPAN.findall(FENCE.sub("", text))


def script_module(token: str, previous: str) -> str | None:
    """The module a command's token runs: train.py, evaluate.py ... (train.py's parser lives in
    experiment.training_run), benchmarks/bench_group.py or bench_group.py, `-m benchmarks.x`."""
    if previous == "-m" and token.startswith("benchmarks."):
        return token
    if not token.endswith(".py"):
        return None
    stem = token[:-3].split("/")[-1]
    if stem in TOP_LEVEL_SCRIPTS:
        return "experiment.training_run" if stem == "train" else stem
    return f"benchmarks.{stem}" if (REPO / "benchmarks" / f"{stem}.py").exists() else None


def documented_commands(source: Path) -> list[tuple[str, list[str]]]:
    """(module, the tokens after the script's name) for each command line of `source` that runs a
    repository script, cut at a comment, a pipe, `&&`, `;` or a closing parenthesis, the tokens
    stripped of the prose's punctuation."""
    found = []
    for line in command_lines(source):
        for piece in re.split(r"\s#|\||&&|;|\$\(|\)", line):
            tokens = [t.strip("`'\"(,:;.") for t in piece.split()]
            for i, token in enumerate(tokens):
                module = script_module(token, tokens[i - 1] if i else "")
                if module:
                    found.append((module, tokens[i + 1:]))
                    break
    return found


def unknown_options(parser, tokens: list[str]) -> list[str]:
    """The --options among `tokens` that `parser` (and the subcommand the tokens name, where the
    parser has subcommands) does not take; a subcommand it does not have is reported by name."""
    import argparse
    options = set(parser._option_string_actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            command = next((t for t in tokens if not t.startswith("-")), None)
            if command is not None and command not in action.choices:
                return [f"no command {command}"]
            if command is not None:
                options |= set(action.choices[command]._option_string_actions)
    return [t for t in tokens if t.startswith("--") and t.split("=")[0] not in options]


def config_overrides(tokens: list[str]) -> tuple[str, list[str]] | None:
    """(config, its overrides) of a train.py or sweep.py line on a repository config with no
    placeholder among them (`train.seed=S`, `<...>`, `$X`); None otherwise. A --grid's values are
    a grid's, not overrides."""
    if not tokens or not re.fullmatch(r"configs/[\w/]+\.yaml", tokens[0]) or not (REPO / tokens[0]).exists():
        return None
    overrides = [t for i, t in enumerate(tokens[1:]) if OVERRIDE.fullmatch(t) and tokens[i] != "--grid"]
    if any(re.search(r"[<>${}]|\.\.\.|=[A-Z_]+$", t) for t in overrides):
        return None
    return tokens[0], overrides


@pytest.fixture
def parsers(monkeypatch):
    """module -> the parser its script builds (each built once per test)."""
    import importlib
    from tests.conftest import parser_of
    built = {}

    def parser(module: str):
        if module not in built:
            loaded = importlib.import_module(module)
            built[module] = parser_of(getattr(loaded, "parse_args", None) or loaded.main, monkeypatch)
        return built[module]
    return parser


@pytest.mark.parametrize("source", COMMAND_SOURCES, ids=rel)
def test_every_option_a_command_line_gives_a_script_is_one_it_takes(source, parsers):
    problems = [f"{module} {' '.join(tokens)}: {bad}" for module, tokens in documented_commands(source)
                for bad in unknown_options(parsers(module), tokens)]
    assert not problems, f"{rel(source)}:\n" + "\n".join(problems)


@pytest.mark.parametrize("source", COMMAND_SOURCES, ids=rel)
def test_every_command_line_on_a_repository_config_loads_with_its_overrides(source):
    from experiment.config import ConfigError, load_config
    problems = []
    for module, tokens in documented_commands(source):
        if module in ("experiment.training_run", "sweep") and (line := config_overrides(tokens)):
            try:
                load_config(*line)
            except ConfigError as error:
                problems.append(f"{' '.join(tokens)}: {error}")
    assert not problems, f"{rel(source)}:\n" + "\n".join(problems)


def test_the_command_checks_catch_an_unknown_option_command_and_override(tmp_path, parsers):
    """The checks themselves, on a page of made-up lines beside good ones."""
    from experiment.config import ConfigError, load_config
    page = tmp_path / "page.md"
    page.write_text("Run `python sweep.py PLAN --jobs 2 --job 3` (two runs), then `report.py seeds --spread 0.6`\n"
                    "and `report.py sed --spread 0.6` or `bench_group.py --products`.\n"
                    "```bash\npython train.py configs/ptb/softmax.yaml train.epochs=1 train.epoch=2   # --nothing\n"
                    "python -m benchmarks.gpu_check --only group | tee x.txt --not-this\n```\n", encoding="utf-8")
    commands = documented_commands(page)
    assert [m for m, _ in commands] == ["experiment.training_run", "benchmarks.gpu_check", "sweep", "report",
                                        "report", "benchmarks.bench_group"]
    assert [unknown_options(parsers(m), t) for m, t in commands] == [[], [], ["--job"], [], ["no command sed"], []]
    config, overrides = config_overrides(commands[0][1])
    assert overrides == ["train.epochs=1", "train.epoch=2"]
    with pytest.raises(ConfigError, match="train.epoch"):
        load_config(config, overrides)
    assert config_overrides(["configs/ptb/softmax.yaml", "train.seed=S"]) is None
    assert config_overrides(["configs/ptb/gss.yaml", "--grid", "head.c=-1.5,0"]) == ("configs/ptb/gss.yaml", [])
