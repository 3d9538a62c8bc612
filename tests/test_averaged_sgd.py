"""AveragedSGD: the average is the mean of all iterates since the switch (docs/reference.md section 3)."""
from __future__ import annotations

import pytest
import torch

from experiment.averaged_sgd import AveragedSGD


def run(optimizer_cls, lrs, **kwargs):
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(4))
    opt = optimizer_cls([p], lr=lrs[0], **kwargs)
    iterates = []
    for step, lr in enumerate(lrs):
        opt.param_groups[0]["lr"] = lr                  # the per-step seq_len rescaling
        p.grad = torch.sin(p.detach() * (step + 1))     # some gradient that depends on p
        opt.step()
        iterates.append(p.detach().clone())
    return p, opt, iterates


LRS = [1.0, 0.5, 2.0, 1.5, 0.25, 1.0, 3.0]


def test_average_is_the_mean_of_all_iterates():
    p, opt, iterates = run(AveragedSGD, LRS, weight_decay=0.01)
    for n in range(1, len(iterates) + 1):
        _, opt_n, it_n = run(AveragedSGD, LRS[:n], weight_decay=0.01)
        torch.testing.assert_close(opt_n.averaged(opt_n.param_groups[0]["params"][0]),
                                   torch.stack(it_n).mean(0), rtol=1e-6, atol=1e-6)


def test_steps_match_torch_asgd_with_lr_one_step_late():
    ours, _, ours_it = run(AveragedSGD, LRS, weight_decay=0.01)
    ref, _, ref_it = run(torch.optim.ASGD, LRS, weight_decay=0.01, t0=0, lambd=0.0)
    for a, b in zip(ours_it, ref_it):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_lr_reaches_the_update_one_step_late():
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.zeros(1))
    opt = AveragedSGD([p], lr=1.0)
    for lr, expected_step in ((1.0, 1.0), (5.0, 1.0), (2.0, 5.0), (2.0, 2.0)):
        opt.param_groups[0]["lr"] = lr
        before = p.item()
        p.grad = torch.ones(1)
        opt.step()
        assert before - p.item() == expected_step


def test_torch_asgd_leaves_out_the_first_iterate():
    # Why AveragedSGD exists: pins torch's behaviour so a change in torch is noticed.
    _, opt, iterates = run(torch.optim.ASGD, LRS, t0=0, lambd=0.0)
    ax = opt.state[opt.param_groups[0]["params"][0]]["ax"]
    torch.testing.assert_close(ax, torch.stack(iterates[1:]).mean(0), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(ax, torch.stack(iterates).mean(0))


def test_state_dict_round_trip():
    p, opt, _ = run(AveragedSGD, LRS[:3])
    q = torch.nn.Parameter(p.detach().clone())
    restored = AveragedSGD([q], lr=1.0)
    restored.load_state_dict(opt.state_dict())
    for lr in LRS[3:]:
        for param, o in ((p, opt), (q, restored)):
            o.param_groups[0]["lr"] = lr
            param.grad = torch.cos(param.detach())
            o.step()
    assert torch.equal(p, q)
    assert torch.equal(opt.averaged(p), restored.averaged(q))


def test_unstepped_parameter_average_is_itself():
    p = torch.nn.Parameter(torch.ones(2))
    opt = AveragedSGD([p], lr=1.0)
    assert opt.averaged(p) is p


def reference_step(opt: AveragedSGD) -> None:
    """AveragedSGD.step written per parameter, plainly (its docstring's update)."""
    with torch.no_grad():
        for group in opt.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = opt.state[p]
                if not state:
                    state.update(step=0, eta=float(group["lr"]), ax=torch.zeros_like(p))
                grad = p.grad.add(p, alpha=group["weight_decay"]) if group["weight_decay"] else p.grad
                p.add_(grad, alpha=-state["eta"])
                state["step"] += 1
                state["ax"].add_(p.sub(state["ax"]), alpha=1.0 / state["step"])
                state["eta"] = float(group["lr"])


def test_the_multi_tensor_step_is_the_per_parameter_update_bit_for_bit():
    """Several parameters in two groups, one of them without a gradient at some steps (so that
    its step count and step size part from the others'): weights and averages equal the plain
    per-parameter update exactly."""
    runs = []
    for step_fn in (AveragedSGD.step, reference_step):
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(shape)) for shape in ((3, 4), (5,), (2, 2), (7,))]
        opt = AveragedSGD([{"params": params[:3]}, {"params": params[3:], "lr": 0.3}], lr=1.0,
                          weight_decay=0.01)
        for step, lr in enumerate(LRS):
            opt.param_groups[0]["lr"] = lr
            for k, p in enumerate(params):
                p.grad = None if (k == 1 and step in (1, 2)) else torch.sin(p.detach() * (step + k + 1))
            step_fn(opt)
        runs.append((params, opt))
    (ours, opt), (theirs, ref) = runs
    assert opt.state[ours[1]]["step"] == len(LRS) - 2 and opt.state[ours[0]]["step"] == len(LRS)
    for p, q in zip(ours, theirs):
        assert torch.equal(p, q)
        assert torch.equal(opt.averaged(p), ref.averaged(q))
        assert opt.state[p]["eta"] == ref.state[q]["eta"] and opt.state[p]["step"] == ref.state[q]["step"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_stepping_optimizers_together_is_each_ones_own_step_bit_for_bit(dtype):
    """step_optimizers (train.py's step, and a group's: all its runs' optimizers at once) gives
    what each optimizer's own step() gives: torch.optim.SGD runs of different learning rates and
    weight decays, a head's param group of its own, a parameter without a gradient, and an
    averaged SGD among them."""
    from experiment.averaged_sgd import step_optimizers

    def build():
        torch.manual_seed(3)
        runs = []
        for lr, decay in ((20.0, 1.2e-6), (7.5, 0.0), (20.0, 1.2e-6)):
            params = [torch.nn.Parameter(torch.randn(5, 3, dtype=dtype)) for _ in range(3)]
            groups = [{"params": params[:2], "lr": lr}, {"params": params[2:], "lr": lr / 2}]
            runs.append((params, torch.optim.SGD(groups, lr=lr, weight_decay=decay)))
        params = [torch.nn.Parameter(torch.randn(4, dtype=dtype))]
        runs.append((params, AveragedSGD(params, lr=3.0, weight_decay=0.01)))
        return runs

    def gradients(runs, step):
        for k, (params, _) in enumerate(runs):
            for i, p in enumerate(params):
                p.grad = None if (k, i) == (1, 1) else torch.cos(p.detach() * (step + k + i))

    own, together = build(), build()
    for step in range(3):
        gradients(own, step)
        for _, optimizer in own:
            optimizer.step()
        gradients(together, step)
        step_optimizers([optimizer for _, optimizer in together])
    for (mine, a), (theirs, b) in zip(own, together):
        for p, q in zip(mine, theirs):
            assert torch.equal(p, q)
        assert a.state_dict()["state"].keys() == b.state_dict()["state"].keys()
