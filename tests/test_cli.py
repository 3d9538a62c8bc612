"""experiment/cli.py: every script's bad arguments are one line and exit 2; the scripts that read
runs end on Ctrl-C with one line and exit 130."""
from __future__ import annotations

import argparse
import ast
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from experiment.cli import main_begins, quiet_interrupt_while_starting, run_script
from tests.conftest import parser_of

import evaluate
import generate
import rank
import report
import sweep
import synthetic
import train

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("main, argv, line", [
    (rank.main, ["runs/x", "--contexts", "0"], "rank.py: error: --contexts: expected an integer >= 1, got 0"),
    (sweep.main, ["configs/ptb/softmax.yaml", "--out", "x", "--jobs", "0"],
     "sweep.py: error: --jobs: expected an integer >= 1, got 0"),
    (report.main, ["table", "results/cpu_ptb"],
     "report.py table: error: the following arguments are required: --out"),
    (train.main, ["configs/ptb/softmax.yaml", "--bogus"], "train.py: error: unrecognized arguments: --bogus"),
    # an override before the config file was "give one of: a config file, ..."
    (train.main, ["run.max_steps=3", "configs/ptb/softmax.yaml"],
     "train.py: error: configs/ptb/softmax.yaml: the config file comes before the overrides "
     "(train.py configs/ptb/softmax.yaml key=value ...)"),
    (evaluate.main, [], "evaluate.py: error: the following arguments are required: path"),
    (generate.main, ["runs/x", "--words"], "generate.py: error: argument --words: expected one argument"),
    (synthetic.main, ["--words", "1"], "synthetic.py: error: argument --words: expected an integer >= 2, got '1'"),
    # seeds past what torch's generators take were a traceback from inside torch (generate.py),
    # or blamed on best.pt (rank.py --robustness): the range train.seed takes, checked first
    (generate.main, ["runs/x", "--seed", "99999999999999999999"],
     "generate.py: error: argument --seed: expected an integer in [0, 2**63 - 1], got 99999999999999999999"),
    (rank.main, ["runs/x", "--robustness", "--seed", "-1"],
     "rank.py: error: argument --seed: expected an integer in [0, 2**63 - 1], got -1"),
    (sweep.main, ["--seeds", "1", "2", "configs/ptb/softmax.yaml", "--out", "x"],
     "sweep.py: error: --seeds took configs/ptb/softmax.yaml as a seed: give the config or plan first "
     "(sweep.py configs/ptb/softmax.yaml --seeds ...)"),
    (sweep.main, ["configs/ptb/softmax.yaml", "--out", "x", "--seeds", "1", "abc"],
     "sweep.py: error: --seeds: expected integers or config, the config's own seed, got 'abc'"),
    (sweep.main, ["configs/ptb/softmax.yaml", "--out", "x", "--seeds", "1", str(2**63)],
     f"sweep.py: error: --seeds: expected an integer in [0, 2**63 - 1], got {2**63}"),
])
def test_bad_arguments_are_one_line_and_exit_2(main, argv, line, capsys):
    """Not argparse's usage block and then the line: the one line (--help has the usage)."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == line + "\n"


def test_an_interruption_is_one_line_and_exit_130(capsys):
    def interrupted() -> int:
        raise KeyboardInterrupt
    with pytest.raises(SystemExit) as exit_info:
        run_script(interrupted)
    assert exit_info.value.code == 130
    assert capsys.readouterr().err == ("interrupted (Ctrl-C): stopped before the end; run the same "
                                       "command again\n")
    with pytest.raises(SystemExit) as exit_info:
        run_script(lambda: 2)
    assert exit_info.value.code == 2


@pytest.mark.parametrize("script", ["evaluate.py", "rank.py", "generate.py", "sweep.py"])
def test_a_script_of_one_process_under_torchrun_is_one_line_from_rank_0(script, tmp_path):
    """`torchrun --nproc_per_node 2 evaluate.py RUN` (train.py's way, in gpus.md) started two
    evaluations of one run: the second was refused the run's lock, and torchrun stopped the first
    with a SIGTERM whose line said to run the same command again. Each process is now refused
    before it reads anything, rank 0 saying why; a 1-process torchrun is one process."""
    run = tmp_path / "run"
    run.mkdir()
    launched = {**os.environ, "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                "TORCHELASTIC_RUN_ID": "none"}
    refusal = (f"error: {script} runs in one process; start it with python, not torchrun (train.py is "
               f"the script that trains across processes; sweep.py --nproc starts it so)\n")
    for rank, said in (("0", refusal), ("1", "")):
        done = subprocess.run([sys.executable, script, str(run)], cwd=REPO, capture_output=True, text=True,
                              env={**launched, "RANK": rank}, timeout=120)
        assert (done.returncode, done.stderr, done.stdout) == (2, said, "")
    assert list(run.iterdir()) == []
    alone = subprocess.run([sys.executable, script, str(run)], cwd=REPO, capture_output=True, text=True,
                           env={**launched, "WORLD_SIZE": "1", "RANK": "0"}, timeout=120)
    assert "not torchrun" not in alone.stderr and alone.returncode == 2      # the empty run's own refusal


def test_only_torchruns_own_mark_with_several_processes_refuses_a_one_process_script():
    """A cluster's RANK / WORLD_SIZE / LOCAL_RANK inherited by a plain `python evaluate.py`
    (a PyTorchJob's pod) is no torchrun; a 1-process torchrun is one process."""
    from experiment.cli import started_by_torchrun_in_several_processes as several
    assert several({"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"})
    assert not several({"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"})
    assert not several({"WORLD_SIZE": "4", "RANK": "0", "LOCAL_RANK": "0"})
    assert not several({"LOCAL_RANK": "0"})
    assert not several({"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "two"})


@pytest.mark.parametrize("script", ["evaluate.py", "rank.py", "generate.py", "report.py", "synthetic.py"])
def test_each_script_ends_through_run_script(script):
    """Its `if __name__ == "__main__":` block is run_script(main) (train.py and sweep.py handle
    the interruption themselves: they save, and say how to continue)."""
    tree = ast.parse((REPO / script).read_text(encoding="utf-8"))
    *_, main_block = [node for node in tree.body if isinstance(node, ast.If)
                      and ast.unparse(node.test) == "__name__ == '__main__'"]
    assert [ast.unparse(statement) for statement in main_block.body] == ["run_script(main)"]


@pytest.mark.parametrize("script", ["train.py", "evaluate.py", "rank.py", "generate.py", "sweep.py",
                                    "report.py", "synthetic.py"])
def test_ctrl_c_while_torch_imports_is_one_line(script, tmp_path):
    """A Ctrl-C in the first seconds, while torch imports, was a traceback from inside torch's
    import. A torch that raises KeyboardInterrupt as it imports stands in for the keystroke."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise KeyboardInterrupt\n", encoding="utf-8")
    done = subprocess.run([sys.executable, script, "--help"], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=120)
    assert done.stderr == "interrupted (Ctrl-C) while starting: nothing was done\n"
    assert done.returncode == -signal.SIGINT       # Python ends itself by SIGINT: 130 in a shell
    assert done.stdout == ""


def test_ctrl_c_after_main_begins_is_the_scripts_own_to_handle():
    """The starting line would be false once main() runs (it may have written): from there an
    interruption that escapes main() is shown whole."""
    quiet_interrupt_while_starting()
    try:
        assert sys.excepthook is not sys.__excepthook__
        main_begins()
        assert sys.excepthook is sys.__excepthook__
    finally:
        sys.excepthook = sys.__excepthook__


# A shell starts background commands with SIGINT ignored, and Python then leaves it ignored: the
# child restores Python's own handler, so that the test does not depend on how pytest was started.
CHILD = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
import rank
from experiment.cli import run_script
from tests.conftest import parser_of

import evaluate
import generate
import rank
import report
import sweep
import synthetic
import train
def long_computation(*args, **kwargs):
    print("under way", flush=True)
    time.sleep(60)
rank.compute_ranks = long_computation
run_script(lambda: rank.main([sys.argv[1], "--device", "cpu"]))
"""


@pytest.mark.parametrize("signum, code, how", [(signal.SIGINT, 130, "interrupted (Ctrl-C)"),
                                              (signal.SIGTERM, 143, "stopped (SIGTERM)")])
def test_ctrl_c_or_sigterm_during_rank_py_is_one_line_and_releases_the_run(signum, code, how, tiny_run, tmp_path):
    """A real SIGINT or SIGTERM while rank.py holds the run directory's lock: one line, exit 130
    or 143, and the lock is free for the next command."""
    run_dir = shutil.copytree(tiny_run, tmp_path / "run")      # rank.py writes into it
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(run_dir)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "under way"
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert "Traceback" not in err
    assert err.strip().splitlines() == [f"{how}: stopped before the end; run the same command again"]
    done = subprocess.run([sys.executable, "rank.py", str(run_dir), "--device", "cpu", "--contexts", "50"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("script", [evaluate, rank])
def test_a_run_in_use_is_refused_with_the_documented_way_out(script, tiny_run, tmp_path, capsys):
    """evaluate.py and rank.py on a run that another process writes into (a training): one line
    that says what to do, copy the checkpoint elsewhere (docs/training.md), not "choose another
    directory", which they have no option for."""
    import os
    from experiment.run_directory import RunLock
    run_dir = shutil.copytree(tiny_run, tmp_path / "run")
    name = Path(script.__file__).name
    with RunLock(run_dir):             # another open file: flock refuses this process too
        assert script.main([str(run_dir), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {run_dir} is in use by PID {os.getpid()} (") and err.count("\n") == 1
    assert err.endswith(f"; one process at a time writes into a run directory: wait for it to end, or "
                        f"copy {run_dir / 'best.pt'} into a folder of its own and run {name} on the copy\n")


@pytest.fixture
def published_run(tiny_run, tmp_path) -> Path:
    """tiny_run as if trained on the published corpus (data.allow_modified_corpus false), its
    data.data_dir still the slice of PTB it was trained on: a modified corpus for it."""
    import torch
    run_dir = shutil.copytree(tiny_run, tmp_path / "run")
    checkpoint = torch.load(run_dir / "best.pt", weights_only=True)
    checkpoint["config"]["data"]["allow_modified_corpus"] = False
    torch.save(checkpoint, run_dir / "best.pt")
    return run_dir


@pytest.mark.parametrize("script, options", [(evaluate, []), (rank, ["--contexts", "20"]),
                                              (generate, ["--words", "5"])])
def test_a_data_dir_without_the_corpus_is_refused_not_downloaded_into(script, options, tiny_run, tmp_path,
                                                                       monkeypatch, capsys):
    """--data-dir naming a folder without the run's corpus (a typo, the wrong folder) was a
    download into it while evaluating."""
    import data.corpus
    monkeypatch.setattr(data.corpus, "ensure_corpus", lambda *a, **k: pytest.fail("tried to download"))
    wrong = tmp_path / "no-such-folder"
    assert script.main([str(tiny_run), "--device", "cpu", "--data-dir", str(wrong), *options]) == 2
    assert capsys.readouterr().err == (
        f"error: --data-dir {wrong}: no train.txt in {wrong / 'ptb'}: give the folder that holds ptb/, or "
        f"leave --data-dir out for the run's own\n")
    assert not wrong.exists()


@pytest.mark.parametrize("script, options", [(evaluate, []), (rank, ["--contexts", "20"]),
                                              (generate, ["--words", "5"])])
def test_a_modified_corpus_is_refused_with_a_hint_the_script_takes(script, options, published_run, capsys):
    """Not "set data.allow_modified_corpus=true", which these scripts cannot take: their own
    --allow-modified-corpus, which reads the corpus."""
    argv = [str(published_run), "--device", "cpu", *options]
    assert script.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "/ptb/train.txt: " in err and "not the published ptb train split" in err     # the file, what is wrong
    assert err.endswith("; restore the file, or give --allow-modified-corpus to use it on purpose\n"), err
    assert script.main([*argv, "--allow-modified-corpus"]) == 0


def test_an_evaluation_on_other_test_text_says_so_and_a_table_leaves_it_out(tiny_run, tmp_path, capsys):
    """A test split of other sentences of the same words passes the vocabulary check: evaluate.py
    wrote its perplexity into eval_best.json, and report.py table showed it as the run's."""
    import json
    from tests.test_train_guard_rails import other_text_same_words
    run_dir = shutil.copytree(tiny_run, tmp_path / "run")
    trained_on = Path(json.loads((run_dir / "run.json").read_text())["corpus"]["folder"])
    other = other_text_same_words(trained_on.parent, tmp_path / "other", "test")
    capsys.readouterr()
    assert evaluate.main([str(run_dir), "--device", "cpu", "--data-dir", str(other)]) == 0
    err = capsys.readouterr().err
    assert f"note: {run_dir} trained beside other text: test.txt (sha256 " in err
    assert f"in {other / 'ptb'}, " in err and f"in {trained_on} at training); what follows is of this text" in err
    assert report.main(["table", str(run_dir), "--out", str(tmp_path / "t")]) == 0
    missing = (tmp_path / "t.md").read_text().split("## Missing or incomplete")[1]
    assert "eval_best.json was computed on other text than the run trained beside: test.txt" in missing
    capsys.readouterr()
    assert evaluate.main([str(run_dir), "--device", "cpu"]) == 0      # the run's own folder again
    assert "trained beside other text" not in capsys.readouterr().err
    assert report.main(["table", str(run_dir), "--out", str(tmp_path / "t")]) == 0
    assert "other text" not in (tmp_path / "t.md").read_text()


def test_a_modified_corpus_hint_names_no_option_a_caller_does_not_have(published_run):
    """report.py's commands that load a run (wordsim, top5, diagnose) have no such option."""
    import torch
    from data import DataError
    from experiment.loading import load_trained
    with pytest.raises(DataError) as error:
        load_trained(published_run, torch.device("cpu"))
    assert str(error.value).endswith("; restore the file")


@pytest.mark.parametrize("script", [train, evaluate, rank, generate, sweep, synthetic, report])
def test_every_option_has_a_help_text(script, monkeypatch):
    """(synthetic.py's --window and --out had none.)"""
    parse_args = script.parse_args if script is not train else __import__(
        "experiment.training_run", fromlist=["parse_args"]).parse_args
    parsers = [parser_of(parse_args, monkeypatch)]
    for action in parsers[0]._actions:           # report.py's subcommands
        if isinstance(action, argparse._SubParsersAction):
            parsers += action.choices.values()
    missing = [f"{parser.prog} {'/'.join(action.option_strings) or action.dest}" for parser in parsers
               for action in parser._actions if not action.help and action.dest != "help"
               and not isinstance(action, argparse._SubParsersAction)]      # its commands have theirs
    assert missing == []
