"""[SB] SM Table 2's top-5 contexts in the plans: the 18 PTB test contexts of the paper, in its
three groups and order, each the exact token sequence of the PTB test split at the place the paper
took it from (its "Reference #N" row continues the context there with the word given below).

The contexts were recovered from the supplementary material's text (layout artefacts undone:
"fran- cisco", "week’s", "corp. ’S") and located in the test split by a script kept with the
helper's notes; the positions below are its result, in the test token stream of the corpus loader
(each line's tokens, then <eos>), 0-based: the context is tokens start..end and the paper's next
word is token end + 1 (`report.py top5 --positions end` would predict it from the whole test
prefix; the plans feed each context as text from a zero hidden state).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from analysis.commands import build_parser
from data.corpus import tokenize
from launch.plans import load_plan
from launch.runs import plan_runs

TABLE2_PLAN = "sweeps/sb_table2_ptb.yaml"

# group (the --out name's word) -> per context in the paper's order: (start in the test stream,
# the test split's next word, which is the paper's Reference #N's).
SM_TABLE2 = {
    "yang": [(2662, "tons"), (21259, "a"), (81998, "african"), (425, "ual"), (82149, "conspiracy"),
             (63553, "subsidies")],                 # Yang et al. (2017)'s cherry-picked contexts
    "ours": [(32578, "states"), (36434, "bill"), (38836, "stocks"), (46154, "customers"),
             (54638, "incentives"), (57133, "workers")],    # [SB]'s own cherry-picked contexts
    "random": [(18710, "expected"), (28629, "centrust"), (48678, "usair"), (65193, "stake"),
               (41617, "rate"), (58501, "skills")],         # randomly selected contexts
}
# SM Table 2's rows of this repository's runs: the ET-ASGD runs with the authors' seeds (Table 2's
# plan), in the paper's order; MoS* and MoC* are the NT-ASGD runs of SM Tables 10/11's plan.
ET_RUNS = ["ptb-softmax-seed141", "ptb-ss-seed141", "ptb-gss-seed141", "ptb-plif-seed141",
           "ptb-mos-seed28", "ptb-moc-seed28"]


def top5_reports(plan_file: str) -> list:
    """The parsed report.py arguments of each top5 report of a plan (placeholders filled)."""
    plan = load_plan(plan_file)
    return [build_parser().parse_args(arguments) for arguments in plan.report_commands()
            if arguments[0] == "top5"]


def group_of(report) -> str:
    """The SM Table 2 group a top5 report's --out names (top5_<group>_contexts.md)."""
    name = Path(report.out).name
    groups = [g for g in SM_TABLE2 if name == f"top5_{g}_contexts.md"]
    assert len(groups) == 1, f"{report.out}: a top5 report's --out names its SM Table 2 group, one of {list(SM_TABLE2)}"
    return groups[0]


def plan_contexts() -> list[tuple[str, str, str]]:
    """(plan file, group, context) of every top5 report in sweeps/ (all of them read PTB runs)."""
    return [(str(plan), group_of(report), text) for plan in sorted(Path("sweeps").glob("*.yaml"))
            for report in top5_reports(str(plan)) for text in report.contexts]


def test_the_table2_plan_has_sm_table2s_18_contexts_in_the_papers_three_groups_and_runs():
    reports = top5_reports(TABLE2_PLAN)
    assert [group_of(r) for r in reports] == list(SM_TABLE2), "one report per group, in the paper's order"
    assert [len(r.contexts) for r in reports] == [6, 6, 6]
    contexts = [text for r in reports for text in r.contexts]
    assert len(set(contexts)) == 18
    assert all(not r.positions and r.k == 5 and not r.only for r in reports)
    # The columns: one run per SM Table 2 row, the authors' seed's (not 11 seeds of each head,
    # nor Table 3's LMS-PLIF†), each a run the plan trains.
    plan = load_plan(TABLE2_PLAN)
    planned = {run.dir for run in plan_runs(plan.experiments, plan.out, [], None, None)}
    for report in reports:
        assert [Path(d).name for d in report.runs] == ET_RUNS
        assert {Path(d) for d in report.runs} <= planned


def test_every_plans_top5_report_has_one_groups_contexts_in_the_papers_order_and_runs_it_trains():
    table2 = {group_of(r): r.contexts for r in top5_reports(TABLE2_PLAN)}
    for plan_file in sorted(Path("sweeps").glob("*.yaml")):
        plan = load_plan(plan_file)
        planned = {run.dir for run in plan_runs(plan.experiments, plan.out, [], None, None)}
        for report in top5_reports(str(plan_file)):
            assert report.contexts == table2[group_of(report)], (plan_file, report.out)
            assert {Path(d) for d in report.runs} <= planned, (plan_file, report.runs)


def test_every_top5_context_of_the_plans_is_the_ptb_test_split_at_the_papers_place(shared_data_dir):
    # As the corpus loader reads it: each line's tokens, then <eos>.
    vocab, [ids] = tokenize([shared_data_dir / "ptb" / "test.txt"])
    stream = [vocab[i] for i in ids]
    assert len(stream) == 82430                       # [SB] SM section 5.1: 82,430 test contexts
    starts: dict[str, list[int]] = {}
    for plan, group, text in plan_contexts():
        words = text.split()
        found = [i for i, w in enumerate(stream) if w == words[0] and stream[i:i + len(words)] == words]
        assert found, f"{plan} ({group}): not a contiguous token sequence of the PTB test split: {text!r}"
        assert len(found) == 1, f"{plan} ({group}): found {len(found)} times in the test split: {text!r}"
        start = found[0]
        if plan == TABLE2_PLAN:
            starts.setdefault(group, []).append(start)
        expected = dict(SM_TABLE2[group])
        assert start in expected, f"{plan} ({group}): at test position {start}, not one of the group's"
        assert stream[start + len(words)] == expected[start], (plan, group, text)
    assert starts == {group: [start for start, _ in rows] for group, rows in SM_TABLE2.items()}
