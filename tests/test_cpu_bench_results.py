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


ROUND = re.compile(r"side by side: [\d,]+ \(([\d.]+)x\); a group of 2 at 2 threads, one after another: [\d,]+ \(([\d.]+)x\)")


def test_the_later_measurements_pooled_and_round_by_round_are_as_quoted():
    """The files after the first (the step's code unchanged between them): the medians over all
    their rounds, how many side-by-side rounds reach the goal, and in how many rounds of each file
    one after another was ahead of or behind side by side, as the row says."""
    import statistics
    row = cpu_pair_row()
    later = [p for p in sorted(RAW.glob("cpu_pair_*_rounds.txt"), key=lambda p: int(p.name.split("_")[2]))]
    rounds = {p.name: [(float(a), float(b)) for a, b in ROUND.findall(p.read_text(encoding="utf-8"))] for p in later}
    pooled = [r for file_rounds in rounds.values() for r in file_rounds]
    side, after = (statistics.median(r[i] for r in pooled) for i in (0, 1))
    reached = sum(r[0] >= 0.90 for r in pooled)
    assert (f"Over the {len(pooled)} rounds of the two, the medians are {side:.2f}x (side by side; "
            f"{reached} of the {len(pooled)} rounds at 0.90x or more) and {after:.2f}x") in row
    first, second = rounds.values()
    assert f"ahead of side by side in {sum(b > a for a, b in first)} of the {len(first)} rounds of the first" in row
    assert f"behind in {sum(b < a for a, b in second)} of the {len(second)} of the second" in row


TRAINING_ROUND = re.compile(r"at once: ([\d,]+) tokens/s; train\.py --group of the two at 2 threads: [\d,]+ \(([\d.]+)x\)")


def test_the_training_pair_row_quotes_every_round_of_its_files():
    """bench_group.py --cpu-pair-training's files: each round's ratio, in order, and for the
    committed code's file the two processes' range and how many rounds reach the goal, as the row
    quotes them; stepping ahead against meeting at every step, round by round, as it says."""
    text = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| group runs on the CPU, in training"))
    files = {p.name: TRAINING_ROUND.findall(p.read_text(encoding="utf-8")) for p in sorted(RAW.glob("training_pair_*.txt"))}
    assert sorted(files) == ["training_pair_ahead.txt", "training_pair_lockstep.txt", "training_pair_many_arenas.txt",
                             "training_pair_one_arena_ahead.txt", "training_pair_one_arena_lockstep.txt",
                             "training_pair_one_heap_for_groups.txt"]
    for name, rounds in files.items():
        assert len(rounds) == (8 if name == "training_pair_one_arena_lockstep.txt" else 4), name
        ratios = ", ".join(f"{ratio}x" for _, ratio in rounds)
        assert f"`{name}`" in row and f"{ratios}" in row, (name, ratios)
    committed = files["training_pair_one_heap_for_groups.txt"]
    two = sorted(int(tokens.replace(",", "")) for tokens, _ in committed)
    assert "(`training_pair_one_heap_for_groups.txt`, commit 70b39e9, the twenty-third sitting" in row
    assert f"(the two processes {two[0]:,}-{two[-1]:,} tokens/s)" in row
    below = sum(float(ratio) < 0.90 for _, ratio in committed)
    assert (f"the 0.90x goal is met in all 4 rounds of the committed code" if below == 0 else
            f"below the 0.90x goal in {below} of the 4 rounds of the committed code") in row
    interleaved = files["training_pair_one_arena_lockstep.txt"][4:]
    ahead = sum(float(a) > float(b) for (_, a), (_, b) in zip(files["training_pair_one_arena_ahead.txt"], interleaved))
    assert f"above that in {ahead} of the 4 rounds interleaved with it" in row
