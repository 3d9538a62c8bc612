"""train.py under torchrun (DDP) on the CPU: 2 processes with gloo on localhost, tiny models.

Most runs start the ranks the way torchrun does (RANK, LOCAL_RANK, WORLD_SIZE and a rendezvous
address in the environment of each process), so a test can signal one rank; one test goes
through torchrun itself (python -m torch.distributed.run).
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import train
from experiment.distributed import DistributedError, World, rank_seed
from tests.conftest import TINY
from tests.test_train import assert_bitwise_equal, metrics, model_tensors, wait_for

REPO = Path(__file__).resolve().parent.parent
PTB = "configs/ptb/softmax.yaml"
NO_DROPOUT = ["model.dropout=0", "model.dropouth=0", "model.dropouti=0", "model.dropoute=0", "model.wdrop=0"]
# Two epochs of ~50 steps, ET-ASGD from the second: the runs cross the switch to averaging.
TWO_EPOCHS = ["train.epochs=2", "train.asgd_trigger=et", "train.asgd_switch_epoch=1"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(args: list[str], n: int = 2) -> list[subprocess.Popen]:
    """train.py in n processes, as torchrun starts it."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "WORLD_SIZE": str(n), "OMP_NUM_THREADS": "1"}
    return [subprocess.Popen([sys.executable, "train.py", *args], cwd=REPO,
                             env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for rank in range(n)]


def finish(procs: list[subprocess.Popen], timeout: float = 180) -> list[tuple[int, str, str]]:
    """(exit code, stdout, stderr) of every rank."""
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        results.append((proc.returncode, out, err))
    return results


def run_ranks(args: list[str], n: int = 2) -> list[tuple[int, str, str]]:
    return finish(start_ranks(args, n))


def untimed(records: list[dict]) -> list[dict]:
    return [{key: value for key, value in record.items() if key not in ("seconds", "cpu_seconds")}
            for record in records]


def train_args(data: Path, run_dir: Path, *extra: str) -> list[str]:
    return [PTB, f"data.data_dir={data}", *TINY, *TWO_EPOCHS, f"run.dir={run_dir}", *extra]


@pytest.fixture(scope="module")
def uninterrupted(small_data, tmp_path_factory) -> Path:
    """Two ranks with every dropout on, trained to the end without a stop."""
    run_dir = tmp_path_factory.mktemp("ddp") / "uninterrupted"
    results = run_ranks(train_args(small_data, run_dir))
    assert [code for code, _, _ in results] == [0, 0], results[0][2] + results[1][2]
    return run_dir


# ---------------------------------------------------------------------- the maths

@pytest.mark.parametrize("ddp_chunks, single_chunks", [
    ([], ["train.small_batch_size=2"]),                                  # a forward per rank
    (["train.small_batch_size=1"], ["train.small_batch_size=1"]),        # two per rank (no_sync)
    (["run.ddp_reduce=allreduce"], ["train.small_batch_size=2"]),        # the plain all-reduce
])
def test_two_processes_without_dropout_train_as_one_with_half_batches(
        ddp_chunks, single_chunks, small_data, tmp_path, capsys):
    """torchrun --nproc_per_node 2 == one process with small_batch_size = batch_size / 2: each
    rank's block of columns is one of the single process's chunks, with the same weight (and
    a rank's block cut by small_batch_size is cut as the single process cuts the batch)."""
    ddp_dir, single_dir = tmp_path / "ddp", tmp_path / "single"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "train.py", *train_args(small_data, ddp_dir, *NO_DROPOUT, *ddp_chunks, "run.tensorboard=true")],
        cwd=REPO, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert train.main(train_args(small_data, single_dir, *NO_DROPOUT, *single_chunks)) == 0
    capsys.readouterr()

    ddp, single = model_tensors(ddp_dir / "last.pt"), model_tensors(single_dir / "last.pt")
    assert ddp.keys() == single.keys() and any(key.endswith(".ax") for key in ddp)  # ASGD averages too
    for key in ddp:
        torch.testing.assert_close(ddp[key], single[key], rtol=0, atol=1e-6, msg=key)
    ddp_best, single_best = model_tensors(ddp_dir / "best.pt"), model_tensors(single_dir / "best.pt")
    for key in ddp_best:
        torch.testing.assert_close(ddp_best[key], single_best[key], rtol=0, atol=1e-6, msg=key)
    records, expected = metrics(ddp_dir), metrics(single_dir)
    assert [r["epoch"] for r in records] == [1, 2] and records[0].get("switched_to_asgd")
    for got, want in zip(records, expected):
        assert got["step"] == want["step"] and got["optimizer"] == want["optimizer"]
        assert got["train_loss"] == pytest.approx(want["train_loss"], abs=1e-5)
        assert got["val_loss"] == pytest.approx(want["val_loss"], abs=1e-5)
    # Written once, by rank 0: one line per epoch above, one progress report, one event file.
    assert proc.stdout.count("done:") == 1 and proc.stdout.count("| 2 processes") == 1
    assert len(list((ddp_dir / "tensorboard").iterdir())) == 1
    assert json.loads((ddp_dir / "run.json").read_text())["world_size"] == 2
    assert not [p.name for p in ddp_dir.iterdir() if p.name.startswith(".") and p.name != ".lock"]


def test_ranks_draw_their_own_dropout_masks(uninterrupted, small_data, tmp_path, capsys):
    """With dropout the two ranks are not the single process with half batches (whose chunks
    share one random stream), and rank 1's stream is saved apart from rank 0's."""
    single_dir = tmp_path / "single"
    assert train.main(train_args(small_data, single_dir, "train.small_batch_size=2")) == 0
    capsys.readouterr()
    ddp, single = model_tensors(uninterrupted / "last.pt"), model_tensors(single_dir / "last.pt")
    assert any(not torch.equal(ddp[key], single[key]) for key in ddp)
    last = torch.load(uninterrupted / "last.pt", weights_only=True)
    assert last["world_size"] == 2 and len(last["rng_of_other_ranks"]) == 1
    assert not torch.equal(last["rng"]["torch"], last["rng_of_other_ranks"][0]["torch"])
    assert rank_seed(141, 1) not in (rank_seed(141, 2), rank_seed(142, 1))


# ---------------------------------------------------------------------- stops and resumes

def test_a_crash_or_a_kill_then_resume_is_bit_identical(uninterrupted, small_data, tmp_path):
    """SIGKILL one rank (a crash): the other stops on its own with one line and last.pt intact;
    resumed, then SIGKILL both (a lost node); resumed again to the end: the same bits as the run
    that was never stopped."""
    run_dir = tmp_path / "killed"
    rng = random.Random(os.getpid())
    procs = start_ranks(train_args(small_data, run_dir, "run.checkpoint_every_steps=3"))
    wait_for(run_dir / "last.pt", procs[0])
    time.sleep(rng.uniform(0.1, 0.8))
    procs[1].send_signal(signal.SIGKILL)
    (code, _, err), _ = finish(procs)
    assert code == 1 and err.startswith("error: rank 0 stopped at step") and err.count("\n") == 1, err
    assert "is untouched" in err
    step = torch.load(run_dir / "last.pt", weights_only=True)["progress"]["step"]

    procs = start_ranks(["--resume", str(run_dir)])
    deadline = time.time() + 120
    while torch.load(run_dir / "last.pt", weights_only=True)["progress"]["step"] == step:
        assert procs[0].poll() is None and time.time() < deadline, procs[0].stderr.read()
        time.sleep(0.05)
    time.sleep(rng.uniform(0.0, 0.5))
    for proc in procs:
        proc.send_signal(signal.SIGKILL)
    finish(procs)

    results = run_ranks(["--resume", str(run_dir)])
    assert [code for code, _, _ in results] == [0, 0], results[0][2]
    # (the second sitting may have trained to the end before its SIGKILL: "resumed: finished ...")
    assert " | resumed at epoch " in results[0][1] or " | resumed: finished after epoch " in results[0][1]
    assert_bitwise_equal(model_tensors(run_dir / "last.pt"), model_tensors(uninterrupted / "last.pt"))
    assert_bitwise_equal(model_tensors(run_dir / "best.pt"), model_tensors(uninterrupted / "best.pt"))
    assert untimed(metrics(run_dir)) == untimed(metrics(uninterrupted))


def test_sigterm_to_one_rank_stops_every_rank_at_the_same_step(uninterrupted, small_data, tmp_path):
    run_dir = tmp_path / "terminated"
    procs = start_ranks(train_args(small_data, run_dir, "run.checkpoint_every_steps=20"))
    wait_for(run_dir / "last.pt", procs[0])          # at step 20 of the first epoch's ~55
    procs[1].send_signal(signal.SIGTERM)
    (code0, _, err0), (code1, _, err1) = finish(procs)
    assert code0 == code1 == 128 + signal.SIGTERM, err0 + err1
    assert err0.startswith("stopped: SIGTERM after step") and "--resume" in err0 and err1 == ""
    progress = torch.load(run_dir / "last.pt", weights_only=True)["progress"]
    assert progress["step"] > 20 and progress["position"] > 0      # stopped within an epoch,
    assert len(progress["hidden"]) == 2                             # with a chunk's states per rank
    results = run_ranks(["--resume", str(run_dir)])
    assert [code for code, _, _ in results] == [0, 0], results[0][2]
    assert_bitwise_equal(model_tensors(run_dir / "last.pt"), model_tensors(uninterrupted / "last.pt"))


# ---------------------------------------------------------------------- refusals

def test_resuming_with_another_number_of_processes_is_refused(uninterrupted, small_data, tmp_path, capsys):
    run_dir = tmp_path / "copy"
    shutil.copytree(uninterrupted, run_dir)
    before = (run_dir / "last.pt").read_bytes()
    assert train.main(["--resume", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {run_dir / 'last.pt'}: saved by 2 process(es), resumed by 1;")
    assert err.count("\n") == 1
    # and a single process's run is not continued by two
    single_dir = tmp_path / "single"
    assert train.main(train_args(small_data, single_dir, "run.max_steps=3")) == 0
    (code0, _, err0), (code1, _, err1) = run_ranks(["--resume", str(single_dir)])
    assert code0 == code1 == 2 and "saved by 1 process(es), resumed by 2" in err0 and err1 == ""
    assert (run_dir / "last.pt").read_bytes() == before


def test_a_batch_size_the_processes_do_not_divide_is_refused(small_data, tmp_path):
    run_dir = tmp_path / "odd"
    (code0, _, err0), (code1, _, err1) = run_ranks(train_args(small_data, run_dir, "train.batch_size=5"))
    assert code0 == code1 == 2
    assert err0 == ("error: train.batch_size: 5 is not divisible by the 2 processes of this run (each "
                    "trains an equal block of the batch's columns); choose a batch size or a number of "
                    "processes that divides it\n") and err1 == ""
    assert not run_dir.exists()


def test_resuming_with_a_process_count_that_does_not_divide_the_batch_names_the_count_saved(small_data, tmp_path):
    # A resume cannot change train.batch_size: the line must say how many processes to resume
    # with, not suggest another batch size.
    run_dir = tmp_path / "single"
    assert train.main(train_args(small_data, run_dir, "run.max_steps=3")) == 0
    before = (run_dir / "last.pt").read_bytes()
    results = run_ranks(["--resume", str(run_dir)], n=3)      # TINY's batch of 4 over 3
    assert [code for code, _, _ in results] == [2, 2, 2]
    err0 = results[0][2]
    assert err0.startswith(f"error: {run_dir / 'last.pt'}: saved by 1 process(es), resumed by 3;"), err0
    assert err0.count("\n") == 1 and results[1][2] == results[2][2] == ""
    assert (run_dir / "last.pt").read_bytes() == before


def test_a_lost_process_line_says_how_to_continue_from_the_last_checkpoint(tiny_run, tmp_path):
    """After a crash or a kill of one process the others' line names last.pt and, like a signal
    stop's, the command that continues the run (with as many processes); before any last.pt,
    only that none was written."""
    from experiment.training_run import lost_process_message
    world = World(rank=1, size=2, distributed=True)
    lost = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer")
    message = lost_process_message(lost, world, 42, tiny_run)
    assert message.startswith(f"error: rank 1 stopped at step 42 (Connection closed by peer); the last "
                              f"checkpoint, {tiny_run / 'last.pt'} (after epoch ")   # a finished run's
    assert message.endswith(f"is untouched; continue with torchrun --standalone --nproc_per_node 2 train.py "
                            f"--resume {tiny_run} (2 processes in all)")
    assert lost_process_message(lost, world, 3, tmp_path).endswith(
        f"no checkpoint has been written yet (none in {tmp_path})")


def test_the_resume_command_of_a_torchrun_run_is_pasteable_on_one_node_and_counts_its_processes(tmp_path):
    from experiment.training_run import resume_command
    run = tmp_path / "a run"
    assert resume_command(run, World(size=4, distributed=True)) == (
        f"torchrun --standalone --nproc_per_node 4 train.py --resume '{run}' (4 processes in all)")
    assert resume_command(run, World(size=1, distributed=True)).endswith("--nproc_per_node 1 train.py "
                                                                        f"--resume '{run}' (1 process in all)")
    assert resume_command(run, World()) == f"python train.py --resume '{run}'"


def test_a_new_run_into_a_run_directory_names_the_command_its_processes_resume_it_with(
        tiny_run, small_data, tmp_path, capsys):
    """The refusal of a new run where a run is names the launcher of the run it found (a last.pt
    saved by 2 processes is refused to python train.py --resume), not the one that asked."""
    for processes, command in [(1, "python train.py --resume {}"),
                               (2, "torchrun --standalone --nproc_per_node 2 train.py --resume {} (2 processes in all)")]:
        run_dir = tmp_path / f"saved-by-{processes}"
        shutil.copytree(tiny_run, run_dir)
        last = torch.load(run_dir / "last.pt", weights_only=True)
        unfinished = {**last["progress"], "finished": False}     # (a finished run is named so instead)
        torch.save({**last, "world_size": processes, "progress": unfinished}, run_dir / "last.pt")
        assert train.main([PTB, f"data.data_dir={small_data}", *TINY, f"run.dir={run_dir}"]) == 2
        assert capsys.readouterr().err == (f"error: {run_dir} already holds a run; continue it with "
                                           f"{command.format(run_dir)} or choose another run.dir\n")


def test_the_launch_environment_is_checked():
    assert World.from_environment({}) == World()
    world = World.from_environment({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert (world.rank, world.size, world.local_rank, world.distributed) == (3, 4, 1, True)
    assert world.columns(20) == slice(15, 20)
    for environ, complaint in [({"RANK": "0"}, "WORLD_SIZE, LOCAL_RANK not set"),
                               ({"RANK": "0", "WORLD_SIZE": "two", "LOCAL_RANK": "0"}, "must be integers"),
                               ({"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "do not fit")]:
        with pytest.raises(DistributedError, match=complaint):
            World.from_environment(environ)


# ---------------------------------------------------------------------- the gradient sum

class FakeCollectives:
    """torch.distributed's collectives for a hook run in one process as rank 0 of `rows`
    ranks, recording every output tensor they are given."""

    def __init__(self, rows: torch.Tensor):
        self.rows, self.outputs = rows, []

    def all_gather_single(self, output, tensor, group=None, async_op=False):
        assert torch.equal(tensor, self.rows[0])
        self.outputs.append(output)
        output.view(self.rows.shape).copy_(self.rows)
        return self

    def all_reduce(self, tensor, op=None, group=None, async_op=False):
        self.outputs.append(tensor)
        tensor.copy_(self.rows.sum(0))
        return self

    def wait(self):
        return True

    def install(self, monkeypatch) -> None:
        from experiment import distributed
        monkeypatch.setattr(distributed.dist, "get_world_size", lambda group=None: len(self.rows))
        monkeypatch.setattr(distributed.dist, "all_gather_single", self.all_gather_single)
        monkeypatch.setattr(distributed.dist, "all_reduce", self.all_reduce)
        monkeypatch.setattr(distributed.dist, "all_gather", None)     # the list form is not used


class Bucket:
    def __init__(self, buffer):
        self._buffer = buffer

    def buffer(self):
        return self._buffer


def test_the_ordered_hook_sums_in_rank_order_into_the_bucket_through_one_gather_buffer(monkeypatch):
    from experiment.distributed import sum_in_rank_order
    # Values whose float32 sum depends on the order of the additions.
    rows = torch.tensor([[1e8, 1.0, 3.0], [1.0, 1e8, -3.0], [-1e8, -1e8, 1e-7], [0.5, 0.5, 7.0]])
    fake = FakeCollectives(rows)
    fake.install(monkeypatch)
    buffer = rows[0].clone()
    result = sum_in_rank_order(None, Bucket(buffer)).wait()
    expected = rows[0].clone()
    for row in rows[1:]:
        expected += row
    assert torch.equal(result, expected) and not torch.equal(expected, rows.flip(0).sum(0))
    assert result.data_ptr() == buffer.data_ptr()                 # summed into the bucket itself
    assert len(fake.outputs) == 1 and fake.outputs[0].numel() == rows.numel()   # one gather buffer


def test_ddp_reduce_allreduce_sums_by_one_all_reduce(monkeypatch):
    from experiment.distributed import COMM_HOOKS
    rows = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    fake = FakeCollectives(rows)
    fake.install(monkeypatch)
    buffer = rows[0].clone()
    result = COMM_HOOKS["allreduce"](None, Bucket(buffer)).wait()
    assert torch.equal(result, torch.tensor([4.0, 6.0])) and fake.outputs == [buffer]


def test_world_sum_adds_every_rank_value_and_is_the_value_alone_in_one_process(monkeypatch):
    assert World().sum(2.5) == 2.5
    fake = FakeCollectives(torch.tensor([[1.5], [2.25]], dtype=torch.float64))
    fake.install(monkeypatch)
    assert World(rank=0, size=2, distributed=True).sum(1.5) == 3.75


def test_an_epoch_record_costs_the_cpu_time_world_sum_gives(small_data, tmp_path, monkeypatch):
    """train.py writes the sum over the ranks, not its own process's CPU time: here a stand-in
    sum adds 1000 s, as if another rank had spent them."""
    monkeypatch.setattr(World, "sum", lambda self, value: value + 1000.0)
    run_dir = tmp_path / "run"
    assert train.main([PTB, f"data.data_dir={small_data}", *TINY, "train.epochs=1", f"run.dir={run_dir}"]) == 0
    epochs = metrics(run_dir)
    assert len(epochs) == 1 and 1000 < epochs[0]["cpu_seconds"] < 1000 + 120


def test_a_mid_epoch_last_pt_holds_every_ranks_cpu_time_and_rank_0_resumes_with_it(
        small_data, tmp_path, monkeypatch):
    """A run stopped within an epoch and resumed counts each rank's CPU time of the epoch once:
    last.pt holds the ranks' sum (here a stand-in sum adds another rank's 1000 s each time),
    which rank 0 resumes with (the other ranks start the epoch's count afresh)."""
    monkeypatch.setattr(World, "sum", lambda self, value: value + 1000.0)
    run_dir = tmp_path / "run"
    args = [PTB, f"data.data_dir={small_data}", *TINY, "train.epochs=1", f"run.dir={run_dir}"]
    assert train.main([*args, "run.max_steps=5"]) == 0
    saved = torch.load(run_dir / "last.pt", weights_only=True)["progress"]["epoch_cpu_seconds"]
    assert 1000 < saved < 1000 + 60
    assert train.main(["--resume", str(run_dir), "run.max_steps=null"]) == 0
    epochs = metrics(run_dir)          # the first sitting's sum, and this sitting's
    assert len(epochs) == 1 and 2000 < epochs[0]["cpu_seconds"] < 2000 + 120


def test_every_documented_torchrun_command_splits_its_configs_batch_evenly():
    """docs/gpus.md's flagship example ran WikiText-2 MoS (train.batch_size 15) on 4 and on 2 x 4
    processes: refused at the start by World.columns. Each torchrun command there (a --resume
    continues the command above it) must have a process count that divides its config's batch."""
    import re
    import shlex
    from experiment.config import load_config
    page = (REPO / "docs" / "gpus.md").read_text(encoding="utf-8").replace("\\\n", " ")
    nodes_in_sbatch = dict(re.findall(r"#SBATCH .*--(nodes)=(\d+)", page))
    checked = 0
    for line in page.splitlines():
        if "torchrun --n" not in line or "train.py" not in line:
            continue
        words = shlex.split(line.split("torchrun", 1)[1], comments=True)
        options = dict(zip(words, words[1:]))
        nodes = options.get("--nnodes", "1")
        nodes = int(nodes_in_sbatch["nodes"] if nodes == "$SLURM_NNODES" else nodes)
        processes = nodes * int(options["--nproc_per_node"])
        after = words[words.index("train.py") + 1:]
        if after[0] == "--resume":
            continue
        config = load_config(after[0], [w for w in after[1:] if "=" in w])
        World(0, processes, 0, distributed=True).columns(config.train.batch_size)    # raises if not
        checked += 1
    assert checked >= 2
