"""Registry: the config name of a head -> its class. Add a head with one file and one line here."""
from __future__ import annotations

from .base import HeadOutput, NoOptions, OutputHead
from .mixture import MoCHead, MoSHead
from .plif import FrozenPLIFHead, PLIFHead
from .sigsoftmax import GSSHead, SigSoftmaxHead
from .softmax import SoftmaxHead

HEADS: dict[str, type[OutputHead]] = {
    "softmax": SoftmaxHead,
    "ss": SigSoftmaxHead,
    "gss": GSSHead,
    "plif": PLIFHead,
    "plif_frozen": FrozenPLIFHead,
    "mos": MoSHead,
    "moc": MoCHead,
}

__all__ = ["HEADS", "HeadOutput", "NoOptions", "OutputHead"]
