"""Streaming exact singular values (spectrum/) against numpy's dense SVD, on a log-P-like matrix.

    python benchmarks/bench_rank_decomposition.py [--rows 82430 --cols 10000] [--skip-numpy]
                                                  [--block-rows N] [--seed 0]

The default shape is about the PTB test log-P matrix's (82,430 rows, the test split's tokens: one more
than its 82,429 contexts, which rank.py ranks; x 10,000 words), float32 as in [SB].
Rows are log_softmax(l) of logits l = H W^T + b (a rank-400 linear model, as the Softmax head)
plus a small nonlinear term s * tanh(H2 W2^T) (H2 W2^T of rank 64). Its linear part alone would
give Press rank 402 + 64 = 466; its higher-order part is full rank with a bulk of singular values
that s places near the Press tolerance, so the two methods are compared where rounding could tip
the count. The tolerance grows relative to that bulk like sqrt(m + n), so s = 0.08 is meant to put
the Press rank well between 466 and n at the default shape (a rough extrapolation from 930 of
5,000 at 41,215 x 5,000 with s = 0.06; not measured at full size); small smoke shapes come out
nearly full.
The rows are generated reproducibly from the seed in fixed 1,024-row chunks, so the streaming side
never holds the whole matrix; numpy's side stacks the same chunks and calls
np.linalg.svd(A, compute_uv=False).

Each method runs in its own subprocess so that its peak RSS (getrusage ru_maxrss, which includes
the interpreter and imports) is its own. Reported per method: wall and CPU time of the
decomposition alone (matrix generation excluded), peak RSS, Press rank and effective ranks; then
the maximum difference of the two spectra relative to sigma_max. Output: a summary, then one
JSON line.

Target at the default shape: the streaming decomposition peaks at <= 2 GB and takes <= 0.5x
numpy's time, with the same Press rank (numpy: ~630 s and ~16.5 GB on the 2-core, 24 GiB
reference machine). A full run takes ~15 minutes. Time it on a quiet machine: with 2 cores, any
other busy process makes multithreaded BLAS/LAPACK wait at its thread barriers, and both wall and
CPU times then inflate erratically (up to 10x seen here, for either method).
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiment.cli import ArgumentParser, integer_at_least_1  # noqa: E402

GENERATION_CHUNK = 1024  # rows per generated chunk: fixes the matrix independently of block sizes
LINEAR_RANK = 400  # d_emb of the Softmax head: rank 402 log-P
NONLINEAR_RANK = 64
NONLINEAR_SCALE = 0.08


def model_parameters(cols: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """W (cols x 400), b (cols), W2 (cols x 64), drawn from the seed."""
    rng = np.random.default_rng([seed, 0])
    weight = rng.standard_normal((cols, LINEAR_RANK), dtype=np.float32)
    # Zipf-like unigram bias: frequent words get large logits, as a trained LM's bias does.
    bias = (-np.log(np.arange(1, cols + 1)) + rng.normal(0, 0.5, cols)).astype(np.float32)
    weight2 = rng.standard_normal((cols, NONLINEAR_RANK), dtype=np.float32)
    return weight, bias, weight2


def log_p_chunks(rows: int, cols: int, seed: int) -> Iterator[np.ndarray]:
    """The float32 log-P matrix, GENERATION_CHUNK rows at a time (the last chunk may be shorter)."""
    weight, bias, weight2 = model_parameters(cols, seed)
    for index, start in enumerate(range(0, rows, GENERATION_CHUNK)):
        count = min(GENERATION_CHUNK, rows - start)
        rng = np.random.default_rng([seed, 1, index])
        # Scales give logits with std ~3 around the bias, like a trained model's.
        hidden = rng.standard_normal((count, LINEAR_RANK), dtype=np.float32)
        hidden *= 3 / LINEAR_RANK**0.5
        hidden2 = rng.standard_normal((count, NONLINEAR_RANK), dtype=np.float32)
        hidden2 /= NONLINEAR_RANK**0.5
        logits = hidden @ weight.T + bias + NONLINEAR_SCALE * np.tanh(hidden2 @ weight2.T)
        logits -= logits.max(axis=1, keepdims=True)
        logits -= np.log(np.exp(logits).sum(axis=1, keepdims=True))
        yield logits


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


class Stopwatch:
    """Accumulates wall and CPU time over the `with` blocks it is used in."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0

    def __enter__(self) -> "Stopwatch":
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall += time.perf_counter() - self._wall
        self.cpu += time.process_time() - self._cpu


def run_numpy(args: argparse.Namespace) -> tuple[np.ndarray, Stopwatch]:
    matrix = np.empty((args.rows, args.cols), dtype=np.float32)
    start = 0
    for chunk in log_p_chunks(args.rows, args.cols, args.seed):
        matrix[start : start + chunk.shape[0]] = chunk
        start += chunk.shape[0]
    clock = Stopwatch()
    with clock:
        values = np.linalg.svd(matrix, compute_uv=False)
    return values, clock


def run_streaming(args: argparse.Namespace) -> tuple[np.ndarray, Stopwatch]:
    from spectrum import StreamingSingularValues

    clock = Stopwatch()
    with clock:
        stream = StreamingSingularValues(args.cols, dtype=np.float32, block_rows=args.block_rows)
    for chunk in log_p_chunks(args.rows, args.cols, args.seed):
        with clock:
            stream.update(chunk)
    with clock:
        values = stream.singular_values()
    return values, clock


def worker(args: argparse.Namespace) -> None:
    """Run one method, save its singular values to args.out, print one JSON line."""
    run = run_numpy if args.worker == "numpy" else run_streaming
    values, clock = run(args)
    np.save(args.out, np.asarray(values, dtype=np.float64))
    stats = {"wall_s": clock.wall, "cpu_s": clock.cpu, "peak_rss_bytes": peak_rss_bytes()}
    print(json.dumps(stats))


def launch(method: str, args: argparse.Namespace, folder: Path) -> tuple[dict, np.ndarray]:
    out = folder / f"{method}.npy"
    command = [sys.executable, __file__, "--worker", method, "--out", str(out),
               "--rows", str(args.rows), "--cols", str(args.cols), "--seed", str(args.seed)]
    if args.block_rows is not None:
        command += ["--block-rows", str(args.block_rows)]
    done = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True)  # stderr shown
    return json.loads(done.stdout.strip().splitlines()[-1]), np.load(out)


def main() -> None:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=integer_at_least_1, default=82_430)
    parser.add_argument("--cols", type=integer_at_least_1, default=10_000)
    parser.add_argument("--block-rows", type=integer_at_least_1, default=None,
                        help="rows per R update of the streaming method (library default if unset)")
    parser.add_argument("--skip-numpy", action="store_true", help="run the streaming method only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--worker", choices=["numpy", "streaming"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    from spectrum import rank_summary

    shape = (args.rows, args.cols)
    methods = ["streaming"] + ([] if args.skip_numpy else ["numpy"])
    results: dict[str, dict] = {}
    spectra: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as folder:
        for method in methods:
            stats, spectra[method] = launch(method, args, Path(folder))
            results[method] = {**stats, **rank_summary(spectra[method], shape, np.float32)}

    print(f"log-P-like float32 matrix {args.rows:,} x {args.cols:,} (seed {args.seed}), "
          f"streaming block_rows={args.block_rows or 'default'}")
    for method, r in results.items():
        print(f"  {method:9s}  wall {r['wall_s']:8.1f} s  cpu {r['cpu_s']:8.1f} s  "
              f"peak RSS {r['peak_rss_bytes'] / 2**30:6.2f} GiB  Press rank {r['press_rank']:,}  "
              f"effective ranks {list(r['effective_rank'].values())}")
    summary = {"rows": args.rows, "cols": args.cols, "block_rows": args.block_rows,
               "seed": args.seed, "methods": results}
    if "numpy" in results:
        stream, dense = spectra["streaming"], spectra["numpy"]
        summary["time_ratio"] = results["streaming"]["wall_s"] / results["numpy"]["wall_s"]
        summary["cpu_ratio"] = results["streaming"]["cpu_s"] / results["numpy"]["cpu_s"]
        summary["max_rel_diff"] = float(np.abs(stream - dense).max() / dense[0])
        summary["same_press_rank"] = (results["streaming"]["press_rank"]
                                      == results["numpy"]["press_rank"])
        print(f"  streaming / numpy: wall {summary['time_ratio']:.2f}x, "
              f"cpu {summary['cpu_ratio']:.2f}x; "
              f"max |sigma_stream - sigma_numpy| / sigma_max = {summary['max_rel_diff']:.2e}; "
              f"same Press rank: {summary['same_press_rank']}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
