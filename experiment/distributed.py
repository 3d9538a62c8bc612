"""One run across processes with PyTorch DistributedDataParallel (started by torchrun).

    torchrun --nproc_per_node 4 train.py configs/wt2/mos.yaml

`World` is what this process is among the others (its rank, how many there are, its GPU on the
node) and the few collective operations train.py needs. A run started without torchrun is a world
of one process that talks to no one: every operation is then the identity, so train.py's
single-process path is what it always was.

The maths (train.py's docstring has the step): the batch's columns are cut into `size` equal
blocks and rank r trains block r, with its own carried hidden states and its own dropout masks
(its random numbers come from a stream derived from the seed and the rank). Every chunk's loss is
weighted by the chunk's share of the whole batch, as in one process, and DDP sums the ranks'
gradients (`sum_in_rank_order`, not DDP's average), so every rank then holds the gradient of the
whole batch (without dropout, exactly that of the single-process run with small_batch_size =
batch_size / size): the clipping, weight decay and (averaged) SGD step that follow are the same
on every rank.

Two process groups: the default one (gloo, on the CPU) carries the control messages (errors at
start-up, the stop signal, the validation loss, the states rank 0 saves) and exists before the
device is known; the data group carries the gradients and each step's checks: NCCL between GPUs,
the default gloo group on the CPU.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .config import ConfigError
from .loading import select_device

# What torchrun sets in the environment of every process it starts.
LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


def launched_by_torchrun(environ=os.environ) -> bool:
    """Whether torchrun (or a launcher doing as it does) started this process."""
    return any(name in environ for name in LAUNCH_VARIABLES)


class DistributedError(Exception):
    """The processes of a run cannot work together; str(error) is one line."""


def exit_process(code: int):
    """sys.exit(code); in a process started by torchrun, os._exit(code) once the output is flushed.

    DDP's reducer holds the process group until the process ends, so gloo's worker threads outlive
    destroy_process_group; one that releases a finished collective's tensors while the interpreter
    is finalizing needs the GIL and aborts the process ("terminate called without an active
    exception", SIGABRT; pytorch/pytorch#179291). Everything the
    run writes is closed by then, so the finalization is skipped."""
    if not any(name in os.environ for name in LAUNCH_VARIABLES):
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def rank_seed(seed: int, rank: int) -> int:
    """The seed of rank `rank`'s random stream in a run seeded with `seed` (distinct streams for
    distinct ranks, and for distinct seeds: not seed + rank, which the run seed + 1 would share)."""
    digest = hashlib.sha256(f"awd-lstm-heads seed {seed} rank {rank}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def sum_in_rank_order(group, bucket):  # no annotations: DDP checks them, and they are strings here
    """DDP communication hook: every rank gets the sum of the ranks' gradients in `bucket` (a
    dist.GradBucket), added up rank 0 first.

    DDP's own hook averages with an all-reduce whose order of additions depends on where a
    gradient sits in its bucket, and DDP re-buckets after its first step; a resumed run (whose
    first step uses the first bucketing again) would then add in another order, and differ in the
    last bits from the run it continues. Gathering the buckets into one flat buffer and adding
    them into the bucket in rank order does not depend on the bucketing. It moves size / 2 times
    the data of a ring all-reduce: the same with 2 processes, 4 times as much with 8
    (`run.ddp_reduce: allreduce`, `plain_all_reduce`, is the fast choice)."""
    buffer = bucket.buffer()
    size = dist.get_world_size(group)
    gathered = buffer.new_empty(size * buffer.numel())        # one flat buffer, rank by rank
    # all_gather_single is all_gather_into_tensor's newer name (the old one warns it is deprecated)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    work = gather(gathered, buffer, group=group, async_op=True)
    return finished(work, buffer, lambda: add_in_rank_order(gathered.view(size, -1), into=buffer))


def plain_all_reduce(group, bucket):
    """DDP communication hook: the sum (not DDP's average) of the ranks' gradients by one
    all-reduce; its order of additions depends on the bucketing, so resumes differ in the last bits."""
    buffer = bucket.buffer()
    work = dist.all_reduce(buffer, group=group, async_op=True)
    return finished(work, buffer, lambda: buffer)


def finished(work, buffer: torch.Tensor, result) -> torch.futures.Future:
    """The future a communication hook returns: `result()` once `work` is done."""
    if buffer.device.type == "cpu":
        # gloo runs a Python callback on its future ~0.2 s late, and on a CPU there is no
        # computation to overlap with the communication anyway: wait here.
        work.wait()
        done = torch.futures.Future()
        done.set_result(result())
        return done
    return work.get_future().then(lambda future: result())


def add_in_rank_order(gathered: torch.Tensor, into: torch.Tensor) -> torch.Tensor:
    """into = gathered[0] + gathered[1] + ..., added in that order."""
    into.copy_(gathered[0])
    for part in gathered[1:]:
        into += part
    return into


COMM_HOOKS = {"ordered": sum_in_rank_order, "allreduce": plain_all_reduce}


@dataclass
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0                # the rank among this node's processes: its GPU
    distributed: bool = False          # started by torchrun (even with one process)
    data_group: object = None          # set by connect(): the group DDP and the step checks use

    @classmethod
    def from_environment(cls, environ=os.environ) -> "World":
        if not launched_by_torchrun(environ):
            return cls()
        missing = [name for name in LAUNCH_VARIABLES if name not in environ]
        if missing:
            raise DistributedError(f"environment: {', '.join(missing)} not set, but "
                                   f"{', '.join(n for n in LAUNCH_VARIABLES if n in environ)} is; start "
                                   f"train.py with torchrun (which sets {', '.join(LAUNCH_VARIABLES)}) or "
                                   f"with none of them")
        try:
            rank, size, local_rank = (int(environ[name]) for name in LAUNCH_VARIABLES)
        except ValueError:
            raise DistributedError("environment: RANK, WORLD_SIZE and LOCAL_RANK must be integers, got "
                                   + ", ".join(repr(environ[n]) for n in LAUNCH_VARIABLES)) from None
        if not (0 <= rank < size and 0 <= local_rank <= rank):
            raise DistributedError(f"environment: RANK={rank}, LOCAL_RANK={local_rank} do not fit "
                                   f"WORLD_SIZE={size}")
        return cls(rank, size, local_rank, distributed=True)

    @property
    def is_main(self) -> bool:
        """Rank 0: validates, writes the run directory and speaks for all."""
        return self.rank == 0

    # ------------------------------------------------------------------ start and end
    @contextlib.contextmanager
    def joined(self):
        """Join the other processes (torchrun's rendezvous address is in the environment) for
        the duration of the block."""
        if not self.distributed:
            yield self
            return
        try:
            dist.init_process_group("gloo", rank=self.rank, world_size=self.size)
        except (ValueError, RuntimeError) as e:
            lines = str(e).strip().splitlines() or [type(e).__name__]
            raise DistributedError(f"rank {self.rank} cannot join the other processes: "
                                   f"{lines[0][:300]}") from None
        try:
            yield self
        finally:
            dist.destroy_process_group()

    def device(self, name: str, option: str = "run.device") -> torch.device:
        """select_device, and in a world of several processes this process's GPU on the node."""
        device = select_device(name, option)
        if not self.distributed or device.type == "cpu":
            return device
        if device.type != "cuda":
            raise ConfigError(f"{option}: {name!r}; a run across processes trains on CUDA GPUs "
                              f"(NCCL) or on the CPU (gloo)")
        if name not in ("auto", "cuda"):
            raise ConfigError(f"{option}: {name!r} names one GPU, but under torchrun every process "
                              f"trains on its own, cuda:LOCAL_RANK; give run.device=cuda or auto")
        if self.local_rank >= torch.cuda.device_count():
            raise ConfigError(f"{option}: the process of LOCAL_RANK {self.local_rank} has no GPU: "
                              f"{torch.cuda.device_count()} visible on this node; start at most "
                              f"that many processes a node (torchrun --nproc_per_node)")
        return torch.device("cuda", self.local_rank)

    def connect(self, device: torch.device) -> None:
        """Set up the data group for `device` (every rank calls this, with the same device type)."""
        if not self.distributed:
            return
        if device.type == "cuda":
            torch.cuda.set_device(device)
            self.data_group = dist.new_group(backend="nccl")
        else:
            self.data_group = dist.group.WORLD

    # ------------------------------------------------------------------ the batch
    def columns(self, batch_size: int) -> slice:
        """This rank's block of the batch's columns."""
        if batch_size % self.size:
            raise ConfigError(f"train.batch_size: {batch_size} is not divisible by the {self.size} "
                              f"processes of this run (each trains an equal block of the batch's "
                              f"columns); choose a batch size or a number of processes that divides it")
        share = batch_size // self.size
        return slice(self.rank * share, (self.rank + 1) * share)

    def seed_random_stream(self, seed: int) -> None:
        """Give this rank its own dropout masks: rank 0 goes on with the stream the model was
        initialised from (as a single process does), every other rank starts its own."""
        if self.rank > 0:
            torch.manual_seed(rank_seed(seed, self.rank))

    # ------------------------------------------------------------------ training
    def parallel(self, model: torch.nn.Module, device: torch.device,
                 reduce: str = "ordered") -> torch.nn.Module:
        """The model as training calls it: itself, or its DDP wrapper, which sums the gradients
        of the ranks during the backward of the step's last chunk (`reduce`: a COMM_HOOKS key)."""
        if not self.distributed:
            return model
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None,
            process_group=self.data_group)
        ddp.register_comm_hook(self.data_group, COMM_HOOKS[reduce])
        return ddp

    def accumulating(self, model: torch.nn.Module, last_chunk: bool):
        """The context of one chunk's backward: DDP communicates only at the step's last chunk,
        the gradients of the others accumulate locally."""
        if not self.distributed or last_chunk:
            return contextlib.nullcontext()
        return model.no_sync()

    def agree_on_step(self, checks: torch.Tensor, signal: int | None) -> tuple[list[float], int | None]:
        """A step's checks as every rank must read them, in one collective and one device sync.

        `checks` is this rank's (NLL, loss) of its chunks, each weighted by its share of the whole
        batch, then its gradient norm and weight extremes. Returned: the (NLL, loss) of the whole
        batch (the ranks' sums, added in rank order: NaN if any rank's is), then every rank's other
        checks, so that every rank sees a non-finite value any rank sees; and the signal that stops
        training if any rank received one (the largest signal number)."""
        if not self.distributed:
            return checks.tolist(), signal
        local = torch.cat([checks, checks.new_tensor([float(signal or 0)])])
        rows = [torch.empty_like(local) for _ in range(self.size)]
        dist.all_gather(rows, local, group=self.data_group)
        totals = rows[0][:2].clone()
        for row in rows[1:]:
            totals += row[:2]
        agreed = torch.cat([totals, *[row[2:-1] for row in rows], torch.stack([row[-1] for row in rows]).max()[None]])
        values = agreed.tolist()
        return values[:-1], int(values[-1]) or None

    def agree_on_signal(self, signal: int | None) -> int | None:
        """The signal that stops training if any rank received one (outside a step)."""
        if not self.distributed:
            return signal
        flag = torch.tensor([signal or 0], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag) or None

    def sum(self, value: float) -> float:
        """The sum of every rank's `value`, on every rank (in float64)."""
        if not self.distributed:
            return value
        tensor = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(tensor)
        return float(tensor)

    def broadcast(self, value: float) -> float:
        """Rank 0's `value` on every rank."""
        if not self.distributed:
            return value
        tensor = torch.tensor([value], dtype=torch.float64)
        dist.broadcast(tensor, src=0)
        return float(tensor)

    def gather(self, obj) -> list | None:
        """Every rank's `obj` (picklable, tensors on the CPU) on rank 0, in rank order; None
        on the other ranks."""
        if not self.distributed:
            return [obj]
        gathered = [None] * self.size if self.is_main else None
        dist.gather_object(obj, gathered, dst=0)
        return gathered

    def first_error(self, message: str | None) -> str | None:
        """The error of the lowest rank that had one (None: every rank is ready), on every rank;
        errors of ranks other than 0 name their rank."""
        if not self.distributed:
            return message
        messages = [None] * self.size
        dist.all_gather_object(messages, message)
        for rank, text in enumerate(messages):
            if text is not None:
                return text if rank == 0 else f"rank {rank}: {text}"
        return None
