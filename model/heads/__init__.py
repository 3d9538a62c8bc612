"""Registry: the config name of a head -> its class, in the order of the result tables.

Adding a head is one file in this folder (an OutputHead subclass, see base.py), its import here
and its line at the end of HEADS.
"""
from __future__ import annotations

from .base import HeadOutput, NoOptions, OutputHead, PointwiseTransformHead, TiedDecoder
from .mixture import MoCHead, MoSHead
from .mixtape import MixtapeHead
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
    "mixtape": MixtapeHead,
}

__all__ = ["HEADS", "HeadOutput", "NoOptions", "OutputHead", "PointwiseTransformHead", "TiedDecoder"]
