"""A group run: several runs trained in lockstep by one process (train.py --group).

    python train.py --group configs/ptb_mini/softmax.yaml configs/ptb_mini/mos.yaml
    python train.py --group "configs/ptb_mini/softmax.yaml train.seed=2" "configs/ptb_mini/softmax.yaml train.seed=3"
    python train.py --group "--resume runs/a" "--resume runs/b"       # continue a group (or runs alone)

Each member is what train.py would be given for that run alone (a config and its overrides,
--resume RUN_DIR or --finetune RUN_DIR), so each writes the run directory its solo run writes,
and evaluate.py, rank.py, report.py and train.py --resume read it unchanged. The members must
share the body's shapes and the batch layout (`SHARED_KEYS`); heads, seeds, learning rates,
dropout and ASGD settings are each run's own.

What a group guarantees: every member draws its random numbers from its own stream
(model/random_stream.py) in the order its solo run draws them, keeps its own sequence lengths
and data position, and takes its own clipping, SGD / averaged SGD step, validation, NT-ASGD
switch, best.pt / last.pt, metrics.jsonl and early stop: it trains as its solo run does (to
float rounding: the batched body sums in another order than cuDNN). A member that finishes or
stops (its epochs, an early stop, run.max_steps, a non-finite value) leaves and the others go
on; how it ended is printed and written to its run directory's group_exit.json as it leaves
(removed when the run next starts, in a group or alone), and run.json lists the groups it was
trained in.

How a step is computed (--group-step):
  batched  one pass of all the bodies together (model/group.py: batched products over the
           group, a hand-written LSTM backward), the heads of a class with a batched form
           (Softmax) as one product, every member's AR/TAR, loss and clipping together, each
           member's other head and its SGD / averaged SGD step on its own: where a GPU gains (the
           default on CUDA), whose step is set by how many kernels the host launches.
  solo     each member's own step, with the kernels of its solo run; on a CPU with several
           threads, members side by side in threads of one core each: where the batched body
           gains nothing (the default off CUDA). Identical maths to the solo run.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import shlex
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from data.corpus import resolve_data_dir
from model import count_parameters
from model.group import grouped_forward, on_device, padded, stacked
from model.random_stream import RandomStream
from .averaged_sgd import step_optimizers
from .distributed import World
from .loading import one_heap_for_every_thread
from .progress import TrainingProgress
from .run_directory import GROUP_EXIT, RunDirectoryError, error_exit_code, write_text_atomic
from .training_run import SETUP_ERRORS, check_new_run_dir, prepare_run, report_start, resolve_run

# A CPU group's members meet when each has read about this many steps' text (train.steps_ahead):
# rarely enough that waiting for each other costs little, often enough that a member whose epoch
# ended (to validate) waits for the others at most that many steps. A signal stops each at once.
STEPS_AHEAD = 20

# What every member of a group must share: the bodies are computed together (shapes, batch
# layout, the one device) and the process-wide numerics settings apply to all.
SHARED_KEYS = ("data.dataset", "model.emsize", "model.nhid", "model.nhidlast", "model.nlayers",
               "train.batch_size", "train.small_batch_size", "train.bptt", "train.eval_batch_size",
               "train.test_batch_size", "run.tf32", "run.deterministic")

class GroupRefused(Exception):
    """A group that cannot start; one line, and nothing has been written."""


def parse_member(text: str, index: int) -> argparse.Namespace:
    """One member: what train.py takes for a run alone (train.py's own argument names)."""
    where = f"--group member {index + 1} ({text!r})"
    try:
        words = shlex.split(text)
    except ValueError as e:
        raise GroupRefused(f"{where}: {e}") from None
    args = argparse.Namespace(config=None, overrides=[], resume=None, finetune=None, dry_run=False)
    if not words:
        raise GroupRefused(f"{where}: empty; expected a config file and overrides, --resume RUN_DIR "
                           f"or --finetune RUN_DIR")
    if words[0] in ("--resume", "--finetune"):
        if len(words) < 2:
            raise GroupRefused(f"{where}: {words[0]} needs a run directory")
        setattr(args, words[0][2:], words[1])
        args.overrides = words[2:]
    elif words[0].startswith("-"):
        raise GroupRefused(f"{where}: {words[0]}: a member takes a config and key=value overrides, "
                           f"--resume RUN_DIR or --finetune RUN_DIR{beside_group(words[0])}")
    else:
        args.config, args.overrides = words[0], words[1:]
        if "=" in args.config and not args.config.endswith((".yaml", ".yml")):
            # The shell split an unquoted member: its overrides arrived as members of their own.
            raise GroupRefused(f"{where}: a key=value override, not a config file; each run is one quoted "
                               f"argument: --group \"CONFIG KEY=VALUE ...\" \"CONFIG KEY=VALUE ...\"")
    flags = [w for w in args.overrides if w.startswith("-")]
    if flags:
        raise GroupRefused(f"{where}: {flags[0]}: a member takes a config and key=value overrides, "
                           f"--resume RUN_DIR or --finetune RUN_DIR{beside_group(flags[0])}")
    return args


def beside_group(flag: str) -> str:
    """Where a train.py option given inside a member belongs: --data-dir, --dry-run and
    --group-step act on the whole group, given beside --group."""
    name = flag.partition("=")[0]
    return (f" ({name} is the group's: give it beside --group)"
            if name in ("--data-dir", "--dry-run", "--group-step") else "")


def shared_value(config, key: str):
    section, name = key.split(".")
    return config.small_batch_size if key == "train.small_batch_size" else getattr(getattr(config, section), name)


def check_group(resolved: list, devices: list) -> None:
    """GroupRefused unless the runs can train together: distinct run directories, none
    finished, the shared keys, the device and the corpus folder equal."""
    dirs = {}                               # run directory -> the member (from 1) that trains there
    for number, (config, run_dir, ckpt) in enumerate(resolved, 1):
        key = run_dir.resolve()
        if key in dirs:
            raise GroupRefused(f"--group: members {dirs[key]} and {number} both train in {run_dir}; "
                               f"give each run its own run.dir")
        dirs[key] = number
        if ckpt is not None and TrainingProgress.from_dict(ckpt["progress"]).finished:
            raise GroupRefused(f"--group: {run_dir} has already finished training (last.pt: epoch "
                               f"{ckpt['progress']['epoch'] - 1} done); leave it out of the group")
        if ckpt is None and run_dir.is_dir():
            try:
                check_new_run_dir(run_dir)
            except RunDirectoryError as e:
                raise GroupRefused(str(e)) from None
    first = resolved[0][0]
    for (config, run_dir, _), device in zip(resolved[1:], devices[1:]):
        for key in SHARED_KEYS:
            if shared_value(config, key) != shared_value(first, key):
                raise GroupRefused(f"--group: {key} is {shared_value(first, key)!r} for "
                                   f"{resolved[0][1]} but {shared_value(config, key)!r} for {run_dir}; "
                                   f"a group's runs share {', '.join(SHARED_KEYS)} and the device")
        if device != devices[0]:
            raise GroupRefused(f"--group: run.device gives {devices[0]} for {resolved[0][1]} but "
                               f"{device} for {run_dir}; a group trains on one device")
        if corpus_folder(config) != corpus_folder(first):
            raise GroupRefused(f"--group: the corpus is {corpus_folder(first)} for {resolved[0][1]} but "
                               f"{corpus_folder(config)} for {run_dir} (data.data_dir, else $AWD_DATA_DIR); "
                               f"a group's runs read one corpus")


def group_key(config) -> tuple:
    """What runs that can train together have equal (sweep.py --group sorts a plan's runs by it)."""
    return (*(shared_value(config, k) for k in SHARED_KEYS), corpus_folder(config), config.run.device)


def corpus_folder(config) -> Path:
    """The folder a run reads its corpus from: the members' batches and vocabulary are computed
    together, so two folders (a slice and the full corpus, say) cannot share a group."""
    return (resolve_data_dir(config.data.data_dir) / config.data.dataset).resolve()


def resolve_members(members: list[str]) -> tuple[list, list, torch.device]:
    """Each member's arguments and (config, run directory, last.pt when resuming), checked
    as a group, and the group's device; nothing is written."""
    from .loading import select_device
    parsed = [parse_member(text, i) for i, text in enumerate(members)]
    resolved, devices = [], []
    for index, (args, text) in enumerate(zip(parsed, members)):
        try:                          # a bad key or value: which member has it
            resolved.append(resolve_run(args))
            devices.append(select_device(resolved[-1][0].run.device))
        except SETUP_ERRORS as e:
            raise GroupRefused(f"--group member {index + 1} ({text!r}): {e}") from None
    if problem := started_before(members, parsed, resolved):
        raise GroupRefused(problem)
    check_group(resolved, devices)
    return parsed, resolved, devices[0]


def runs(count: int) -> str:
    return f"{count} run" + ("" if count == 1 else "s")


def step_kind(choice: str, device: torch.device) -> str:
    if choice == "auto":
        return "batched" if device.type == "cuda" else "solo"
    return choice


# ---------------------------------------------------------------------- a group's step
def batched_steps(trainers: list) -> list:
    """One step of every member (train.py's step 1-3), the bodies computed together: per column
    chunk, each member's random numbers for its body from its own stream, one batched pass of the
    bodies, the heads and losses (`grouped_losses`), one backward; then every member's update
    (`batched_update`), its checks read at one device sync for the whole group."""
    from train import TrainingStopped, detach
    batches = [t.begin_step() for t in trainers]
    totals = 0
    for c, (start, end) in enumerate(trainers[0].chunks):
        draws = []
        for t, batch in zip(trainers, batches):
            with t.random_stream:
                draws.append(t.model.body.draw_random(batch.inputs.size(0), end - start))
        bodies = grouped_forward([t.model.body for t in trainers], [b.inputs[:, start:end] for b in batches],
                                 [detach(t.progress.hidden[c]) for t in trainers], draws)
        nll, loss = grouped_losses([t.model for t in trainers], bodies, [b.targets[:, start:end] for b in batches],
                                   [t.random_stream for t in trainers],
                                   [(t.config.train.alpha, t.config.train.beta) for t in trainers])
        weight = (end - start) / trainers[0].config.train.batch_size    # the chunk's share (the same for all)
        (loss.sum() * weight).backward()
        totals = totals + torch.stack([nll.detach(), loss.detach()], dim=1) * weight   # (G, 2)
        for k, t in enumerate(trainers):
            t.progress.hidden[c] = bodies.member(k).hidden
    checks = batched_update(trainers, totals)
    results = []
    for t, batch, own in zip(trainers, batches, checks):
        t.stop_signal = t.signals.received
        try:
            results.append(t.end_step(own, batch))
        except TrainingStopped as e:
            results.append(e)
    return results


def grouped_losses(models: list, bodies, targets: list, streams: list, regularizers: list):
    """Each member's mean NLL and its loss NLL + AR + TAR (train.regularized_loss), as two (G,)
    tensors, from the group's bodies (model/group.py's GroupedBodies), each member's targets
    (T_g, B), random stream and (alpha, beta). Members whose head class has a batched form
    (`OutputHead.grouped_target_log_probs`) are computed together, one batch per class; every
    other member's head runs on its own, in its own stream. AR and TAR, over each member's own
    steps, are computed for all members at once."""
    members, steps = bodies.output.shape[:2]
    device, dtype = bodies.output.device, bodies.output.dtype
    valid = bodies.valid()                                                               # (G, T)
    # Per member: alpha, beta, and the number of entries each mean is over (one copy to the device).
    batch, width = bodies.output.size(2), bodies.output.size(3)
    constants = on_device([[a, b, n * batch, n * batch * width, (n - 1) * batch * width]
                           for (a, b), n in zip(regularizers, bodies.lengths)], device, dtype)
    alpha, beta, positions, entries, differences = constants.unbind(1)
    pieces = []                                    # (members, their NLLs), one piece per batch or member
    by_class: dict[type, list[int]] = {}
    for k, model in enumerate(models):
        by_class.setdefault(type(model.head), []).append(k)
    for cls, index in by_class.items():
        every = index == list(range(members))
        rows = None if every else on_device(index, device)
        pick = (lambda x: x) if every else (lambda x: x.index_select(0, rows))
        heads = [models[k].head for k in index]
        tied = all(models[k].head.decoder.weight is models[k].body.encoder.weight for k in index)
        weights = pick(bodies.embedding) if tied else stacked([h.decoder.weight for h in heads])
        picked = cls.grouped_target_log_probs(heads, pick(bodies.output), padded(targets if every else
                                              [targets[k] for k in index], steps), weights)
        if picked is not None:
            pieces.append((index, -(picked * pick(valid)[:, :, None]).sum((1, 2)) / pick(positions)))
            continue
        for k in index:
            with streams[k]:
                own = models[k].head.target_log_probs(bodies.member(k).output, targets[k])
            pieces.append(([k], -own.mean().reshape(1)))
    if len(pieces) == 1:
        nll = pieces[0][1]
    else:                                          # back into the members' order
        order = [k for index, _ in pieces for k in index]
        where = on_device(sorted(range(members), key=order.__getitem__), device)   # member k's place
        nll = torch.cat([values for _, values in pieces])[where]
    ar = (bodies.output.square() * valid[:, :, None, None]).sum((1, 2, 3)) / entries
    change = (bodies.raw[:, 1:] - bodies.raw[:, :-1]).square() * valid[:, 1:, None, None]
    tar = change.sum((1, 2, 3)) / differences
    return nll, nll + alpha * ar + beta * tar


def batched_update(trainers: list, totals: torch.Tensor) -> list[list[float]]:
    """Step 3 of every member up to its checks (Trainer.update's, for all at once): each one's
    gradient norm and clipping (clip_grad_norm_'s maths), its own SGD / averaged SGD step, and its
    checks (its step's NLL and loss from `totals` (G, 2), the gradient norm, every weight's
    `extremes`), read at one device sync; each member's checks as Trainer.end_step takes them."""
    from train import extremes
    grads = [[p.grad for p in t.params if p.grad is not None] for t in trainers]
    flat = [g for own in grads for g in own]
    device, dtype = flat[0].device, flat[0].dtype
    owner = on_device([k for k, own in enumerate(grads) for _ in own], device)
    squares = torch.stack(torch._foreach_norm(flat)).square()
    norms = squares.new_zeros(len(trainers)).index_add_(0, owner, squares).sqrt()       # (G,)
    clips = [t.config.train.clip for t in trainers]
    if any(clips):
        limits = on_device([c if c > 0 else math.inf for c in clips], device, dtype)
        scale = (limits / (norms + 1e-6)).clamp(max=1.0)
        for k, (own, clip) in enumerate(zip(grads, clips)):
            if clip > 0:
                torch._foreach_mul_(own, scale[k])
    step_optimizers([t.optimizer for t in trainers])
    params = [p for t in trainers for p in t.params]
    weights = extremes(params)
    per_weight = weights.numel() // len(params)
    values = torch.cat([totals.flatten(), norms, weights]).tolist()
    members = len(trainers)
    checks, offset = [], 3 * members
    for k, t in enumerate(trainers):
        count = per_weight * len(t.params)
        checks.append([*values[2 * k: 2 * k + 2], values[2 * members + k], *values[offset: offset + count]])
        offset += count
    return checks


class SideBySide:
    """Each member's own solo step, members in threads of one core each (a CPU's cores, which
    one small model's step cannot keep busy): as many threads as torch has, their intra-op
    parallelism shared out among the members running. With `ahead` > 1 (train.py --group on a
    CPU), each member reads about that many steps' text before the members meet
    (train.steps_ahead): its own steps, the same numbers, without waiting at every step for the
    member with the longer step."""

    def __init__(self, threads: int, ahead: int = 1):
        self.threads, self.ahead = threads, ahead
        self.pool = ThreadPoolExecutor(max_workers=threads) if threads > 1 else None

    def __call__(self, trainers: list) -> list:
        from train import steps_ahead, steps_one_by_one
        if self.pool is None:
            return steps_one_by_one(trainers)
        share = max(1, self.threads // len(trainers))

        def step(trainer):
            # Per thread: OpenMP's thread count is each thread's own setting, and a worker left
            # at the default would run every operation on all the cores, against the others.
            torch.set_num_threads(share)
            if self.ahead > 1:
                return steps_ahead(trainer, self.ahead)
            return steps_one_by_one([trainer])[0]
        return list(self.pool.map(step, trainers))

    def close(self) -> None:
        torch.set_num_threads(self.threads)
        if self.pool is not None:
            self.pool.shutdown()


# ---------------------------------------------------------------------- the run
def record_group(trainers: list, kind: str) -> None:
    """run.json of each member: the groups it was trained in (the runs, where it joined)."""
    for t in trainers:
        path = t.run_dir / "run.json"
        info = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        info.setdefault("groups", []).append({
            "runs": [str(other.run_dir) for other in trainers], "step": kind,
            "joined_at": {"epoch": t.progress.epoch, "step": t.progress.step}})
        write_text_atomic(path, json.dumps(info, indent=1) + "\n")


def group_resume_command(run_dirs: list[Path], others: Sequence[str] = ()) -> str:
    """The train.py --group command that continues these runs (and starts `others`, members as
    given): each member one argument, its run directory quoted within it, as parse_member splits it."""
    members = [f"--resume {shlex.quote(str(run_dir))}" for run_dir in run_dirs] + list(others)
    return "python train.py --group " + " ".join(shlex.quote(member) for member in members)


def started_before(members: list[str], parsed: list, resolved: list) -> str | None:
    """Why a group started again with its members' configs cannot start (the same command after
    a stop: their run directories hold last.pt), with the command that continues it; or None.
    Each such run alone would name its own train.py --resume, which leaves the group behind."""
    started = [run_dir for args, (_, run_dir, _) in zip(parsed, resolved)
               if not args.resume and (run_dir / "last.pt").exists()]
    if not started:
        return None
    others = [text for text, args, (_, run_dir, _) in zip(members, parsed, resolved)
              if run_dir not in started and not args.resume]
    resumed = [run_dir for args, (_, run_dir, _) in zip(parsed, resolved) if args.resume or run_dir in started]
    held = ", ".join(map(str, started))
    return (f"{held} already hold{'s' if len(started) == 1 else ''} a run (this group's, stopped?); continue "
            f"the group with {group_resume_command(resumed, others)}, or choose another run.dir")


def run_group(members: list[str], step_choice: str, dry_run: bool) -> int:
    """train.py --group: check the members, start them (each run directory locked), train them
    together, say how each ended; the exit code is a signal's (128 + N) if one stopped the group,
    else the largest of the members' (0: all ended without an error)."""
    import train
    world = World.from_environment()
    if world.distributed:
        print("error: --group trains its runs in one process; start it with python, not torchrun",
              file=sys.stderr)
        return 2
    try:
        parsed, resolved, device = resolve_members(members)
    except GroupRefused as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    kind = step_kind(step_choice, device)
    if kind == "solo" and device.type == "cpu" and torch.get_num_threads() > 1:
        one_heap_for_every_thread()        # the members will step side by side: before they allocate
    with contextlib.ExitStack() as held:
        created = [run_dir for _, run_dir, _ in resolved if not run_dir.exists()]
        prepared, trainers = [], []
        try:
            for args in parsed:
                args.dry_run = dry_run
                run = prepare_run(args, world, held)
                if run is None:                    # --dry-run: its config printed
                    continue
                # The global generators hold this run's stream now (seeded and through its model
                # init): it takes them with it (and a resumed run its last.pt's, into them).
                stream = RandomStream(run.device)
                trainers.append(train.start_trainer(run, world, stream, label=str(run.run_dir)))
                prepared.append(run)
        except SETUP_ERRORS as e:
            held.close()
            remove_created(created)
            print(f"error: {e}", file=sys.stderr)
            return error_exit_code(e)
        if dry_run:
            print(f"--dry-run: the group would start: {runs(len(members))} on {device}, one step of "
                  f"all at a time ({kind} step); nothing written")
            return 0
        for trainer, run in zip(trainers, prepared):
            trainer.signals = trainers[0].signals          # one handler for the group
            report_start(run, world, trainer.progress, count_parameters(trainer.model))
            if run.config.run.tensorboard:
                trainer.run_log.open_tensorboard(trainer.progress.step)
        record_group(trainers, kind)
        print(f"group of {runs(len(trainers))} on {device}, one step of all at a time ({kind} step)",
              flush=True)
        # Side by side on a CPU's cores; a GPU's solo steps go one after another (its stream runs
        # one kernel at a time whoever launches it).
        step = (batched_steps if kind == "batched" else
                SideBySide(torch.get_num_threads(), ahead=STEPS_AHEAD) if device.type == "cpu" else SideBySide(1))
        configs = {t: run.config for t, run in zip(trainers, prepared)}
        try:
            ends = train.train_runs(trainers, step, on_end=lambda t, end: say_end(train, t, end, configs[t]))
        except (RunDirectoryError, OSError) as e:
            reason = e if isinstance(e, RunDirectoryError) else f"cannot write ({e.strerror or e})"
            print(f"error: {reason}; the group stopped (each run continues from its last.pt: "
                  f"{group_resume_command([t.run_dir for t in trainers])})", file=sys.stderr)
            return 1
        finally:
            if isinstance(step, SideBySide):
                step.close()
            for t in trainers:
                t.run_log.close()
        return exit_code(trainers, ends)


def remove_created(run_dirs: list[Path]) -> None:
    """Remove the run directories this command made (a group that could not start)."""
    for run_dir in run_dirs:
        if run_dir.is_dir():
            for path in sorted(run_dir.rglob("*"), reverse=True):
                path.rmdir() if path.is_dir() else path.unlink()
            run_dir.rmdir()


def say_end(train, t, end, config) -> None:
    """A member's end as it leaves the group: its line on the terminal and its group_exit.json
    (the exit code its solo run would have had, the message, the epochs done and the step)."""
    if end is None:
        code, message = 0, train.finish_message(t.progress, config, t.run_dir, World())
    else:
        code, message = end.exit_code, f"stopped: {end}"
    print(f"{t.run_dir}: {message}", file=sys.stderr if code else sys.stdout, flush=True)
    write_text_atomic(t.run_dir / GROUP_EXIT, json.dumps(
        {"exit_code": code, "message": message, "epochs_done": t.progress.epoch - 1,
         "step": t.progress.step}) + "\n")


def exit_code(trainers: list, ends: dict) -> int:
    """The group's exit code: a signal's (128 + N) if one stopped it, with the command that
    continues the members it stopped; else the largest of the members' (0: all ended without an
    error)."""
    codes = [0 if ends[t] is None else ends[t].exit_code for t in trainers]
    signalled = next((code for code in codes if code > 128), None)
    if signalled:
        print(f"continue the group with {group_resume_command([t.run_dir for t in trainers if ends[t]])}",
              file=sys.stderr)
        return signalled
    return max(codes)
