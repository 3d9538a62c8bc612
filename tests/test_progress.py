"""TrainingProgress: the one record of where a run stands, saved in last.pt as a unit."""
from __future__ import annotations

import math
import time

import torch

import train
from experiment.config import load_config
from experiment.progress import EpochProgress, RunLog, TrainingProgress, clock, epoch_record, peak_gpu_memory
from tests.conftest import TINY

# The keys last.pt's "progress" dict has held since the first checkpoint format, and those added since.
FIRST_KEYS = {"epoch", "position", "step", "hidden", "epoch_nll_sum", "epoch_tokens",
              "epoch_seconds", "val_history", "best_val", "asgd_start_epoch", "finished"}
SAVED_KEYS = FIRST_KEYS | {"epoch_cpu_seconds"}


def a_progress() -> TrainingProgress:
    hidden = [[(torch.randn(1, 2, 3), torch.randn(1, 2, 3)) for _ in range(3)] for _ in range(2)]
    return TrainingProgress(epoch=4, position=35, step=99, hidden=hidden, epoch_nll_sum=12.5,
                            epoch_tokens=70, epoch_seconds=3.25, epoch_cpu_seconds=3.5, val_history=[5.0, 4.5, 4.4],
                            best_val=4.4, asgd_start_epoch=3, finished=False)


def test_round_trip_keeps_every_field_and_the_saved_keys():
    progress = a_progress()
    saved = progress.to_dict()
    assert set(saved) == SAVED_KEYS
    assert all(isinstance(h, list) and isinstance(h[0], list) for h in saved["hidden"])
    restored = TrainingProgress.from_dict(saved)
    for name in SAVED_KEYS - {"hidden"}:
        assert getattr(restored, name) == getattr(progress, name), name
    for chunk, original in zip(restored.hidden, progress.hidden):
        for (h, c), (h0, c0) in zip(chunk, original):
            assert torch.equal(h, h0) and torch.equal(c, c0)
    restored.val_history.append(1.0)                 # a copy, not the saved list itself
    assert saved["val_history"] == [5.0, 4.5, 4.4]


def test_start_next_epoch_resets_the_epochs_sums_and_keeps_the_history():
    progress = a_progress()
    progress.start_next_epoch()
    assert (progress.epoch, progress.position, progress.hidden) == (5, 0, None)
    assert (progress.epoch_nll_sum, progress.epoch_tokens, progress.epoch_seconds) == (0.0, 0, 0.0)
    assert progress.epoch_cpu_seconds == 0.0
    assert progress.completed_epochs == 4 and progress.step == 99
    assert progress.val_history == [5.0, 4.5, 4.4] and progress.best_val == 4.4


def test_a_fresh_record_is_a_run_that_has_not_started():
    progress = TrainingProgress()
    assert (progress.epoch, progress.step, progress.val_history) == (1, 0, [])
    assert progress.best_val == math.inf and progress.completed_epochs == 0


def test_last_pt_holds_the_trainers_record_and_read_gives_it_back(small_data, tmp_path):
    run_dir = tmp_path / "run"
    assert train.main(["configs/ptb/softmax.yaml", f"data.data_dir={small_data}", *TINY,
                       "run.max_steps=3", f"run.dir={run_dir}"]) == 0
    saved = torch.load(run_dir / "last.pt", weights_only=True)["progress"]
    assert set(saved) == SAVED_KEYS
    progress = TrainingProgress.read(run_dir / "last.pt")
    assert (progress.epoch, progress.step, progress.finished) == (1, 3, False)
    assert progress.position == saved["position"] > 0
    assert len(progress.hidden) == 1 and len(progress.hidden[0]) == 3    # one chunk, three layers


def test_a_record_saved_before_cpu_seconds_restores_with_the_epochs_cpu_time_at_zero():
    saved = {key: value for key, value in a_progress().to_dict().items() if key in FIRST_KEYS}
    restored = TrainingProgress.from_dict(saved)
    assert restored.epoch_cpu_seconds == 0.0 and restored.epoch_seconds == 3.25


def test_validation_is_charged_to_the_epochs_cpu_time_not_to_its_training_wall_time():
    progress = TrainingProgress()
    started = clock()
    while time.process_time() - started[1] < 0.05:
        pass
    progress.add_time(started)
    training_wall, training_cpu = progress.epoch_seconds, progress.epoch_cpu_seconds
    assert training_wall >= 0.05 * 0.9 and training_cpu >= 0.05
    started = clock()
    while time.process_time() - started[1] < 0.05:
        pass
    progress.add_time(started, training=False)
    assert progress.epoch_seconds == training_wall and progress.epoch_cpu_seconds >= training_cpu + 0.05


def test_a_resume_within_the_same_second_keeps_its_events_in_tensorboard(tmp_path, monkeypatch):
    """Event files are read in name order; the resumed writer's file must come after the first,
    even in the same second and when the writers' counter goes from 9 to 10 (10 sorts first)."""
    import tensorboard.summary.writer.event_file_writer as event_file_writer
    from tests.test_train import tensorboard_scalars

    class FrozenClock:                      # the same second until someone sleeps
        now = 1_700_000_000.25

        def time(self):
            return self.now

        def sleep(self, seconds):
            self.now += max(seconds, 0.0)

    frozen = FrozenClock()
    monkeypatch.setattr(time, "time", frozen.time)
    monkeypatch.setattr(time, "sleep", frozen.sleep)
    monkeypatch.setattr(event_file_writer._global_uid, "_value", 9)
    first = RunLog(tmp_path)
    first.open_tensorboard(step=0)
    first.scalar("epoch/val_ppl", 500.0, 10)            # logged, then killed before last.pt
    first.close()
    resumed = RunLog(tmp_path)
    resumed.open_tensorboard(step=4)                    # last.pt at step 4: purge from step 5
    resumed.scalar("epoch/val_ppl", 400.0, 10)
    resumed.scalar("epoch/val_ppl", 300.0, 20)
    resumed.close()
    names = sorted(p.name for p in (tmp_path / "tensorboard").iterdir())
    assert [name.endswith(".9") for name in names] == [True, False]     # the first run's, first
    assert tensorboard_scalars(tmp_path, "epoch/val_ppl") == [(10, 400.0), (20, 300.0)]


def test_peak_gpu_memory_is_on_the_progress_line_and_in_the_epoch_record_on_cuda_only(tmp_path, monkeypatch, capsys):
    """On CUDA the allocator's peak is on the step lines, the epoch line and in metrics.jsonl;
    on the CPU, which has no such counter, none of the three names it."""
    config = load_config("configs/ptb/softmax.yaml", ["run.log_interval=1"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 3 * 2**30 + 2**29)
    progress = TrainingProgress(epoch=1, step=1, epoch_nll_sum=4.0, epoch_tokens=1, best_val=4.0)
    for device, expected in (("cpu", None), ("cuda:0", 3 * 2**30 + 2**29)):
        line = EpochProgress(config, 1, 0, 0, 100, interactive=False, device=device).line(1, 4.0)
        record = epoch_record(progress, 4.0, "SGD", 30.0, cpu_seconds=1.0, peak_memory=peak_gpu_memory(device))
        (tmp_path / device).mkdir()
        RunLog(tmp_path / device).log_epoch(record)
        printed = capsys.readouterr().out
        assert record.get("peak_gpu_memory_bytes") == expected
        if expected is None:
            assert "peak" not in line and "peak" not in printed
        else:
            assert line.endswith("| peak 3.50 GiB") and printed.rstrip().endswith("| peak 3.50 GiB")


def test_a_checkpoint_at_an_epochs_end_is_said_to_be_after_that_epoch():
    """A last.pt saved as epoch 30 ended holds epoch = 31 (the next one, at position 0): a
    message said "(epoch 31, step S)", as if epoch 31 were done."""
    assert TrainingProgress(epoch=31, position=0, step=20581).saved_where == "after epoch 30, step 20581"
    assert TrainingProgress(epoch=31, position=7, step=20588).saved_where == "within epoch 31, step 20588"
    assert TrainingProgress().saved_where == "within epoch 1, step 0"        # nothing trained yet
