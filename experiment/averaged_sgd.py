"""Averaged SGD for the second phase of NT-ASGD / ET-ASGD (docs/reference.md section 3).

Equivalent to the AWD-LSTM use of torch.optim.ASGD(t0=0, lambd=0) with one difference that
docs/reference.md (section 3) requires and torch's ASGD does not give: after n steps the
average is the arithmetic mean of all n parameter vectors produced since the switch. torch's ASGD (2.x, and 0.3 as
used by the original code) copies the iterate on both of its first two steps, so its average
leaves out the first one; tests/test_averaged_sgd.py pins both behaviours.

The step size is taken from the param group's lr one step late, as in torch's ASGD: step k
uses the lr the group had at step k-1 (step 1 uses its own). The per-step rescaling of lr by
seq_len / bptt therefore reaches the updates exactly as in the original code.

`make_optimizer` gives a run's optimizer (SGD, or AveragedSGD once averaging); `averaged_weights`
puts the averages into the model for validation and takes them out again.
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
