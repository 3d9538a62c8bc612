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
