"""The GPU figures the README and docs/gpus.md quote are those of the committed raw output."""
from __future__ import annotations

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RAW = REPO / "results" / "gpu_h200_2026-11-26"


def section(text: str, heading: str) -> str:
    start = text.index(heading)
    following = re.search(r"^## ", text[start + len(heading):], flags=re.M)
    return text[start:start + len(heading) + following.start()] if following else text[start:]


def epoch(head: str) -> dict:
    return json.loads((RAW / f"metrics_{head}.jsonl").read_text().splitlines()[0])


def test_the_quoted_epoch_seconds_peaks_and_perplexities_are_the_committed_runs():
    readme = section((REPO / "README.md").read_text(encoding="utf-8"), "## On a GPU")
    gpus = section((REPO / "docs" / "gpus.md").read_text(encoding="utf-8"), "## Measured on an H200")
    for head in ("softmax", "mos", "mixtape"):
        record = epoch(head)
        seconds = f"{record['seconds']:.1f}"
        peak = f"{record['peak_gpu_memory_bytes'] / 2**30:.2f} GiB"
        assert seconds in gpus and peak in gpus and f"{record['val_ppl']:.2f}" in gpus, head
        if head != "mixtape":
            assert f"in {seconds} s" in readme and f"peak {peak}" in readme, head


def test_the_self_check_passed_every_check_as_the_docs_say():
    output = (RAW / "gpu_check.txt").read_text(encoding="utf-8")
    passed, total = map(int, re.search(r"(\d+) of (\d+) checks passed", output).groups())
    assert passed == total == 19 and "FAILED" not in output
    assert "19 of 19" in (REPO / "README.md").read_text(encoding="utf-8")


def test_the_runs_per_gpu_ratios_are_the_benchmarks():
    output = (RAW / "bench_parallel.txt").read_text(encoding="utf-8")
    ratios = json.loads(output[output.index("{"):])["concurrent_ratio"]
    quoted = ", ".join(f"{ratios[k]:.2f}x" for k in ("1", "2", "4", "8"))
    assert quoted == "1.00x, 0.91x, 0.95x, 0.92x"
    assert quoted in (REPO / "docs" / "gpus.md").read_text(encoding="utf-8")


# ---------------------------------------------------------------------- group runs, 2026-11-27
GROUPS = REPO / "results" / "gpu_h200_2026-11-27"


def bench_ratios(path: Path) -> dict[str, list[str]]:
    """bench_group.py's tables: per shape (mini, ptb) the 'x solo run' column in G order."""
    tables, shape = {}, None
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith(("mini (", "ptb (")):
            shape = line.split()[0]
            tables[shape] = []
        elif shape and re.match(r"\| \d+ \|", line):
            tables[shape].append(line.split("|")[3].strip())
    return tables


def archived_epochs(archive: Path) -> dict[str, list[dict]]:
    import tarfile
    with tarfile.open(archive) as tar:
        return {Path(m.name).parent.name: [json.loads(x) for x in tar.extractfile(m).read().decode().splitlines()]
                for m in tar.getmembers() if m.name.endswith("metrics.jsonl")}


STATES = ("eager", "captured", "fewer_launches", "fused_cells")     # the columns of gpus.md's table


def profile_milliseconds(path: Path, row: str | None = None) -> float:
    """A profile.txt's device time per step: all of it, or one row's (self CUDA time), over its 5 steps."""
    text = path.read_text(encoding="utf-8")
    if row is None:
        return float(re.search(r"Self CUDA time total: ([\d.]+)ms", text).group(1)) / 5
    line = next(x for x in text.splitlines() if x.strip().startswith(row + " "))
    self_cuda = re.split(r"\s{2,}", line.strip())[6]            # the table's seventh column
    return float(self_cuda.removesuffix("ms")) / 5


def test_the_quoted_group_run_figures_are_the_committed_output():
    gpus = " ".join(section((REPO / "docs" / "gpus.md").read_text(encoding="utf-8"), "## Group runs").split())
    tables = [bench_ratios(GROUPS / state / "bench_group.txt") for state in STATES]
    for k, g in enumerate((1, 2, 4, 8, 16, 32)):
        mini = " | ".join(t["mini"][k] for t in tables)
        ptb = " | ".join(t["ptb"][k] for t in tables) + " |" if k < 4 else "| | | |"
        assert f"| {g} | {mini} | {ptb}" in gpus, (g, mini, ptb)
    for state in STATES[1:]:
        assert "4 of 4 checks passed" in (GROUPS / state / "gpu_check.txt").read_text(encoding="utf-8"), state
    assert "[FAILED] group mos" in (GROUPS / "eager" / "gpu_check.txt").read_text(encoding="utf-8")
    # G = 16 measured three times with the fused cells, each against its own solo run.
    repeat = (GROUPS / "fused_cells" / "bench_group.txt").read_text() + (GROUPS / "fused_cells" / "bench_mini_repeat.txt").read_text()
    sixteen = re.findall(r"^\| 16 \| ([\d,]+) \| ([\d.]+x) \|", repeat, flags=re.M)
    assert len(sixteen) == 3
    assert (f"{sixteen[0][0]}, {sixteen[1][0]} and {sixteen[2][0]} tokens/s, {sixteen[0][1]}, {sixteen[1][1]} "
            f"and {sixteen[2][1]}") in gpus, sixteen
    solos = sorted(int(x.replace(",", "")) for x in re.findall(r"^mini .*solo run ([\d,]+) tokens/s", repeat, flags=re.M))
    assert f"read {solos[0]:,} to {solos[-1]:,} tokens/s in this session" in gpus, solos
    earlier = sorted(int(x.replace(",", "")) for state in STATES[:3] for x in re.findall(
        r"^mini .*solo run ([\d,]+) tokens/s", (GROUPS / state / "bench_group.txt").read_text(), flags=re.M))
    groups = sorted(int(x.replace(",", "")) for x, _ in sixteen)
    assert f"{earlier[0]:,} to {earlier[-1]:,} in earlier calls" in gpus, earlier
    assert f"G = 16 is {groups[0] / earlier[-1]:.1f}x to {groups[-1] / earlier[0]:.1f}x" in gpus
    plans = {state: (GROUPS / state / "plan_steps.txt").read_text(encoding="utf-8") for state in STATES[1:]}
    assert "62.1 ms (3.13x)" in plans["captured"] and "60.9 ms (4.08x)" in plans["fewer_launches"]
    assert "226.3 ms" in plans["fused_cells"] and "49.0 ms (4.62x)" in plans["fused_cells"]
    assert "226.3 ms" in gpus and "49.0 ms as one group step (4.62x; 3.13x when captured, 4.08x" in gpus
    # Where a step of 16 goes.
    captured, fused = GROUPS / "captured" / "profile.txt", GROUPS / "fused_cells" / "profile.txt"
    assert "38.5 ms (median of 5)" in captured.read_text() and "27.0 ms (median of 5)" in fused.read_text()
    assert "host-device synchronizations in one step: 1" in fused.read_text()
    loops = {path: sum(profile_milliseconds(path, row) for row in ("GroupedLSTMRecurrence", "GroupedLSTMRecurrenceBackward"))
             for path in (GROUPS / "fewer_launches" / "profile.txt", fused)}
    assert (f"GPU busy {profile_milliseconds(captured):.1f} ms" in gpus
            and f"GPU busy {profile_milliseconds(fused):.1f} ms (the LSTM loops {loops[fused]:.1f} ms of it, "
                f"{loops[GROUPS / 'fewer_launches' / 'profile.txt']:.1f} before" in gpus)
    # 2 epochs: the group's validation perplexities beside the solo runs', the epoch sums, the peaks.
    runs = archived_epochs(GROUPS / "fused_cells" / "runs.tar.gz")
    pairs = [f"{runs[f'group-seed{s}'][-1]['val_ppl']:.2f} and {runs[f'solo-seed{s}'][-1]['val_ppl']:.2f}" for s in (1, 2)]
    assert f"{pairs[0]}, {pairs[1]} (fused cells)" in gpus, pairs
    finals = sorted(runs[f"group-seed{s}"][-1]["val_ppl"] for s in range(1, 9))
    assert f"from {finals[0]:.2f} to {finals[-1]:.2f}" in gpus
    sums = [f"{sum(runs[f'group-seed{s}'][e]['seconds'] for s in range(1, 9)):.1f}" for e in (0, 1)]
    assert f"group of 8 seeds took {sums[0]} and {sums[1]} s" in gpus, sums
    solo = sorted(r["seconds"] for s in (1, 2) for r in runs[f"solo-seed{s}"])
    assert f"solo runs' {solo[0]:.1f}-{solo[-1]:.1f} s in the same call" in gpus, solo
    before = archived_epochs(GROUPS / "fewer_launches" / "runs.tar.gz")
    solo = sorted(r["seconds"] for s in (1, 2) for r in before[f"solo-seed{s}"])
    assert f"({solo[0]:.1f}-{solo[-1]:.1f} s in the call before" in gpus, solo
    old = archived_epochs(GROUPS / "captured" / "runs.tar.gz")
    assert "was " + " and ".join(f"{sum(old[f'group-seed{s}'][e]['seconds'] for s in range(1, 9)):.1f}" for e in (0, 1)) in gpus
    peaks = [max(r["peak_gpu_memory_bytes"] for name, rows in runs.items() if name.startswith(kind) for r in rows) / 2**30
             for kind in ("group-", "solo-")]
    assert f"group of 8 peaked at {peaks[0]:.2f} GiB of GPU memory, a solo run at {peaks[1]:.2f}" in gpus, peaks
