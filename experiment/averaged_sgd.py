"""Averaged SGD for the second phase of NT-ASGD / ET-ASGD (docs/reference.md section 3).

Equivalent to the AWD-LSTM use of torch.optim.ASGD(t0=0, lambd=0) with one difference that
docs/reference.md (section 3) requires and torch's ASGD does not give: after n steps the
average is the arithmetic mean of all n parameter vectors produced since the switch. torch's ASGD (2.x, and 0.3 as
used by the original code) copies the iterate on both of its first two steps, so its average
leaves out the first one; tests/test_averaged_sgd.py pins both behaviours.

The step size is taken from the param group's lr one step late, as in torch's ASGD: step k
uses the lr the group had at step k-1 (step 1 uses its own). The per-step rescaling of lr by
seq_len / bptt therefore reaches the updates exactly as in the original code.

`make_optimizer` gives a run's optimizer (SGD, or AveragedSGD once averaging), `step_optimizers`
steps one or a group's; `averaged_weights` puts the averages into the model for validation and
takes them out again.
"""
from __future__ import annotations

import torch


class AveragedSGD(torch.optim.Optimizer):
    def __init__(self, params, lr: float, weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        """Per parameter p with a gradient g, with its own step count n and step size eta:
            p <- p - eta (g + weight_decay p);  n <- n + 1;  ax <- ax + (p - ax) / n;  eta <- lr.
        Parameters whose n and eta agree (all of a group's, unless one had no gradient at some
        step) are updated together by multi-tensor operations: on a GPU a few launches for the
        whole model instead of four per parameter; on a CPU the same per-tensor arithmetic."""
        assert closure is None, "AveragedSGD does not take a closure"
        for group in self.param_groups:
            together: dict[tuple, list] = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["eta"] = float(group["lr"])
                    state["ax"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                together.setdefault((state["step"], state["eta"]), []).append(p)
            for (steps, eta), params in together.items():
                grads = [p.grad for p in params]
                if group["weight_decay"] != 0:
                    grads = torch._foreach_add(grads, params, alpha=group["weight_decay"])
                torch._foreach_add_(params, grads, alpha=-eta)
                averages = [self.state[p]["ax"] for p in params]
                torch._foreach_add_(averages, torch._foreach_sub(params, averages), alpha=1.0 / (steps + 1))
                for p in params:
                    self.state[p]["step"] = steps + 1
                    self.state[p]["eta"] = float(group["lr"])

    def averaged(self, p: torch.Tensor) -> torch.Tensor:
        """The running average for parameter p (p itself if it has not been stepped yet)."""
        state = self.state.get(p)
        return state["ax"] if state else p


def step_optimizers(optimizers: list) -> None:
    """Every optimizer's step, as its own step() would take it. The plain SGD ones (train.py's:
    no momentum) are stepped by the multi-tensor operations torch.optim.SGD's step runs, for all
    of them together, one pair per distinct (lr, weight decay): the same numbers (on a CPU bit
    for bit, tests/test_averaged_sgd.py), without step()'s bookkeeping, which costs more host time
    than the update itself for a small model, and a group run steps many (experiment/group.py).
    Plain SGD keeps no state, so nothing else changes; AveragedSGD takes its own step."""
    plain: dict[tuple, tuple[list, list]] = {}
    for optimizer in optimizers:
        if not is_plain_sgd(optimizer):
            optimizer.step()
            continue
        for group in optimizer.param_groups:
            params, grads = plain.setdefault((group["lr"], group["weight_decay"]), ([], []))
            for p in group["params"]:
                if p.grad is not None:
                    params.append(p)
                    grads.append(p.grad)
    with torch.no_grad():
        for (lr, weight_decay), (params, grads) in plain.items():
            if weight_decay != 0:
                grads = torch._foreach_add(grads, params, alpha=weight_decay)
            torch._foreach_add_(params, grads, alpha=-lr)


def is_plain_sgd(optimizer) -> bool:
    """torch.optim.SGD as make_optimizer makes it: no momentum, not maximising, no fused kernel."""
    return type(optimizer) is torch.optim.SGD and all(
        g["momentum"] == 0 and not g["maximize"] and not g.get("fused") and not g.get("differentiable")
        for g in optimizer.param_groups)


def make_optimizer(model, t, kind):
    """SGD or AveragedSGD over the model with the training config `t`'s lr and weight decay, with
    head parameter groups that have their own lr; each group keeps its lr as base_lr, which
    train.py scales by seq_len / bptt at every step."""
    extra = model.head.extra_param_groups()
    special = {id(p) for group in extra for p in group["params"]}
    main = [p for p in model.parameters() if p.requires_grad and id(p) not in special]
    groups = [{"params": main, "lr": t.lr}] + [dict(g) for g in extra]
    for group in groups:
        group["base_lr"] = group["lr"]
    if kind is torch.optim.SGD:
        return torch.optim.SGD(groups, lr=t.lr, weight_decay=t.wdecay)
    return AveragedSGD(groups, lr=t.lr, weight_decay=t.wdecay)


class averaged_weights:
    """Context manager: the model holds the ASGD averages inside, its own weights after."""

    def __init__(self, model, optimizer):
        self.model, self.optimizer, self.saved = model, optimizer, []

    def __enter__(self):
        if isinstance(self.optimizer, AveragedSGD):
            with torch.no_grad():
                for p in self.model.parameters():
                    average = self.optimizer.averaged(p)
                    if average is not p:
                        self.saved.append((p, p.detach().clone()))
                        p.copy_(average)
        return self

    def __exit__(self, *exc):
        with torch.no_grad():
            for p, original in self.saved:
                p.copy_(original)
        self.saved = []
        return False
