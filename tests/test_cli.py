"""experiment/cli.py: the scripts that read runs end on Ctrl-C with one line and exit 130."""
from __future__ import annotations

import ast
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from experiment.cli import run_script

REPO = Path(__file__).resolve().parent.parent


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


@pytest.mark.parametrize("script", ["evaluate.py", "rank.py", "generate.py", "report.py", "synthetic.py"])
def test_each_script_ends_through_run_script(script):
    """Its `if __name__ == "__main__":` block is run_script(main) (train.py and sweep.py handle
    the interruption themselves: they save, and say how to continue)."""
    tree = ast.parse((REPO / script).read_text(encoding="utf-8"))
    main_block = next(node for node in tree.body if isinstance(node, ast.If)
                      and ast.unparse(node.test) == "__name__ == '__main__'")
    assert [ast.unparse(statement) for statement in main_block.body] == ["run_script(main)"]


# A shell starts background commands with SIGINT ignored, and Python then leaves it ignored: the
# child restores Python's own handler, so that the test does not depend on how pytest was started.
CHILD = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
import rank
from experiment.cli import run_script
def long_computation(*args, **kwargs):
    print("under way", flush=True)
    time.sleep(60)
rank.compute_ranks = long_computation
run_script(lambda: rank.main([sys.argv[1], "--device", "cpu"]))
"""


def test_ctrl_c_during_rank_py_is_one_line_and_releases_the_run(tiny_run, tmp_path):
    """A real SIGINT while rank.py holds the run directory's lock: one line, exit 130, and the
    lock is free for the next command."""
    run_dir = shutil.copytree(tiny_run, tmp_path / "run")      # rank.py writes into it
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(run_dir)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "under way"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert err.strip().splitlines() == ["interrupted (Ctrl-C): stopped before the end; run the "
                                        "same command again"]
    done = subprocess.run([sys.executable, "rank.py", str(run_dir), "--device", "cpu", "--contexts", "50"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
