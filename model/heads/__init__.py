"""Registry: the config name of a head -> its class, in the order of the result tables.

Adding a head is one file in this folder (an OutputHead subclass, see base.py) and one line here.
"""
from __future__ import annotations

from importlib import import_module

from .base import HeadOutput, NoOptions, OutputHead, TiedDecoder


def _head(module: str, name: str) -> type[OutputHead]:
    return getattr(import_module(f".{module}", __name__), name)


HEADS: dict[str, type[OutputHead]] = {
    "softmax": _head("softmax", "SoftmaxHead"),
    "ss": _head("sigsoftmax", "SigSoftmaxHead"),
    "gss": _head("sigsoftmax", "GSSHead"),
    "plif": _head("plif", "PLIFHead"),
    "plif_frozen": _head("plif", "FrozenPLIFHead"),
    "mos": _head("mixture", "MoSHead"),
    "moc": _head("mixture", "MoCHead"),
}

__all__ = ["HEADS", "HeadOutput", "NoOptions", "OutputHead", "TiedDecoder"]
