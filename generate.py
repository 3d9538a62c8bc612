"""Sample text from a trained model, word by word, as the AWD-LSTM repository's generate.py does.

    python generate.py runs/ptb-softmax-seed141                       # 1000 words from best.pt
    python generate.py runs/ptb-mos-seed28 --words 50 --temperature 0.8 --seed 7
    python generate.py runs/x/last.pt --out sample.txt                # a checkpoint file

The first word is drawn uniformly from the vocabulary; every next one from the model's
distribution p(w | history) sharpened by the temperature, p^(1/T) renormalised (T = 1: the
model's own; T -> 0: the most probable word). `<eos>` ends a line. The same checkpoint, seed and
options give the same text (on one device). Nothing is written into the run directory.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from experiment.cli import ArgumentParser, add_corpus_arguments, run_script, seed_argument, quiet_interrupt_while_starting

if __name__ == "__main__":        # (not when a test imports the script)
    quiet_interrupt_while_starting()   # before torch's import, which takes seconds: a Ctrl-C there is one line

import torch

from data import DataError
from experiment.checkpoint import CheckpointError, existing_checkpoint
from experiment.config import ConfigError
from experiment.loading import load_trained, select_device


def parse_args(argv=None):
    parser = ArgumentParser(prog="generate.py", description="Sample text from a trained model.")
    parser.add_argument("path", help="run directory (uses its best.pt) or checkpoint file")
    parser.add_argument("--words", type=int, default=1000, help="number of words to sample (1000)")
    parser.add_argument("--temperature", type=float, default=1.0,
                        help="> 0; below 1 the text keeps to likelier words (1.0)")
    parser.add_argument("--seed", type=seed_argument, default=1111, help="random seed of the sampler (1111)")
    parser.add_argument("--out", help="also write the text to this file")
    parser.add_argument("--device", default="cpu", help="cpu, mps, cuda, cuda:N or auto (cpu)")
    add_corpus_arguments(parser, "the run's own")
    return parser.parse_args(argv)


@torch.no_grad()
def sample(model, vocab: list[str], words: int, temperature: float, generator: torch.Generator) -> str:
    """`words` words from `model` (in eval mode), each drawn from p^(1/temperature)."""
    device = next(model.parameters()).device
    hidden = model.init_hidden(1)
    word = torch.randint(len(vocab), (1, 1), generator=generator, device=generator.device).to(device)
    out = []
    for _ in range(words):
        result = model(word, hidden)
        hidden = result.hidden
        # Measured from the most probable word, whose log-probability stays 0 at any temperature
        # > 0: dividing the raw ones by a tiny temperature sends them all to -inf (no
        # distribution left), this sends only the others there, so T -> 0 gives the argmax.
        log_probs = result.log_probs[-1, 0].double()
        weights = torch.softmax((log_probs - log_probs.max()) / temperature, dim=-1)
        word = torch.multinomial(weights.to(generator.device), 1, generator=generator).view(1, 1).to(device)
        token = vocab[word.item()]
        out.append("\n" if token == "<eos>" else token + " ")
    return "".join(out).replace(" \n", "\n")     # no space left at the end of a line


def check_writable(out: Path) -> None:
    """Refuse an --out that cannot be written before the sampling (minutes for many words on
    a CPU), not after it."""
    if out.is_dir():
        raise ConfigError(f"--out {out}: a folder; expected a file name")
    if not out.parent.is_dir():
        raise ConfigError(f"--out {out}: no folder {out.parent}")
    if not os.access(out.parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise ConfigError(f"--out {out}: not writable")


# What train.py, evaluate.py and rank.py write into a run directory: its checkpoints, config,
# metrics and results. An --out among them would replace one with the sample.
RUN_FILE_SUFFIXES = (".pt", ".yaml", ".jsonl", ".json")


def check_not_a_run_file(out: Path, checkpoint: Path) -> None:
    """Refuse an --out that names an existing file of the run directory sampled from (the
    checkpoint itself, its config, metrics or results): the text would replace it, and a
    checkpoint replaced is a training lost."""
    if out.is_file() and out.resolve().parent == checkpoint.resolve().parent and (
            out.suffix in RUN_FILE_SUFFIXES or out.resolve() == checkpoint.resolve()):
        raise ConfigError(f"--out {out}: a file of the run directory {checkpoint.parent}, which "
                          f"generate.py leaves as it is; give the sample a file name of its own")


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        if args.words < 1:
            raise ConfigError(f"--words: expected an integer >= 1, got {args.words}")
        if not (0 < args.temperature < float("inf")):
            raise ConfigError(f"--temperature: expected a finite number > 0, got {args.temperature}")
        if args.out:
            check_writable(Path(args.out))
            check_not_a_run_file(Path(args.out), existing_checkpoint(args.path))
        device = select_device(args.device, option="--device")
        run = load_trained(args.path, device, args.data_dir, allow_modified_corpus=args.allow_modified_corpus)
        # The sampler's stream lives on the CPU, so a seed gives the same words on any device
        # whose model computes the same distributions.
        generator = torch.Generator().manual_seed(args.seed)
        text = sample(run.model, run.corpus.vocab, args.words, args.temperature, generator)
    except (ConfigError, CheckpointError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = text.rstrip(" ")
    print(text)
    if args.out:
        try:
            Path(args.out).write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")
        except OSError as e:
            print(f"error: --out {args.out}: cannot write ({e.strerror})", file=sys.stderr)
            return 1                    # a failed write, as evaluate.py's and rank.py's: error_exit_code
    return 0


if __name__ == "__main__":
    run_script(main)
