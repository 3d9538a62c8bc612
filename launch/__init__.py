"""Running experiments: processes, GPUs and Slurm (not analysis: that is analysis/).

    runs.py    planning seeds x grids into runs named by `run_name` (experiment/run_directory.py),
               and the one routine every launcher uses: train (or resume) -> evaluate -> rank,
               doing only what a run directory still lacks
    modes.py   the ways to run many: one after another, one per GPU, a Slurm job array
    stopping.py  SIGTERM, SIGINT and SIGHUP to the sweep passed on to every command it started

`sweep.py` at the repository root is the command line; `scripts/run_row.sh` (and the per-row
scripts) call it for one seed of one config.
"""


class LaunchError(Exception):
    """Bad input to a launcher; str(error) is one line naming the file or argument and the problem."""
