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


# ---------------------------------------------------------------------- the third session's products
def way_tables(path: Path) -> list[tuple[str, str, list[str]]]:
    """bench_group.py's tables in a file, in order: (the products' way, the shape, 'x solo run')."""
    tables, way = [], None
    for line in path.read_text(encoding="utf-8").splitlines():
        if "the grouped LSTM's products:" in line:
            way = line.rsplit(": ", 1)[1]
        elif line.startswith(("mini (", "ptb (")):
            tables.append((way, line.split()[0], []))
        elif tables and re.match(r"\| \d+ \|", line):
            tables[-1][2].append(line.split("|")[3].strip())
    return tables


def loop_table(text: str, title: str) -> list[list[str]]:
    """The rows (cells after G) of the table that follows the line containing `title`."""
    lines = text[text.index(title):].splitlines()[3:]
    return [row.strip("| ").split(" | ")[1:] for row in lines[:4]]


def test_the_quoted_product_way_figures_are_the_committed_output():
    gpus = " ".join(section((REPO / "docs" / "gpus.md").read_text(encoding="utf-8"),
                            "### The time loops' products").split())
    first = way_tables(GROUPS / "product_ways" / "bench_group.txt")
    second = way_tables(GROUPS / "gate_split" / "bench_ptb.txt")
    third = way_tables(GROUPS / "by_shape" / "bench_group.txt")
    assert [t[:2] for t in first] == [("batched", "mini"), ("batched", "ptb"), ("per_member", "ptb")]
    assert [t[:2] for t in second] == [("gate_split", "ptb"), ("batched", "ptb"), ("per_member", "ptb")]
    assert [t[:2] for t in third] == [("by_shape", "mini"), ("by_shape", "ptb")]
    columns = [first[0][2], third[0][2], first[1][2], second[1][2], first[2][2], second[2][2], second[0][2], third[1][2]]
    for k, g in enumerate((1, 2, 4, 8, 16, 32)):
        cells = [c[k] if k < len(c) else "" for c in columns]
        assert ("| " + str(g) + " | " + " | ".join(cells) + " |").replace("  ", " ") in gpus, (g, cells)
    assert f"met in both readings** of this session, {first[0][2][4]} and {third[0][2][4]}" in gpus
    readme = " ".join(section((REPO / "README.md").read_text(encoding="utf-8"), "## On a GPU").split())
    fourth = way_tables(GROUPS / "splits" / "bench_group.txt")
    assert (f"one step of 16 miniature runs gave {first[0][2][4]}, {third[0][2][4]} and {fourth[0][2][4]} a solo "
            f"run's tokens/s (three readings), of 4 runs at PTB's full shapes {third[1][2][2]} and "
            f"{fourth[1][2][2]} (goal 2x: not met") in readme
    # The loops' products and the layers, PTB's shapes.
    profile = (GROUPS / "product_ways" / "profile.txt").read_text(encoding="utf-8")
    forward = loop_table(profile, "ptb (configs/ptb/softmax.yaml), the forward loop's product")
    backward = loop_table(profile, "ptb (configs/ptb/softmax.yaml), the backward loop's product")
    two = lambda rows, col: ", ".join(f"{float(r[col]):.2f}" for r in rows[:3]) + f" and {float(rows[3][col]):.2f}"
    assert f"took {two(forward, 0)} ms at G = 1, 2, 4, 8" in gpus
    assert f"(20 x 4600 by 4600 x 1150) {two(backward, 0)} batched, {two(backward, 2)} one per member" in gpus
    assert f"took {float(backward[1][0]) / float(backward[0][0]):.1f} times one member's" in gpus
    layers = profile[profile.index("| G | the group's recurrence"):].splitlines()[2:6]
    layers = [row.strip("| ").split(" | ")[1:] for row in layers]
    assert (f"the group's recurrence (batched products) {two(layers, 0)} at G = 1, 2, 4, 8; each member's "
            f"cuDNN LSTM one after another {two(layers, 1)}; the same on a CUDA stream each {two(layers, 2)}") in gpus
    # Where a step of 4 went, the plan as one group, the self-checks.
    assert "batched step of a group of 4 (configs/ptb/softmax.yaml): 63.4 ms" in profile
    ptb4 = profile[profile.index("a group of 4 (configs/ptb"):]
    backward_ms = profile_milliseconds_in(ptb4, "GroupedLSTMRecurrenceBackward")
    forward_ms = profile_milliseconds_in(ptb4, "GroupedLSTMRecurrence")
    assert f"63.4 ms a step, the LSTM loops' backward {backward_ms:.1f} ms and forward {forward_ms:.1f} ms" in gpus
    assert "272.6 ms" in (GROUPS / "product_ways" / "plan_steps.txt").read_text() and "62.0 ms (4.39x)" in \
        (GROUPS / "product_ways" / "plan_steps.txt").read_text()
    assert "272.6 ms for a solo step of each, one after another, against 62.0 ms (4.39x" in gpus
    assert (GROUPS / "product_ways" / "gpu_check.txt").read_text().strip().endswith("7 of 7 checks passed")
    for call in ("gate_split", "by_shape"):
        assert (GROUPS / call / "gpu_check.txt").read_text().strip().endswith("9 of 9 checks passed"), call
    assert ("passed 7 of 7 (first call: the batched and per-member ways) and `--only group` 9 of 9 (second "
            "and third, with the gate split)") in gpus
    overall = sorted(float(x) for call in ("gate_split", "by_shape") for x in re.findall(
        r"gradients ([\d.e+-]+) relative", (GROUPS / call / "gpu_check.txt").read_text()))
    worst = max(float(x) for call in ("gate_split", "by_shape") for x in re.findall(
        r"per parameter at most ([\d.e+-]+)", (GROUPS / call / "gpu_check.txt").read_text()))
    assert f"within {overall[0]:.1e} to {overall[-1]:.1e} of the solo step's" in gpus, overall
    assert f"`head.prior.weight` {worst:.1e}" in gpus, worst
    assert "after step 608" in (GROUPS / "product_ways" / "train_group8.txt").read_text()
    # The 2x at G = 4 arithmetic: 4 x 1,400 tokens at twice the solo run, against the default's step.
    default_g4 = int(re.search(r"^\| 4 \| ([\d,]+) \|.*\| ([\d,]+) \|$", (GROUPS / "by_shape" / "bench_group.txt").read_text()
                               .split("ptb (")[1], flags=re.M).group(1).replace(",", ""))
    assert f"at the default it takes {4 * 1400 / default_g4 * 1000:.0f} ms (4 x 1,400 / {default_g4:,} tokens/s)" in gpus


def profile_milliseconds_in(text: str, row: str) -> float:
    """One row's self CUDA time per step (of 5) in the first profile table of `text`."""
    line = next(x for x in text.splitlines() if x.strip().startswith(row + " "))
    return float(re.split(r"\s{2,}", line.strip())[6].removesuffix("ms")) / 5


# ---------------------------------------------------------------------- the fourth session's splits and Triton
def test_the_quoted_split_and_triton_figures_are_the_committed_output():
    gpus = " ".join(section((REPO / "docs" / "gpus.md").read_text(encoding="utf-8"),
                            "### Splitting the products further").split())
    splits = way_tables(GROUPS / "splits" / "bench_group.txt")
    assert [t[:2] for t in splits] == [("by_shape", "mini"), ("by_shape", "ptb"), ("batched", "ptb"),
                                       ("per_member", "ptb")]
    ptb_triton = way_tables(GROUPS / "triton" / "bench_ptb.txt")
    mini_triton = way_tables(GROUPS / "triton" / "bench_mini.txt")
    assert [t[:2] for t in ptb_triton + mini_triton] == [("triton", "ptb"), ("triton", "mini")]
    mini_rows = dict(zip((1, 4, 16), mini_triton[0][2]))
    columns = [splits[0][2], splits[1][2], splits[2][2], splits[3][2], ptb_triton[0][2]]
    for k, g in enumerate((1, 2, 4, 8, 16, 32)):
        cells = [c[k] if k < len(c) else "" for c in columns] + [mini_rows.get(g, "")]
        assert ("| " + str(g) + " | " + " | ".join(cells) + " |").replace("  ", " ") in gpus, (g, cells)
    readings = [way_tables(GROUPS / call / name)[0][2][4] for call, name in
                (("product_ways", "bench_group.txt"), ("by_shape", "bench_group.txt"), ("splits", "bench_group.txt"))]
    assert f"it now reads {readings[0]}, {readings[1]} and {readings[2]}: three of three at 8x or more" in gpus
    lowest = min(float(r.rstrip("x")) for r in readings)
    assert f"the lowest {100 * (lowest / 8 - 1):.1f}% above it" in gpus
    # The products at G = 4 in both calls (the fourth row of each table: batched, weights first, splits).
    for call, name in (("splits", "profile.txt"), ("triton", "products.txt")):
        text = (GROUPS / call / name).read_text(encoding="utf-8")
        for direction in ("forward", "backward"):
            row = loop_table(text, f"ptb (configs/ptb/softmax.yaml), the {direction} loop's product")[2]
            cells = [row[0], row[1], *row[3:6]]
            assert f"| {direction}, `{call}/` | " + " | ".join(cells) + " |" in gpus, (call, direction, cells)
    products = (GROUPS / "triton" / "products.txt").read_text(encoding="utf-8")
    forward = loop_table(products, "the forward loop's product")[2]
    backward = loop_table(products, "the backward loop's product")[2]
    triton_forward = [float(forward[k]) for k in (6, 8, 9, 10)]        # the tiles with the split by shape
    triton_backward = [float(backward[k]) for k in (6, 8, 9, 10)]
    cublas_forward = [float(forward[k]) for k in (0, 1, 3)]
    assert (f"Its forward product took {triton_forward[0]:.2f} ms a loop at G = 4 (the best of four tiles "
            f"{min(triton_forward):.1f}) against cuBLAS's {min(cublas_forward):.2f}-{max(cublas_forward):.2f}; its "
            f"backward {min(triton_backward):.2f}-{max(triton_backward):.2f} against {backward[4]} "
            "split by gate") in gpus
    first = loop_table((GROUPS / "splits" / "profile.txt").read_text(encoding="utf-8"), "the backward loop's product")[2]
    assert (f"split 8 ways beat the split by gate in the first call ({first[5]} against {first[4]} ms) and lost "
            f"in the second ({backward[5]} against {backward[4]})") in gpus
    # Where the default's step of 4 went, the layers, the plan, the self-checks and the 2 epochs.
    profile = (GROUPS / "splits" / "profile.txt").read_text(encoding="utf-8")
    ptb4 = profile[profile.index("a group of 4 (configs/ptb"):]
    assert "batched step of a group of 4 (configs/ptb/softmax.yaml): 50.8 ms" in profile
    busy = float(re.search(r"Self CUDA time total: ([\d.]+)ms", ptb4).group(1)) / 5
    assert (f"50.8 ms a step unprofiled, the GPU busy {busy:.1f} ms of it; the LSTM loops' backward "
            f"{profile_milliseconds_in(ptb4, 'GroupedLSTMRecurrenceBackward'):.1f} ms and forward "
            f"{profile_milliseconds_in(ptb4, 'GroupedLSTMRecurrence'):.1f} ms") in gpus
    assert f"`aten::bmm`) {profile_milliseconds_in(ptb4, 'aten::bmm'):.1f} ms" in gpus
    layers = profile[profile.index("| G | the group's recurrence"):].splitlines()[2:6]
    layers = [row.strip("| ").split(" | ")[1:] for row in layers]
    two = lambda col: ", ".join(r[col] for r in layers[:3]) + f" and {layers[3][col]}"
    assert (f"the group's recurrence {two(0)} at G = 1, 2, 4, 8; each member's cuDNN LSTM one after another "
            f"{two(1)}; the same on a CUDA stream each {two(2)}") in gpus
    assert f"takes {float(layers[2][0]) / float(layers[2][1]):.2f} of four cuDNN layers' time" in gpus
    plan = (GROUPS / "splits" / "plan_steps.txt").read_text()
    assert "210.8 ms for a step of every run; as one group: 45.0 ms (4.68x)" in plan
    assert "210.8 ms for a solo step of each, one after another, against 45.0 ms (4.68x" in gpus
    assert (GROUPS / "splits" / "gpu_check.txt").read_text().strip().endswith("10 of 10 checks passed")
    assert (GROUPS / "triton" / "gpu_check.txt").read_text().strip().endswith("12 of 12 checks passed")
    assert "passed 10 of 10 (`splits/`), `--only group` 12 of 12 with the Triton rows" in gpus
    runs = archived_epochs(GROUPS / "splits" / "runs.tar.gz")
    group = [runs[f"group-seed{s}"][0] for s in range(1, 9)]
    solo = runs["solo-seed1"][0]
    assert (f"seed 1's first validation perplexity was {group[0]['val_ppl']:.2f} in the group and "
            f"{solo['val_ppl']:.2f} alone") in gpus
    first_epoch = sum(r["seconds"] for r in group)
    assert (f"first epoch took {first_epoch:.1f} s for its 8 runs ({first_epoch / 8:.2f} s a run) against "
            f"{solo['seconds']:.2f} s for the solo run") in gpus
    assert "stopped: SIGTERM after step 1360" in (GROUPS / "splits" / "train_solo.txt").read_text()


def test_the_quoted_complete_two_epochs_are_the_committed_runs():
    gpus = " ".join(section((REPO / "docs" / "gpus.md").read_text(encoding="utf-8"),
                            "### Splitting the products further").split())
    runs = archived_epochs(GROUPS / "epochs_by_shape" / "runs.tar.gz")
    group = [runs[f"group-seed{s}"] for s in range(1, 9)]
    solo = [runs[f"solo-seed{s}"] for s in (1, 2)]
    totals = [sum(run[e]["seconds"] for run in group) for e in (0, 1)]
    assert (f"group's epochs took {totals[0]:.1f} and {totals[1]:.1f} s for its 8 runs ({totals[0] / 8:.2f} and "
            f"{totals[1] / 8:.2f} s a run) against the solo runs' {solo[0][0]['seconds']:.2f} and "
            f"{solo[1][0]['seconds']:.2f} s, then {solo[0][1]['seconds']:.2f} and {solo[1][1]['seconds']:.2f} s") in gpus
    per_run = [sum(r[e]["seconds"] for r in solo) / 2 / (totals[e] / 8) for e in (0, 1)]
    assert f"{per_run[0]:.1f} and {per_run[1]:.1f} times less time per run" in gpus
    for seed in (0, 1):
        for e in (0, 1):
            assert f"{group[seed][e]['val_ppl']:.2f}" == f"{solo[seed][e]['val_ppl']:.2f}"
    assert (f"({group[0][0]['val_ppl']:.2f} and {group[0][1]['val_ppl']:.2f}, {group[1][0]['val_ppl']:.2f} and "
            f"{group[1][1]['val_ppl']:.2f})") in gpus
    second = sorted((run[1]["seconds"], k + 1) for k, run in enumerate(group))
    assert second[-1][1] == 7
    assert (f"(seed 7, the last to finish: {second[-1][0]:.2f} s against {second[0][0]:.2f} to "
            f"{second[-2][0]:.2f} s for the others)") in gpus
    steps = [run[-1]["step"] for run in group]
    assert max(steps) == group[6][-1]["step"] and f"{max(steps) - min(steps)} steps apart" in gpus
    assert "19.3 ms/step" in (GROUPS / "epochs_by_shape" / "train_group8.txt").read_text()
