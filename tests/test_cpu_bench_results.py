"""The CPU pair figures docs/benchmarks.md quotes are those of the committed raw output
(results/cpu_group_bench/), so a re-measurement cannot leave the page behind."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RAW = REPO / "results" / "cpu_group_bench"
SUMMARY = re.compile(r"CPU pair \(.*?, (\d+) rounds\), (side by side|one after another): ([\d.]+)x .*?"
                     r"\(median; ([\d.]+)-([\d.]+)x;")


def cpu_pair_row() -> str:
    text = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    return next(line for line in text.splitlines() if line.startswith("| group runs on the CPU, the CPU pair"))


def test_every_cpu_pair_file_is_quoted_with_its_medians_and_ranges():
    row = cpu_pair_row()
    files = sorted(RAW.glob("cpu_pair*.txt"))
    assert len(files) >= 2
    for path in files:
        summaries = SUMMARY.findall(path.read_text(encoding="utf-8"))
        assert {kind for _, kind, *_ in summaries} == {"side by side", "one after another"}, path
        assert path.name in row or path.name == "cpu_pair.txt", f"{path.name} is not named in benchmarks.md"
        for rounds, kind, median, low, high in summaries:
            quoted = (f"{median}x (median; {low}-{high}x)" if int(rounds) > 3
                      else f"{median}x ({low}-{high}x")
            assert quoted in row, (path.name, kind, quoted)
            assert f"{rounds} rounds" in row, (path.name, rounds)
