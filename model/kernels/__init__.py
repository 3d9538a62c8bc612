"""Fused kernels behind the output heads: the same functions as the heads' plain formulas
(model/heads/), computed with custom autograd, torch.compile and reused buffers for speed and
memory. Each head file states its maths first; the tests compare the two.

    compiled.py   FusedKernel: a per-logit function through torch.compile, eager fallback
    gss.py        f(l) of SS / GSS and f'(l) in one pass
    plif.py       the PLIF with a scatter-add slope gradient that saves only the logits
    mixture.py    the MoS mixture in log space: full log-probs, and the targets' alone
    mixtape.py    Mixtape's sigmoid-tree gating in one pass, the targets' log-probs over two blocks
"""
