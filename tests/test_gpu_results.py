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


def test_the_quoted_group_run_figures_are_the_committed_output():
    gpus = section((REPO / "docs" / "gpus.md").read_text(encoding="utf-8"), "## Group runs")
    eager, captured = bench_ratios(GROUPS / "eager" / "bench_group.txt"), bench_ratios(GROUPS / "captured" / "bench_group.txt")
    rows = [f"| {g} | {eager['mini'][k]} | {captured['mini'][k]} | "
            + (f"{eager['ptb'][k]} | {captured['ptb'][k]} |" if k < 4 else "| |")
            for k, g in enumerate((1, 2, 4, 8, 16, 32))]
    for row in rows:
        assert row in gpus, row
    assert "4 of 4 checks passed" in (GROUPS / "captured" / "gpu_check.txt").read_text(encoding="utf-8")
    assert "[FAILED] group mos" in (GROUPS / "eager" / "gpu_check.txt").read_text(encoding="utf-8")
    plan = (GROUPS / "captured" / "plan_steps.txt").read_text(encoding="utf-8")
    assert "194.6 ms" in plan and "62.1 ms (3.13x)" in plan and "194.6 ms" in gpus and "3.13x" in gpus
    assert "38.5 ms (median of 5)" in (GROUPS / "captured" / "profile.txt").read_text(encoding="utf-8")
    # 2 epochs: the group's validation perplexities beside the solo runs', and the epoch sums.
    runs = archived_epochs(GROUPS / "captured" / "runs.tar.gz")
    for seed in (1, 2):
        pair = [f"{runs[f'{kind}-seed{seed}'][-1]['val_ppl']:.2f}" for kind in ("group", "solo")]
        assert f"{pair[0]} and {pair[1]}" in gpus, pair
    finals = sorted(runs[f"group-seed{s}"][-1]["val_ppl"] for s in range(1, 9))
    assert f"from {finals[0]:.2f} to {finals[-1]:.2f}" in gpus
    runs.update(archived_epochs(GROUPS / "epochs" / "runs_g2_g4.tar.gz"))
    for prefix, size in (("group-seed", 8), ("g4-seed", 4), ("g2-seed", 2)):
        sums = [f"{sum(runs[f'{prefix}{s}'][e]['seconds'] for s in range(1, size + 1)):.1f}" for e in (0, 1)]
        assert f"{sums[0]} and {sums[1]} s" in gpus, (prefix, sums)
    peaks = {prefix: max(r["peak_gpu_memory_bytes"] for name, rows in runs.items() if name.startswith(prefix)
                         for r in rows) / 2**30 for prefix in ("group-", "g4-", "g2-", "solo-")}
    assert (f"group of 8 peaked at {peaks['group-']:.2f} GiB of GPU memory, of 4 at {peaks['g4-']:.2f}, "
            f"of 2 at {peaks['g2-']:.2f}, a solo run at {peaks['solo-']:.2f}") in " ".join(gpus.split()), peaks
