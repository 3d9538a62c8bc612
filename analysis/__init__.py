"""Analyses of trained runs (docs/reference.md section 8): the [SB] Table 2 result tables, word similarity
of the learned embeddings, top-k next-word predictions and singular-value spectra, and the rest of [SB] (the Figure 2 correlation, the MoS sweeps of
Figures 5 and SM 6, the Press-rank robustness tables) against the paper's numbers, which live in
published.py. `report.py` at the repository root is the command line; each module here does
one analysis. (Running the experiments is launch/'s business.)
"""


class AnalysisError(Exception):
    """Bad input to an analysis; str(error) is one line naming the file or argument and the problem."""
