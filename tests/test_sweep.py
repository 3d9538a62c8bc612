"""sweep.py: planning, local and GPU sweeps, resuming after an interruption, slurm scripts.

Runs train and evaluate tiny models in this process (`run_command` is replaced by a dispatcher
to train.main / evaluate.main, which parse exactly the argv the sweep would give the scripts);
a subprocess test checks the real entry point and `run_command` itself.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
import torch

import evaluate
import sweep
import train
from experiment.run_directory import run_name
from launch import LaunchError
from launch import modes as launch_modes
from launch import runs as launch_runs
from experiment.loading import processor_from_cpuinfo
from launch.runs import parse_grid, run_command
from tests.conftest import TINY

REPO = Path(__file__).resolve().parent.parent
CONFIG = "configs/ptb/softmax.yaml"




@pytest.fixture
def overrides(small_data) -> list[str]:
    return [f"data.data_dir={small_data}", *TINY, "train.epochs=1"]


def in_process(commands: list):
    """A stand-in for run_command that records each command and runs the script's main() here."""
    def run(command, env=None, log=None, account=None) -> int:
        commands.append(command)
        script = {"train.py": train, "evaluate.py": evaluate}[Path(command[1]).name]
        return script.main(command[2:])
    return run


@pytest.fixture(scope="module")
def swept(small_data, tmp_path_factory):
    """A local sweep of two seeds, finished and evaluated."""
    out = tmp_path_factory.mktemp("sweep")
    commands: list = []
    patch = pytest.MonkeyPatch()
    patch.setattr(launch_runs, "run_command", in_process(commands))
    try:
        code = sweep.main([CONFIG, f"data.data_dir={small_data}", *TINY, "train.epochs=1",
                           "--seeds", "1", "2", "--out", str(out)])
    finally:
        patch.undo()
    assert code == 0
    return out, commands


def mtimes(folder: Path) -> dict:
    return {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}


# ---------------------------------------------------------------------- local sweeps

def test_local_sweep_over_two_seeds(swept):
    out, commands = swept
    assert sorted(p.name for p in out.iterdir()) == ["ptb-softmax-seed1", "ptb-softmax-seed2"]
    scripts = [(Path(c[1]).name, c[2] if Path(c[1]).name == "evaluate.py" else c[-1]) for c in commands]
    assert scripts == [("train.py", f"run.dir={out / 'ptb-softmax-seed1'}"),
                       ("evaluate.py", str(out / "ptb-softmax-seed1")),
                       ("train.py", f"run.dir={out / 'ptb-softmax-seed2'}"),
                       ("evaluate.py", str(out / "ptb-softmax-seed2"))]
    for seed in (1, 2):
        run_dir = out / f"ptb-softmax-seed{seed}"
        assert json.loads((run_dir / "run.json").read_text())["seed"] == seed
        assert "test_ppl" in json.loads((run_dir / "eval_best.json").read_text())
        assert torch.load(run_dir / "last.pt", weights_only=True)["progress"]["epoch"] == 2


def test_an_interrupted_run_is_resumed_and_finished_ones_are_skipped(
        swept, overrides, tmp_path, monkeypatch, capsys):
    out = tmp_path / "sweep"
    shutil.copytree(swept[0], out)
    finished = {seed: mtimes(out / f"ptb-softmax-seed{seed}") for seed in (1, 2)}
    commands: list = []
    monkeypatch.setattr(launch_runs, "run_command", in_process(commands))
    args = [CONFIG, *overrides, "--seeds", "1", "2", "3", "--out", str(out)]

    # Seed 3 stops after 3 steps (as a crash would), before its first epoch ends.
    assert sweep.main(args + ["run.max_steps=3"]) == 0
    printed = capsys.readouterr().out
    assert "1 incomplete" in printed and printed.count("finished and evaluated: skip") == 2
    third = out / "ptb-softmax-seed3"
    assert torch.load(third / "last.pt", weights_only=True)["progress"]["step"] == 3
    assert not (third / "eval_best.json").exists()

    # Re-issuing the sweep resumes seed 3 (with the sweep's own run.* settings) and skips 1 and 2.
    commands.clear()
    assert sweep.main(args) == 0
    printed = capsys.readouterr().out
    assert [c[2:] for c in commands] == [["--resume", str(third), "run.max_steps=null"],
                                         [str(third), "--device", "cpu"]]
    assert "resumed at epoch 1, step 3" in printed and printed.count("finished and evaluated: skip") == 2
    assert "sweep: 1 done, 2 skipped" in printed
    assert {seed: mtimes(out / f"ptb-softmax-seed{seed}") for seed in (1, 2)} == finished
    assert json.loads((third / "metrics.jsonl").read_text().splitlines()[-1])["epoch"] == 1
    assert (third / "eval_best.json").is_file()

    # A finished run without its evaluation gets only the evaluation.
    commands.clear()
    (out / "ptb-softmax-seed1" / "eval_best.json").unlink()
    assert sweep.main(args) == 0
    assert [Path(c[1]).name for c in commands] == ["evaluate.py"]


def test_result_files_without_checkpoints_are_a_finished_run_not_a_new_one(
        swept, overrides, tmp_path, monkeypatch, capsys):
    """A fresh clone holds the committed runs' result files but not their checkpoints: the sweep
    skips them, and neither trains them again (which would append to their metrics.jsonl) nor
    evaluates them; what it cannot do without the checkpoint it names, and trains nothing there."""
    out = tmp_path / "sweep"
    shutil.copytree(swept[0], out)
    for checkpoint in out.glob("*/*.pt"):
        checkpoint.unlink()
    before = {seed: mtimes(out / f"ptb-softmax-seed{seed}") for seed in (1, 2)}
    commands: list = []
    monkeypatch.setattr(launch_runs, "run_command", in_process(commands))
    args = [CONFIG, *overrides, "--seeds", "1", "2", "--out", str(out)]
    assert sweep.main(args) == 0
    assert commands == [] and {seed: mtimes(out / f"ptb-softmax-seed{seed}") for seed in (1, 2)} == before
    assert capsys.readouterr().out.count("finished and evaluated (its result files; no checkpoint): skip") == 2

    metrics = out / "ptb-softmax-seed2" / "metrics.jsonl"               # its evaluation of an unfinished run
    metrics.write_text(metrics.read_text()[:20])
    assert sweep.main([*args, "--rank"]) == 1
    printed = capsys.readouterr().out
    assert commands == []
    assert (f"{out / 'ptb-softmax-seed1'} holds a run's result files but not its checkpoint (last.pt), "
            f"so rank_test.json cannot be done here; copy its last.pt and best.pt back in, or move the "
            f"directory away to train it again") in printed
    assert "so the rest of its training, rank_test.json cannot be done here" in printed


def test_train_refuses_a_new_run_over_an_evaluated_runs_results(small_data, tmp_path, capsys):
    """(A run killed before its first last.pt has no evaluation, and the same command starts it
    again: test_train_guard_rails.py.)"""
    run_dir = tmp_path / "kept"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"epoch": 1}\n')
    (run_dir / "eval_best.json").write_text('{"val_ppl": 100.0}\n')
    assert train.main([CONFIG, f"data.data_dir={small_data}", *TINY, f"run.dir={run_dir}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"{run_dir} holds an evaluated run (eval_best.json) and no last.pt to resume it; "
                        f"choose another run.dir or move it away") and "\n" not in err
    assert (run_dir / "metrics.jsonl").read_text() == '{"epoch": 1}\n' and not (run_dir / "last.pt").exists()


def test_a_run_directory_of_another_experiment_is_refused(swept, overrides, tmp_path, monkeypatch, capsys):
    out = tmp_path / "sweep"
    shutil.copytree(swept[0], out)
    monkeypatch.setattr(launch_runs, "run_command", in_process([]))
    # bad input, refused before anything runs, as --dry-run refuses it: exit 2 (it was a failed run, 1)
    for dry_run in ([], ["--dry-run"]):
        assert sweep.main([CONFIG, *overrides, "train.lr=5", "--seeds", "1", "--out", str(out), *dry_run]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1
        assert "holds a different run (train.lr is 20.0 there, 5.0 in this sweep)" in err


def test_a_run_made_before_a_config_key_existed_is_the_same_experiment(swept, overrides, tmp_path,
                                                                       monkeypatch, capsys):
    """A key added to the configs since (its default saved nowhere in the old config.yaml) does
    not make an old run directory another experiment."""
    out = tmp_path / "sweep"
    shutil.copytree(swept[0], out)
    run_dir = out / "ptb-softmax-seed1"
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    del saved["train"]["plateau_window"], saved["train"]["plateau_gain"]     # as before they existed
    (run_dir / "config.yaml").write_text(yaml.safe_dump(saved))
    commands = []
    monkeypatch.setattr(launch_runs, "run_command", in_process(commands))
    assert sweep.main([CONFIG, *overrides, "--seeds", "1", "--out", str(out)]) == 0
    assert "different run" not in capsys.readouterr().out


# ---------------------------------------------------------------------- planning and dry runs

def test_grid_and_run_names():
    assert parse_grid(["head.c=-1.5,-1,0", "head.k=2"]) == [("head.c", ["-1.5", "-1", "0"]),
                                                            ("head.k", ["2"])]
    for bad in ("head.c", "head.c=", "=1,2", "head.c=1,,2"):
        with pytest.raises(LaunchError, match="expected key=value1,value2"):
            parse_grid([bad])
    with pytest.raises(LaunchError, match="given twice"):
        parse_grid(["head.k=1", "head.k=2"])
    assert run_name("ptb", Path("configs/ptb/gss.yaml"), ["head.c=-1.5", "head.k=2"], 7) == \
        "ptb-gss-head.c=-1.5-head.k=2-seed7"
    assert run_name("ptb", Path("x.yaml"), ["data.data_dir=/a/b"], 1) == "ptb-x-data.data_dir=_a_b-seed1"


def test_dry_run_prints_every_command_and_runs_nothing(overrides, tmp_path, capsys):
    out = tmp_path / "grid"
    assert sweep.main([CONFIG, *overrides[:-1], "--grid", "train.lr=10,20", "--grid", "train.clip=0.1,0.2",
                       "--seeds", "1", "2", overrides[-1], "--rank", "--rank-args=--contexts 33320",
                       "--out", str(out), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert not out.exists()
    titles = [line for line in lines if line.startswith("# [")]
    commands = [shlex.split(line) for line in lines if not line.startswith("#")]
    assert lines[-1] == "# 8 runs planned"
    assert len(titles) == 8 and all(t.endswith(": new") for t in titles)
    assert [Path(c[1]).name for c in commands] == ["train.py", "evaluate.py", "rank.py"] * 8
    first = commands[0]
    assert first[0] == sys.executable and first[2] == CONFIG
    assert first[3:] == [*overrides, "train.lr=10", "train.clip=0.1", "train.seed=1",
                         f"run.dir={out / 'ptb-softmax-train.lr=10-train.clip=0.1-seed1'}"]
    assert commands[-3][-1] == f"run.dir={out / 'ptb-softmax-train.lr=20-train.clip=0.2-seed2'}"
    assert commands[2][-2:] == ["--contexts", "33320"]


def test_dry_run_through_the_entry_point(swept, overrides):
    """The real command line, in a subprocess, over the finished sweep."""
    proc = subprocess.run([sys.executable, "sweep.py", CONFIG, *overrides, "--seeds", "1", "2",
                           "--out", str(swept[0]), "--dry-run"], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("finished and evaluated: skip") == 2


def test_bad_input_is_one_line(overrides, tmp_path, capsys):
    out = ["--out", str(tmp_path / "x")]
    for args, message in (
            ([CONFIG, *overrides, "--grid", "train.nope=1,2", *out], "unknown key train.nope"),
            ([CONFIG, *overrides, "run.dir=elsewhere", *out], "override run.dir: the sweep sets it"),
            ([CONFIG, *overrides, "train.seed=3", "--seeds", "1", *out],
             "override train.seed: the sweep sets it"),
            ([CONFIG, *overrides, "train.lr=1", "--grid", "train.lr=1,2", *out], "also given as an override"),
            ([CONFIG, *overrides, "--seeds", "1", "1", *out], "repeated seed"),
            (["missing.yaml", *out], "missing.yaml: config file not found"),
            ([CONFIG, *overrides, "--task", "2", *out], "--task 2: the sweep has 1 runs")):
        assert sweep.main(args) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err


@pytest.mark.parametrize("mode", [[], ["--dry-run"], ["--group", "2"], ["--mode", "slurm"]])
def test_an_out_that_cannot_be_a_folder_is_one_line_not_in_progress_elsewhere(mode, overrides, tmp_path, capsys):
    """--out naming a file (or a path under one) trained nothing, said the runs were "in progress
    elsewhere" and exited 0."""
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for out, reason in ((a_file, "a file, not a folder"), (a_file / "sub", f"{a_file} is a file, not a folder")):
        assert sweep.main([CONFIG, *overrides, "--seeds", "1", "2", "--out", str(out), *mode]) == 2
        assert capsys.readouterr().err == f"error: --out {out}: {reason}; choose another --out\n"
    from launch.runs import locked_by_another_process
    assert not locked_by_another_process(a_file / "sub")      # no lock could be held there


def test_a_run_that_fails_before_training_leaves_no_folder_the_sweep_made(overrides, tmp_path, monkeypatch,
                                                                          capsys):
    """train.py refuses the corpus (a slice of PTB, not allowed here): the sweep fails the run and
    takes back the folders it made for it; those it did not make stay."""
    commands: list = []
    monkeypatch.setattr(launch_runs, "run_command", in_process(commands))
    out = tmp_path / "new" / "sweep"
    refused = [*overrides, "data.allow_modified_corpus=false"]
    assert sweep.main([CONFIG, *refused, "--seeds", "1", "2", "--out", str(out)]) == 1
    assert "not the published ptb train split" in capsys.readouterr().err
    assert [Path(c[1]).name for c in commands] == ["train.py", "train.py"]
    assert list(tmp_path.iterdir()) == []
    kept = tmp_path / "kept"
    (kept / "ptb-softmax-seed1").mkdir(parents=True)
    assert sweep.main([CONFIG, *refused, "--seeds", "1", "--out", str(kept)]) == 1
    assert (kept / "ptb-softmax-seed1").is_dir()


def test_with_jobs_a_failed_runs_reason_is_in_its_outcome(overrides, tmp_path, monkeypatch, capsys):
    """Its log is in RUN/sweep.log, which goes with the folder the sweep made: the outcome line
    quotes the log's last line."""
    def refused(command, env=None, log=None, account=None) -> int:
        log.write("error: data.nope: the reason\n")
        return 2

    monkeypatch.setattr(launch_runs, "run_command", refused)
    out = tmp_path / "jobs"
    assert sweep.main([CONFIG, *overrides, "--seeds", "1", "--out", str(out), "--jobs", "2"]) == 1
    assert (f"{out / 'ptb-softmax-seed1'}: failed: train.py exited with 2 (error: data.nope: the reason)"
            in capsys.readouterr().out)
    assert not out.exists()


def test_run_command_returns_the_exit_code():
    assert run_command([sys.executable, "-c", "raise SystemExit(3)"]) == 3


def test_run_command_accounts_for_the_cpu_time_of_the_command(tmp_path):
    """One JSON line per command: its script, CPU seconds (the busy loop's, not the sleep's) and
    wall seconds; appended, so a run trained in several sittings has one line per sitting."""
    account = tmp_path / "cpu_times.jsonl"
    busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\ntime.sleep(0.3)"
    script = tmp_path / "busy.py"
    script.write_text(busy)
    assert run_command([sys.executable, str(script)], account=account) == 0
    assert run_command([sys.executable, "-c", "raise SystemExit(3)"], account=account) == 3
    first, second = [json.loads(line) for line in account.read_text().splitlines()]
    assert first["script"] == "busy.py" and second["script"] == "-c"
    assert first["processor"] and first["processor"] == second["processor"] != "unknown"
    assert 0.3 <= first["cpu_s"] < 0.55 <= first["wall_s"]
    assert first["cpu_s"] == pytest.approx(first["user_s"] + first["sys_s"], abs=0.011)


# ---------------------------------------------------------------------- GPUs and slurm

def test_gpus_mode_runs_one_run_per_gpu_at_a_time(overrides, tmp_path, monkeypatch, capsys):
    busy: dict[str, int] = {}
    seen: list[tuple[str, str]] = []
    lock = threading.Lock()

    def fake(command, env=None, log=None, account=None) -> int:
        gpu = env["CUDA_VISIBLE_DEVICES"]
        with lock:
            busy[gpu] = busy.get(gpu, 0) + 1
            assert busy[gpu] == 1, f"GPU {gpu} runs two commands at once"
            seen.append((gpu, command[-1]))
        log.write("output\n")
        time.sleep(0.05)
        with lock:
            busy[gpu] -= 1
        return 0

    monkeypatch.setattr(launch_runs, "run_command", fake)
    out = tmp_path / "gpus"
    assert sweep.main([CONFIG, *overrides, "--seeds", "1", "2", "3", "4", "--out", str(out),
                       "--mode", "gpus", "--gpus", "0,1"]) == 0
    assert {gpu for gpu, _ in seen} == {"0", "1"}
    assert sorted(c for _, c in seen) == [f"run.dir={out / f'ptb-softmax-seed{s}'}" for s in (1, 2, 3, 4)]
    # The fake training leaves no checkpoint, so each run stops as unfinished, its log in its folder.
    assert "4 incomplete" in capsys.readouterr().out
    assert all((out / f"ptb-softmax-seed{s}" / "sweep.log").read_text() == "output\n" for s in (1, 2, 3, 4))


def test_gpus_mode_where_torch_sees_no_gpu_refuses_unless_told_to_use_the_cpu(overrides, tmp_path,
                                                                             monkeypatch, capsys):
    """Not the 24M-parameter model trained on the CPU with a warning in RUN/sweep.log: one line,
    exit 2, nothing started or created; run.device=cpu says to use the CPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    commands: list = []
    monkeypatch.setattr(launch_runs, "run_command", lambda command, *rest, **options: commands.append(command) or 0)
    out = tmp_path / "gpus"
    on_any_device = [o for o in overrides if not o.startswith("run.device=")]
    for device in ([], ["run.device=auto"], ["run.device=cuda"]):
        assert sweep.main([CONFIG, *on_any_device, *device, "--seeds", "1", "--out", str(out),
                           "--mode", "gpus", "--gpus", "0"]) == 2
        assert capsys.readouterr().err == (
            "error: --mode gpus: torch sees no GPU on this machine; give run.device=cpu to train on its "
            "CPU anyway, or use --mode local (--jobs N: N runs at a time)\n")
    assert commands == [] and not out.exists()
    assert sweep.main([CONFIG, *on_any_device, "run.device=cpu", "--seeds", "1", "--out", str(out),
                       "--mode", "gpus", "--gpus", "0"]) == 0
    assert [Path(c[1]).name for c in commands] == ["train.py"]   # no checkpoint: not evaluated


def test_gpus_mode_keeps_runs_per_gpu_runs_on_each_gpu(overrides, tmp_path, monkeypatch, capsys):
    busy: dict[str, int] = {}
    peak: dict[str, int] = {}
    lock = threading.Lock()

    def fake(command, env=None, log=None, account=None) -> int:
        gpu = env["CUDA_VISIBLE_DEVICES"]
        with lock:
            busy[gpu] = busy.get(gpu, 0) + 1
            peak[gpu] = max(peak.get(gpu, 0), busy[gpu])
        time.sleep(0.3)                 # long enough for the workers of a GPU to overlap
        with lock:
            busy[gpu] -= 1
        return 0

    monkeypatch.setattr(launch_runs, "run_command", fake)
    seeds = [str(s) for s in range(1, 8)]
    assert sweep.main([CONFIG, *overrides, "--seeds", *seeds, "--out", str(tmp_path / "k"),
                       "--mode", "gpus", "--gpus", "0,1", "--runs-per-gpu", "2"]) == 0
    assert peak == {"0": 2, "1": 2}          # two at a time on each GPU, never three
    assert "7 incomplete" in capsys.readouterr().out
    # --runs-per-gpu belongs to the gpus mode and needs at least one run a GPU
    with pytest.raises(SystemExit):
        sweep.parse_args([CONFIG, "--out", "x", "--runs-per-gpu", "2"])
    assert "belong to --mode gpus" in capsys.readouterr().err
    with pytest.raises(SystemExit):            # refused before anything runs, a dry run too
        sweep.main([CONFIG, *overrides, "--out", str(tmp_path / "z"), "--mode", "gpus",
                    "--gpus", "0", "--runs-per-gpu", "0", "--dry-run"])
    assert "--runs-per-gpu: expected an integer >= 1, got 0" in capsys.readouterr().err


def test_slurm_script_has_one_array_task_per_run(overrides, tmp_path, capsys, monkeypatch):
    out = tmp_path / "slurm"
    args = [CONFIG, *overrides, "--grid", "train.lr=10,20", "--seeds", "1", "2", "3", "--out", str(out),
            "--mode", "slurm", "--sbatch=--gres=gpu:1", "--sbatch=--time=48:00:00", "--array-limit", "2"]
    assert sweep.main(args) == 0
    script = (out / "sweep-softmax.sbatch").read_text()
    assert "#SBATCH --array=0-5%2\n" in script
    assert "#SBATCH --gres=gpu:1\n#SBATCH --time=48:00:00\n" in script
    assert f"#SBATCH --output={out.resolve()}/slurm-%A_%a.out" in script
    exec_line = script.strip().splitlines()[-1]
    assert exec_line.endswith('--task "$SLURM_ARRAY_TASK_ID" --task-run "${runs[$SLURM_ARRAY_TASK_ID]}"')

    def task_command(index: int) -> list[str]:
        """The exec line as bash expands it in array task `index` (echo in place of exec)."""
        body = script.split("set -euo pipefail\n", 1)[1].replace("exec ", "printf '%s\\n' ", 1)
        done = subprocess.run(["bash", "-c", body], env={**os.environ, "SLURM_ARRAY_TASK_ID": str(index)},
                              capture_output=True, text=True, check=True)
        return done.stdout.splitlines()

    # What array task 4 runs: exactly the fifth planned run (lr 20, seed 2).
    task = task_command(4)
    assert task[:2] == [sys.executable, str(REPO / "sweep.py")]
    assert task[-4:] == ["--task", "4", "--task-run", "ptb-softmax-train.lr=20-seed2"]
    capsys.readouterr()
    monkeypatch.chdir(script.split("\ncd ")[1].split("\n")[0])
    assert sweep.main(task[2:] + ["--dry-run"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"# [5/6, --task 4] {out / 'ptb-softmax-train.lr=20-seed2'}: new"
    assert len(printed) == 4      # its title, train.py, evaluate.py, the count
    assert printed[-1] == "# 1 of 6 planned runs"
    # The sweep changed since the script was written (a newcomer added a seed in front): task 4
    # is another run now, and it refuses instead of training that one.
    changed = [*task[2:task.index("--seeds")], "--seeds", "0", "1", "2", "3", *task[task.index("--task"):]]
    assert sweep.main(changed + ["--dry-run"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --task 4: the sweep's run 4 is ptb-softmax-train.lr=20-seed0, not ptb-softmax-train.lr=20-seed2 "
        "as when the slurm script was written: its plan or flags changed since; write the script again "
        "(--mode slurm)")


def test_train_names_a_miniature_configs_default_run_directory_apart_and_the_sweep_does_not(
        small_data, tmp_path, capsys):
    """train.py without run.dir: configs/ptb_mini/softmax.yaml's run is not runs/ptb-softmax-seed<N>,
    the full-size row's. sweep.py's names are unchanged: the committed results, and the runs in
    flight, are in folders named by them."""
    mini = "configs/ptb_mini/softmax.yaml"
    assert train.main([mini, f"data.data_dir={small_data}", *TINY, "train.seed=9", "--dry-run"]) == 0
    resolved = yaml.safe_load(capsys.readouterr().out.rsplit("\n", 2)[0])
    assert resolved["run"]["dir"] == "runs/ptb_mini-softmax-seed9"
    runs = launch_runs.plan_runs([launch_runs.Experiment(Path(mini), grid=(("model.emsize", ("32",)),))],
                                 tmp_path, seeds=[1])
    assert [run.name for run in runs] == ["ptb-softmax-model.emsize=32-seed1"]
    assert (REPO / "results" / "cpu_ptb_converged" / runs[0].name / "eval_best.json").is_file()


@pytest.mark.parametrize("folders, expected", [
    (("my_configs",), "runs/ptb-softmax-seed9"),                 # not a variant of a "my" folder
    (("ptb", "ptb_small"), "runs/ptb_small-softmax-seed9"),     # a variant beside what it varies
])
def test_a_config_folder_names_a_variant_only_beside_the_folder_it_varies(
        folders, expected, small_data, tmp_path, monkeypatch, capsys):
    """A copy of the miniature's config in a folder of the user's own: its default run directory
    has the variant of its folder only where the folder varies one beside it (ptb_small beside
    ptb, as configs/ptb_mini beside configs/ptb); my_configs/ was named runs/ptb_configs-..."""
    for folder in folders:
        (tmp_path / folder).mkdir()
    for name in ("base.yaml", "softmax.yaml"):
        shutil.copy(REPO / "configs" / "ptb_mini" / name, tmp_path / folders[-1] / name)
    monkeypatch.chdir(tmp_path)
    assert train.main([f"{folders[-1]}/softmax.yaml", f"data.data_dir={small_data}", *TINY,
                       "train.seed=9", "--dry-run"]) == 0
    assert yaml.safe_load(capsys.readouterr().out.rsplit("\n", 2)[0])["run"]["dir"] == expected


@pytest.mark.parametrize("config", ["configs/ptb/softmax.yaml", "configs/ptb/fair_mos_d280.yaml"])
def test_train_names_its_default_run_directory_by_the_sweeps_rule(config, small_data, capsys):
    """One naming rule: train.py without run.dir uses runs/<run_name> of the config and seed,
    which is what sweep.py and the row scripts name the same run (configs sharing a head, like
    the Table 5 rows, no longer share a directory)."""
    import yaml
    assert train.main([config, f"data.data_dir={small_data}", *TINY, "train.seed=9", "--dry-run"]) == 0
    resolved = yaml.safe_load(capsys.readouterr().out.rsplit("\n", 2)[0])
    assert resolved["run"]["dir"] == str(Path("runs") / run_name("ptb", Path(config), (), 9))
    assert resolved["run"]["dir"] == f"runs/ptb-{Path(config).stem}-seed9"


# ---------------------------------------------------------------------- several runs on the CPU

def test_jobs_runs_n_at_a_time_each_with_its_share_of_the_cores(overrides, tmp_path, monkeypatch, capsys):
    busy = {"now": 0, "peak": 0}
    threads: list[str] = []
    lock = threading.Lock()

    def fake(command, env=None, log=None, account=None) -> int:
        with lock:
            busy["now"] += 1
            busy["peak"] = max(busy["peak"], busy["now"])
            threads.append((env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"]))
        log.write("output\n")
        time.sleep(0.3)                 # long enough for the jobs to overlap
        with lock:
            busy["now"] -= 1
        return 0

    monkeypatch.setattr(launch_runs, "run_command", fake)
    monkeypatch.setattr(launch_modes, "cpu_count", lambda: 4)
    out = tmp_path / "jobs"
    assert sweep.main([CONFIG, *overrides, "--seeds", "1", "2", "3", "4", "5", "--out", str(out),
                       "--jobs", "2"]) == 0
    assert busy["peak"] == 2                          # two at a time, never three
    assert set(threads) == {("2", "2")} and len(threads) == 5   # 4 cores / 2 jobs
    assert "5 incomplete" in capsys.readouterr().out
    assert all((out / f"ptb-softmax-seed{s}" / "sweep.log").read_text() == "output\n" for s in range(1, 6))
    # more jobs than cores: one thread each
    threads.clear()
    assert sweep.main([CONFIG, *overrides, "--seeds", "1", "--out", str(tmp_path / "j5"), "--jobs", "5"]) == 0
    assert threads == [("1", "1")]


@pytest.mark.parametrize("argv, message", [
    (["--jobs", "0"], "--jobs: expected an integer >= 1, got 0"),
    (["--jobs", "two"], "--jobs: invalid int value: 'two'"),
    (["--jobs", "2", "--mode", "gpus"], "--jobs belongs to --mode local (on GPUs: --runs-per-gpu)"),
    (["--nproc", "0"], "--nproc: expected an integer >= 1, got 0"),
    (["--nproc", "2", "--jobs", "2"], "--nproc belongs to --mode local with one run at a time (--jobs 1)"),
    (["--nproc", "2", "--mode", "slurm"], "--nproc belongs to --mode local with one run at a time (--jobs 1)"),
    (["--group", "0"], "--group: expected an integer >= 1, got 0"),
    *[(["--group", "2", *other], f"--group trains several runs in one process: not with {named}")
      for other, named in ((["--nproc", "2"], "--nproc"), (["--task", "0"], "--task"),
                           (["--mode", "slurm"], "--mode slurm"))],
    # a newcomer's --array-limit 0 vanished from the script, and -2 wrote --array=0-66%-2
    *[(["--mode", "slurm", "--array-limit", limit], f"--array-limit: expected an integer >= 1, got {limit}")
      for limit in ("0", "-2")],
    (["--array-limit", "0"], "--array-limit: expected an integer >= 1, got 0"),
    (["--task-run", "ptb-softmax-seed1"], "--task-run belongs to --task"),
    # an #SBATCH line without its dashes was written as it came; the script's own lines overridden
    (["--mode", "slurm", "--sbatch=gres=gpu:1"], "--sbatch=gres=gpu:1: expected an sbatch option, e.g. --sbatch=--gres=gpu:1"),
    (["--mode", "slurm", "--sbatch=--array=0-3"], "--sbatch=--array=0-3: the script sets --array itself (the array "
                                                  "from the runs, with --array-limit; the output beside the runs)"),
    # --rank-args without --rank ran no rank.py, silently
    (["--rank-args=--contexts 5"], "--rank-args belongs to --rank (rank.py runs only with --rank)"),
    # rank.py's options are checked before the runs train, not after
    (["--rank", "--rank-args=--contxts 5"], "--rank-args: rank.py would refuse them: unrecognized arguments: --contxts 5"),
    # GPU ids as CUDA_VISIBLE_DEVICES takes them, each once (a typo would give a worker no GPU)
    *[(["--mode", "gpus", "--gpus", gpus, "--dry-run"], "--gpus: expected GPU indices or GPU-/MIG- UUIDs, "
       f"comma-separated, each once (e.g. 0,1,2,3), got {gpus!r}") for gpus in ("a,b", "0,,1", "0,0", "-1", "")],
])
def test_bad_jobs_is_one_line_and_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        sweep.main([CONFIG, "--out", "x", *argv])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(message)


@pytest.mark.parametrize("argv, named", [
    (["--seeds", "1"], "--seeds"), (["--limit", "1"], "--limit"), (["--group", "2"], "--group"),
    (["--jobs", "2"], "--jobs"), (["train.epochs=5"], "override train.epochs=5"), (["--task", "0"], "--task"),
])
def test_report_refuses_what_would_choose_runs_to_train(argv, named, capsys):
    """--report trains nothing: --seeds 1 still pooled every seed, silently."""
    with pytest.raises(SystemExit) as exit_info:
        sweep.main(["sweeps/cpu_converged_heads.yaml", "--report", *argv])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (f"sweep.py: error: {named}: --report runs the plan's report commands over "
                                       f"the runs in its folder and trains nothing (report.py's --only chooses runs)\n")




@pytest.mark.parametrize("extra", [["--dry-run"], ["--report"], ["--out", "x"]])
def test_a_plan_or_config_that_does_not_exist_is_named(extra, capsys):
    """Not "--out: give the folder" for a mistyped plan name, whatever the other flags: one line."""
    assert sweep.main(["sweeps/no_such_plan.yaml", *extra]) == 2
    assert capsys.readouterr().err == (
        "error: sweeps/no_such_plan.yaml: config file not found (expected a plan, e.g. "
        "sweeps/cpu_seven_heads.yaml, or a config with --out)\n")
    assert sweep.main(["sweeps", *extra]) == 2                 # the plans' folder
    assert capsys.readouterr().err == (
        "error: sweeps: a folder, not a file (expected a plan, e.g. sweeps/cpu_seven_heads.yaml, or a "
        "config with --out)\n")


def test_jobs_trains_and_evaluates_for_real(overrides, tmp_path):
    """sweep.py --jobs 2 in a subprocess: two real runs at once, each logged in its own folder."""
    out = tmp_path / "real"
    proc = subprocess.run([sys.executable, "sweep.py", CONFIG, *overrides, "--seeds", "1", "2",
                           "--out", str(out), "--jobs", "2"], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "sweep: 2 done" in proc.stdout
    for seed in (1, 2):
        run = out / f"ptb-softmax-seed{seed}"
        assert json.loads((run / "eval_best.json").read_text())["test_ppl"] > 1
        assert f"run {run}" in (run / "sweep.log").read_text()
        # and what each command cost, which report.py cost adds up
        times = [json.loads(line) for line in (run / "cpu_times.jsonl").read_text().splitlines()]
        assert [t["script"] for t in times] == ["train.py", "evaluate.py"]
        assert all(0 < t["cpu_s"] and 0 < t["wall_s"] for t in times)
        # the training's CPU time is counted from its epochs, which ran inside the train.py line
        assert times[0]["cpu_in_metrics"] and "cpu_in_metrics" not in times[1]
        epochs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert 0 < sum(e["cpu_seconds"] for e in epochs) <= times[0]["cpu_s"]


def test_nproc_trains_under_torchrun_and_counts_every_process(overrides, tmp_path, capsys):
    """--nproc 2: the dry run shows train.py under torchrun (evaluate.py as ever); for real, the
    run trains in two processes and its train.py line's CPU time covers both ranks' epochs."""
    out = tmp_path / "ddp"
    assert sweep.main([CONFIG, *overrides, "--seeds", "1", "--out", str(out), "--nproc", "2", "--dry-run"]) == 0
    commands = [shlex.split(line) for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]
    assert commands[0][:6] == [sys.executable, "-m", "torch.distributed.run", "--standalone",
                               "--nproc_per_node=2", str(REPO / "train.py")]
    assert commands[1][:2] == [sys.executable, str(REPO / "evaluate.py")]
    proc = subprocess.run([sys.executable, "sweep.py", CONFIG, *overrides, "--seeds", "1", "--out", str(out),
                           "--nproc", "2"], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = out / "ptb-softmax-seed1"
    assert json.loads((run / "eval_best.json").read_text())["test_ppl"] > 1
    assert json.loads((run / "run.json").read_text())["world_size"] == 2
    times = [json.loads(line) for line in (run / "cpu_times.jsonl").read_text().splitlines()]
    assert [t["script"] for t in times] == ["train.py", "evaluate.py"] and times[0]["cpu_in_metrics"]
    epochs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert 0 < sum(e["cpu_seconds"] for e in epochs) <= times[0]["cpu_s"]


def test_a_process_count_train_py_would_refuse_is_refused_before_any_run(overrides, tmp_path, monkeypatch,
                                                                         capsys):
    """--nproc N that the batch size does not divide, or that differs from the processes an
    unfinished run started with: one line, exit 2, before anything starts (each run's torchrun
    would otherwise fail in turn, with torchrun's traceback)."""
    commands: list = []
    monkeypatch.setattr(launch_runs, "run_command", in_process(commands))
    out = tmp_path / "sweep"
    assert sweep.main([CONFIG, *overrides, "--seeds", "1", "--out", str(out), "--nproc", "3"]) == 2
    run = out / "ptb-softmax-seed1"
    assert capsys.readouterr().err == (f"error: --nproc 3: {run}: train.batch_size: 4 is not divisible by the "
                                       f"3 processes of this run (each trains an equal block of the batch's "
                                       f"columns); choose a batch size or a number of processes that divides it\n")
    assert not out.exists() and commands == []

    assert sweep.main([CONFIG, *overrides, "--seeds", "1", "--out", str(out), "run.max_steps=3"]) == 0
    before, commands[:] = (run / "last.pt").read_bytes(), []
    capsys.readouterr()
    # (3, which does not divide the batch either, is told the count saved, not to change the batch)
    for extra in (["--nproc", "2"], ["--nproc", "2", "--dry-run"], ["--nproc", "3"]):
        assert sweep.main([CONFIG, *overrides, "--seeds", "1", "--out", str(out), *extra]) == 2
        assert capsys.readouterr().err == (f"error: --nproc {extra[1]}: {run / 'last.pt'} was saved by 1 process(es), "
                                           f"and a run resumes only with as many as it started with; give "
                                           f"--nproc 1\n")
    assert commands == [] and (run / "last.pt").read_bytes() == before
    # a finished run is only evaluated: any --nproc will do
    assert sweep.main([CONFIG, *overrides, "--seeds", "1", "--out", str(out)]) == 0
    assert sweep.main([CONFIG, *overrides, "--seeds", "1", "--out", str(out), "--nproc", "3", "--dry-run"]) == 0


# ---------------------------------------------------------------------- sweeps sharing a folder

def test_a_run_another_sweep_holds_is_in_progress_elsewhere_not_failed(overrides, tmp_path, monkeypatch,
                                                                       capsys):
    commands: list = []
    monkeypatch.setattr(launch_runs, "run_command", in_process(commands))
    held_dir = tmp_path / "ptb-softmax-seed1"
    with launch_runs.claimed(held_dir) as ours:          # what another live sweep holds
        assert ours
        code = sweep.main([CONFIG, *overrides, "--seeds", "1", "2", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    assert f"{held_dir}: in progress elsewhere" in out and "failed" not in out
    assert [c[-1] for c in commands if Path(c[1]).name == "train.py"] == [f"run.dir={tmp_path / 'ptb-softmax-seed2'}"]
    assert "1 done, 1 in progress elsewhere" in out
    assert not (held_dir / "last.pt").exists()


@pytest.mark.parametrize("group", [[], ["--group", "2"]])
def test_a_run_a_hand_started_training_holds_is_in_progress_elsewhere(overrides, tmp_path, monkeypatch,
                                                                      capsys, group):
    """Alone or in a group: with --group the held run was put in the group, whose train.py
    --group refused the lock and so failed seed 2 as well (exit 1, seed 2 never trained)."""
    commands: list = []
    monkeypatch.setattr(launch_runs, "run_command", in_process(commands))
    held_dir = tmp_path / "ptb-softmax-seed1"
    held_dir.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.path.insert(0, '.'); "
                               "from experiment.run_directory import RunLock; "
                               f"RunLock({str(held_dir)!r}).acquire(); print('held', flush=True); "
                               "time.sleep(60)"], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        code = sweep.main([CONFIG, *overrides, "--seeds", "1", "--out", str(tmp_path)])
        assert code == 0
        assert "1 in progress elsewhere" in capsys.readouterr().out
        commands.clear()
        code = sweep.main([CONFIG, *overrides, "--seeds", "1", "2", *group, "--out", str(tmp_path), "--dry-run"])
        assert code == 0 and "--group" not in capsys.readouterr().out     # the held run is not grouped
        code = sweep.main([CONFIG, *overrides, "--seeds", "1", "2", *group, "--out", str(tmp_path)])
    finally:
        holder.kill()
        holder.wait()
    assert code == 0
    assert "1 done, 1 in progress elsewhere" in capsys.readouterr().out
    assert [c[-1] for c in commands if Path(c[1]).name == "train.py"] == [f"run.dir={tmp_path / 'ptb-softmax-seed2'}"]
    assert (tmp_path / "ptb-softmax-seed2" / "eval_best.json").is_file()


def test_two_sweeps_of_one_plan_started_together_train_each_run_once(overrides, tmp_path):
    command = [sys.executable, "sweep.py", CONFIG, *overrides, "--seeds", "1", "2", "--out", str(tmp_path)]
    sweeps = [subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
              for _ in range(2)]
    outputs = [proc.communicate(timeout=300)[0] for proc in sweeps]
    assert [proc.returncode for proc in sweeps] == [0, 0], outputs
    lines = "\n".join(outputs).splitlines()
    for seed in (1, 2):
        run_dir = tmp_path / f"ptb-softmax-seed{seed}"
        assert sum(line.endswith(f"{run_dir}: new") for line in lines) == 1, outputs
        assert not any(line.endswith(f"{run_dir}: resume") for line in lines), outputs
        assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 1
        assert (run_dir / "eval_best.json").is_file()


def test_the_processor_is_named_with_its_family_and_model_where_cpuinfo_has_them():
    # Processors of different generations may both call themselves "AMD EPYC" in a virtual
    # machine, at different CPU times per epoch: the family and model numbers tell them apart.
    block = "processor\t: {n}\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: {m}\nmodel name\t: AMD EPYC\n"
    cpuinfo = block.format(n=0, m=17) + "\n" + block.format(n=1, m=1)
    assert processor_from_cpuinfo(cpuinfo) == "AMD EPYC (family 25, model 17)"
    assert processor_from_cpuinfo("processor\t: 0\nmodel name\t: ARMv8 Processor\n") == "ARMv8 Processor"
    assert processor_from_cpuinfo("processor\t: 0\nCPU implementer\t: 0x41\n") is None


# ---------------------------------------------------------------------- --group

def test_dry_run_with_group_prints_the_group_command_it_would_run(overrides, tmp_path, capsys):
    """--dry-run --group 2 over three seeds and a run of two layers: the two first seeds' trainings
    as the one train.py --group command the sweep would start, then each run's other commands;
    seed 3 and the wider run with their own train.py, as the sweep trains them. Nothing written."""
    plan = tmp_path / "plan.yaml"
    plan.write_text("title: t\nout: o\nexperiments:\n"
                    "  - config: configs/ptb/softmax.yaml\n    seeds: [1, 2, 3]\n"
                    "  - config: configs/ptb/softmax.yaml\n    grid: {model.nlayers: [2]}\n", encoding="utf-8")
    out = tmp_path / "runs"
    assert sweep.main([str(plan), *overrides, "--out", str(out), "--group", "2", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert not out.exists()
    commands = [shlex.split(line) for line in lines if not line.startswith("#")]
    assert [(Path(c[1]).name, c[2] == "--group") for c in commands] == [
        ("train.py", True), ("evaluate.py", False), ("evaluate.py", False),
        ("train.py", False), ("evaluate.py", False), ("train.py", False), ("evaluate.py", False)]
    members = commands[0][3:]
    assert len(members) == 2
    for seed, member in zip((1, 2), members):
        assert shlex.split(member) == ["configs/ptb/softmax.yaml", *overrides, f"train.seed={seed}",
                                       f"run.dir={out / f'ptb-softmax-seed{seed}'}"]
    assert lines[0] == f"# plan: t ({plan})"      # the plan's title first
    assert lines[1] == "# group [1, 2/4]: 2 runs trained as one: ptb-softmax-seed1, ptb-softmax-seed2"
    assert lines[-1] == "# 4 runs planned"


def test_group_trains_compatible_runs_together_and_resumes_what_is_left(overrides, tmp_path, monkeypatch):
    """--group 2 over three seeds and a run of two layers: seeds 1 and 2 train in one
    train.py --group, seed 3 and the wider run alone (nothing else shares their shapes); each is
    evaluated as alone. Stopped by run.max_steps and run again, the group resumes its runs."""
    commands: list = []
    monkeypatch.setattr(launch_runs, "run_command", in_process(commands))
    plan = tmp_path / "plan.yaml"
    plan.write_text("title: t\nout: o\nexperiments:\n"
                    "  - config: configs/ptb/softmax.yaml\n    seeds: [1, 2, 3]\n"
                    "  - config: configs/ptb/softmax.yaml\n    grid: {model.nlayers: [2]}\n", encoding="utf-8")
    out = tmp_path / "runs"
    argv = [str(plan), *overrides, "--out", str(out), "--group", "2"]
    assert sweep.main([*argv, "run.max_steps=5"]) == 0
    trainings = [c for c in commands if Path(c[1]).name == "train.py"]
    assert len(trainings) == 3 and trainings[0][2] == "--group" and len(trainings[0]) == 5
    assert all("--group" not in c for c in trainings[1:])
    commands.clear()
    assert sweep.main(argv) == 0
    resumed = [c for c in commands if Path(c[1]).name == "train.py"]
    assert resumed[0][2] == "--group" and resumed[0][3].startswith("--resume ")
    for seed in (1, 2, 3):
        assert (out / f"ptb-softmax-seed{seed}" / "eval_best.json").is_file()
    assert json.loads((out / "ptb-softmax-seed2" / "run.json").read_text())["groups"][1]["joined_at"]["step"] == 5
    assert not (out / "ptb-softmax-seed3" / "group_exit.json").exists()


def test_a_slurm_script_that_asks_for_no_gpu_is_warned(capsys):
    """--mode slurm without an --sbatch option naming a GPU writes a script that gets the
    partition's default: a warning on stderr; none with --gres=gpu; and GPU UUIDs pass --gpus."""
    assert sweep.main([CONFIG, "--out", "x", "--mode", "slurm", "--dry-run"]) == 0
    assert "warning: no --sbatch option asks for a GPU (e.g. --sbatch=--gres=gpu:1)" in capsys.readouterr().err
    assert sweep.main([CONFIG, "--out", "x", "--mode", "slurm", "--sbatch=--gres=gpu:1", "--dry-run"]) == 0
    assert "warning" not in capsys.readouterr().err
    assert sweep.parse_args([CONFIG, "--out", "x", "--mode", "gpus", "--gpus", "GPU-1a2b,MIG-3c4d,2"]).gpus


def test_a_dry_run_says_when_run_max_steps_may_leave_a_run_unevaluated(capsys):
    """A smoke test with run.max_steps stops before its epochs end, and execute() then skips the
    evaluation its dry run lists: the title says so; a run without the cap says nothing more."""
    assert sweep.main([CONFIG, "--out", "x", "run.max_steps=20", "--dry-run"]) == 0
    title = capsys.readouterr().out.splitlines()[0]
    assert title.endswith(": new (run.max_steps=20: if that ends it before its last epoch, the commands "
                          "after train.py do not run)"), title
    assert sweep.main([CONFIG, "--out", "x", "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith(": new")


def test_seeds_config_on_the_command_line_is_each_configs_own_seed_as_in_a_plan(capsys):
    """A newcomer's `--seeds config 1 2 3` (a plan's seeds take `config`) was refused: it means each
    experiment's config's own seed (141 for PTB's, MoS's 28), and a repeat of it is named."""
    assert sweep.main(["sweeps/sb_table2_ptb.yaml", "--seeds", "config", "1", "--dry-run"]) == 0
    titles = [line.split("] ", 1)[1] for line in capsys.readouterr().out.splitlines() if line.startswith("# [")]
    assert titles[:2] == ["runs/sb_table2_ptb/ptb-softmax-seed141: new", "runs/sb_table2_ptb/ptb-softmax-seed1: new"]
    assert "runs/sb_table2_ptb/ptb-mos-seed28: new" in titles and len(titles) == 14
    assert sweep.main(["sweeps/sb_table2_ptb.yaml", "--seeds", "config", "141", "--dry-run"]) == 2
    assert capsys.readouterr().err.strip() == "error: sweeps/sb_table2_ptb.yaml: --seeds: repeated seed in [141, 141]"
    with pytest.raises(SystemExit):
        sweep.main(["sweeps/sb_table2_ptb.yaml", "--seeds", "one", "--dry-run"])
    assert "--seeds: expected integers or config, the config's own seed" in capsys.readouterr().err


def test_a_workers_line_reaches_the_terminal_in_one_write(monkeypatch):
    """sweep.py --jobs's workers report from threads: a line and its newline written apart let two
    workers' lines run together ('[job 2] A: new[job 1] B: new'); each goes out in one write."""
    import io
    writes = []

    class Recorder(io.StringIO):
        def write(self, text):
            writes.append(text)
            return len(text)
    monkeypatch.setattr(sys, "stdout", Recorder())
    threads = [threading.Thread(target=launch_runs.say, args=(f"[job {i}] run{i}: new",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(writes) == sorted(f"[job {i}] run{i}: new\n" for i in range(8))


def test_a_missing_corpus_is_one_line_before_any_run(overrides, tmp_path, monkeypatch, capsys):
    """A newcomer's sweep without AWD_DATA_DIR printed the same download error from every run in
    turn and exited 1; the corpus is checked (or fetched) once, before any run starts."""
    import data.download
    asked = []

    def no_corpus(dataset, root, **_):
        asked.append((dataset, Path(root)))
        raise data.download.DataError(f"could not download {dataset}; place its files in {root}/{dataset} by hand")
    monkeypatch.setattr(data.download, "ensure_corpus", no_corpus)
    commands: list = []
    monkeypatch.setattr(launch_runs, "run_command", in_process(commands))
    out = tmp_path / "sweep"
    assert sweep.main([CONFIG, *overrides, "--seeds", "1", "2", "--out", str(out)]) == 2
    data_dir = next(o.split("=", 1)[1] for o in overrides if o.startswith("data.data_dir="))
    assert asked == [("ptb", Path(data_dir))] and commands == [] and not out.exists()
    assert capsys.readouterr().err.strip() == (f"error: the runs' corpus: could not download ptb; place its files in "
                                               f"{data_dir}/ptb by hand")


def test_submit_without_sbatch_names_the_script_it_wrote(overrides, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))          # no sbatch on it
    out = tmp_path / "slurm"
    assert sweep.main([CONFIG, *overrides, "--out", str(out), "--mode", "slurm", "--sbatch=--gres=gpu:1",
                       "--submit"]) == 2
    script = out / "sweep-softmax.sbatch"
    assert script.is_file()
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: --submit: sbatch is not installed here; the script is written ({script}): submit it on the "
        f"cluster (sbatch {script})")


# ---------------------------------------------------------------------- what the sweep refuses

def write_plan(path: Path, overrides: list[str], out: Path, **experiment) -> Path:
    """A one-experiment plan of CONFIG over the tiny overrides, its runs in `out`."""
    plan = {"title": "test", "out": str(out), "overrides": overrides,
            "experiments": [{"config": str(REPO / CONFIG), **experiment}]}
    path.write_text(yaml.safe_dump(plan))
    return path


@pytest.mark.parametrize("key", ["train.seed", "run.dir"])
def test_a_grid_over_what_the_sweep_sets_is_refused(key, overrides, tmp_path, capsys):
    """--grid train.seed=1,2 planned ...-train.seed=1-seed1 and ...-train.seed=2-seed1, both
    trained with seed 1 (the sweep's train.seed=1 came last)."""
    assert sweep.main([CONFIG, *overrides, "--grid", f"{key}=1,2", "--out", str(tmp_path / "x"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"grid key {key}" in err and "--seeds" in err
    plan = write_plan(tmp_path / "plan.yaml", overrides, tmp_path / "x", grid={key: [1, 2]})
    assert sweep.main([str(plan), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: {plan}: experiments[0].grid: expected no {key} (the sweep sets it: the seeds "
                   f"from `seeds`, the folder from `out`), got '{key}'\n")


def test_robustness_among_the_rank_options_is_refused(overrides, tmp_path, capsys):
    """rank.py --robustness writes robustness_test.json: the sweep waited for rank_test.json and
    ran it again at every sweep."""
    for flag in ("--robustness", "--rob"):        # argparse takes a unique prefix
        with pytest.raises(SystemExit) as exit_info:
            sweep.main([CONFIG, *overrides, "--rank", f"--rank-args={flag}", "--out", str(tmp_path / "x")])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--rank-args: {flag}: " in err and "`robustness:`" in err
    plan = write_plan(tmp_path / "plan.yaml", overrides, tmp_path / "x", rank=["--robustness"])
    assert sweep.main([str(plan), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {plan}: experiments[0].rank: expected") and "`robustness:`" in err
    assert err.count("\n") == 1


def test_slurm_mode_refuses_an_out_that_holds_other_runs(swept, overrides, tmp_path, capsys):
    """--mode slurm wrote (and submitted) an array whose tasks then each refused."""
    out = tmp_path / "sweep"
    shutil.copytree(swept[0], out)
    assert sweep.main([CONFIG, *overrides, "train.lr=5", "--seeds", "1", "--out", str(out), "--mode", "slurm"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds a different run (train.lr is 20.0 there, 5.0 in this sweep)" in err
    assert not list(out.glob("*.sbatch"))


def test_an_unbalanced_quote_in_rank_args_is_one_line(overrides, capsys):
    with pytest.raises(SystemExit) as exit_info:
        sweep.main([CONFIG, *overrides, "--rank", '--rank-args=--contexts "20', "--out", "x"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err == 'sweep.py: error: --rank-args=--contexts "20: No closing quotation (a quote opened and not closed)\n'


def test_grid_values_that_are_one_value_are_refused(overrides, tmp_path, capsys):
    """--grid head.c=0,0.0,-0 planned three run directories of one configuration."""
    out = ["--out", str(tmp_path / "x"), "--dry-run"]
    assert sweep.main([CONFIG, *overrides, "--grid", "train.lr=10,10.0,20", *out]) == 2
    assert capsys.readouterr().err == ("error: grid key train.lr (--grid, or a plan's grid:): the values 10, 10.0 "
                                       "are one value; give each value once\n")
    assert sweep.main(["configs/ptb/gss.yaml", *overrides, "--grid", "head.c=0,0.0,-0", *out]) == 2
    assert "the values 0, 0.0, -0 are one value" in capsys.readouterr().err
    assert sweep.main([CONFIG, *overrides, "--grid", "train.lr=10,20", *out]) == 0


def evaluated_without_checkpoints(run, val_ppl: float) -> None:
    """The run's result files as a finished, evaluated run leaves them (best.pt only a name)."""
    run.dir.mkdir(parents=True)
    (run.dir / "config.yaml").write_text(run.config.to_yaml())
    (run.dir / "metrics.jsonl").write_text(json.dumps({"epoch": run.config.train.epochs}) + "\n")
    (run.dir / "eval_best.json").write_text(json.dumps({"val_ppl": val_ppl}))
    (run.dir / "best.pt").write_text("")


def test_an_experiment_finetuned_already_is_not_finetuned_again(overrides, tmp_path, capsys):
    """`sweep.py PLAN --seeds 3` after seeds [1, 2] (seed 2 finetuned) finetuned seed 3 too, and
    report.py methods pooled both finetunings as one cell."""
    from launch.runs import Experiment, FinetuneBest, finetune_runs, plan_runs
    out = tmp_path / "runs"
    experiment = Experiment(Path(CONFIG), tuple(overrides), finetune_best=FinetuneBest(("train.epochs=1",)))
    [earlier] = plan_runs([experiment], out, seeds=[2])
    evaluated_without_checkpoints(earlier, 90.0)
    (earlier.dir / "finetune").mkdir()
    [run] = plan_runs([experiment], out, seeds=[3])
    evaluated_without_checkpoints(run, 80.0)
    finetunes, [waiting] = finetune_runs([run])
    assert finetunes == []
    assert (f"has a finetuning already, {earlier.dir / 'finetune'}; the best of the runs planned now is "
            f"{run.name}: to finetune it instead, move {earlier.dir / 'finetune'} away first") in waiting
    # seeds added to the plan that make another run the best: the same
    finetunes, [waiting] = finetune_runs(plan_runs([experiment], out, seeds=[2, 3]))
    assert finetunes == [] and f"the best of the runs planned now is {run.name}" in waiting
    # the best finetuned already is the experiment's one finetuning, as before
    shutil.move(earlier.dir / "finetune", run.dir / "finetune")
    finetunes, waiting = finetune_runs(plan_runs([experiment], out, seeds=[2, 3]))
    assert [f.dir for f in finetunes] == [run.dir / "finetune"] and waiting == []


def test_finetune_only_with_nothing_to_finetune_exits_2(overrides, tmp_path, capsys):
    """It exited 0 ("sweep: no runs"): a job chained after a Slurm array could not tell that
    nothing was finetuned."""
    plan = write_plan(tmp_path / "plan.yaml", overrides, tmp_path / "runs", seeds=[1, 2],
                      finetune_best={"overrides": ["train.epochs=1"]})
    for dry_run in ([], ["--dry-run"]):
        assert sweep.main([str(plan), "--finetune-only", *dry_run]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --finetune-only: nothing to finetune: finetuning the best of 2 ")
        assert err.endswith("waits for 2 of them to be trained and evaluated\n") and err.count("\n") == 1


def test_repeated_seeds_add_up():
    """`--seeds 1 --seeds 2` planned seed 2 alone."""
    assert sweep.parse_args([CONFIG, "--seeds", "1", "--seeds", "2", "config", "--out", "x"]).seeds == [1, 2, "config"]


def test_a_plans_out_under_a_file_names_the_plans_key(overrides, tmp_path, capsys):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    plan = write_plan(tmp_path / "plan.yaml", overrides, a_file / "sub")
    assert sweep.main([str(plan), "--dry-run"]) == 2
    assert capsys.readouterr().err == (f"error: {plan}: out: {a_file / 'sub'}: {a_file} is a file, not a "
                                       f"folder; choose another out: (or --out DIR)\n")


def test_seeds_that_make_a_plans_experiments_one_are_named(overrides, tmp_path, capsys):
    """Experiments that differ only in their seeds collide under --seeds: the hint said "an
    experiment or a grid value given twice?"."""
    plan = {"title": "test", "out": str(tmp_path / "runs"), "overrides": overrides,
            "experiments": [{"config": CONFIG, "seeds": [1]}, {"config": CONFIG, "seeds": [2]}]}
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(plan))
    assert sweep.main([str(tmp_path / "plan.yaml"), "--dry-run"]) == 0
    capsys.readouterr()
    assert sweep.main([str(tmp_path / "plan.yaml"), "--seeds", "9", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "--seeds replaces each experiment's own seeds" in err and "given twice" not in err


def test_a_kept_result_made_with_other_options_is_said_to_differ(overrides, tmp_path):
    """A plan's rank: [--contexts, "40"] after the runs were ranked over 20 contexts said
    "finished and evaluated: skip" and kept the 20 contexts' ranks without a word."""
    from launch.runs import Experiment, describe, evaluate_analysis, plan_runs, rank_analysis
    analyses = (evaluate_analysis(["--cache", "--cache-window", "300"]), rank_analysis(["--contexts", "40"]))
    [run] = plan_runs([Experiment(Path(CONFIG), tuple(overrides), analyses=analyses)], tmp_path, seeds=[1])
    run.dir.mkdir()
    (run.dir / "rank_test.json").write_text(json.dumps({"contexts": 20, "dtype": "float32"}))
    (run.dir / "eval_best_cache.json").write_text(json.dumps({"settings": {"window": 500, "theta": 1.0}}))
    said = describe(run, [])
    assert said.startswith("finished and evaluated: skip (note: kept ")
    assert "eval_best_cache.json: window 500 there, 300 in this sweep" in said
    assert "rank_test.json: contexts 20 there, 40 in this sweep" in said
    rank_again = [sys.executable, str(launch_runs.SCRIPTS["rank"]), str(run.dir), *analyses[1].args]
    assert "rank_test.json" not in describe(run, [rank_again])          # made again: nothing kept
    (run.dir / "rank_test.json").write_text(json.dumps({"contexts": 40, "dtype": "float32"}))
    (run.dir / "eval_best_cache.json").write_text(json.dumps({"settings": {"window": 300, "theta": 1.0}}))
    assert describe(run, []) == "finished and evaluated: skip"
