"""Tables and figures from run directories (docs/reference.md section 8).

    python report.py table runs/ptb runs/wt2 --out results/table2           # [SB] Table 2: .md + .csv
    python report.py table runs/table5 --paper table5 --out results/table5  # an [SB] table's layout + its numbers
    python report.py wordsim runs/ptb --out results/wordsim --by-head   # benchmarks: <data dir>/word-similarity/
    python report.py top5 runs/ptb/ptb-softmax-seed141 runs/ptb/ptb-mos-seed141 \
        --positions 10 200 --contexts "the stock market"
    python report.py spectra runs/ptb/*-seed141 --out results/spectra_ptb.png
    python report.py correlation runs/gss_grid --out results/figure2         # [SB] Figure 2, Pearson r
    python report.py capacity runs/mos_k --out results/figure6            # [SB] Figure 6
    python report.py mos-rank runs/mos_k runs/mos_dropoutl --out results/figure5   # [SB] Figure 5
    python report.py robustness runs/ptb-mos-seed28 --out results/sm_tables14-16   # after rank.py --robustness
    python report.py published --out docs/published.md                        # the paper's numbers
    python report.py curves results/cpu_ptb --out results/cpu_ptb/report/curves  # valid ppl by epoch
    python report.py versus results/cpu_ptb --key model.emsize --out results/cpu_ptb/report/d_sweep
    python report.py methods results/cpu_ptb --out results/cpu_ptb/report/methods  # plain/cache/dynamic
    python report.py diagnose runs/ptb-moc-seed28 runs/ptb-softmax-seed141   # a run that did not learn

A RUN argument is a run directory or a folder searched for run directories. Each command writes
its files under the --out prefix (PREFIX.md, and PREFIX.png / PREFIX.csv as it says) and prints
the Markdown. The paper's numbers drawn and printed beside the measured ones are those of
analysis/published.py. The subcommands are the table in analysis/commands.py.
"""
from __future__ import annotations

import sys

from experiment.cli import run_script, quiet_interrupt_while_starting

if __name__ == "__main__":        # (not when a test imports the script)
    quiet_interrupt_while_starting()   # before torch's import, which takes seconds: a Ctrl-C there is one line

from analysis import AnalysisError
from analysis.commands import build_parser, run
from data import DataError
from experiment.checkpoint import CheckpointError
from experiment.config import ConfigError


def parse_args(argv=None):
    return build_parser().parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        print(run(args))
    except (AnalysisError, ConfigError, CheckpointError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    run_script(main)
