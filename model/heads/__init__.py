"""Registry: the config name of a head -> its class. Add a head with one file and one line here."""
from __future__ import annotations

from .base import HeadOutput, NoOptions, OutputHead
from .softmax import SoftmaxHead

HEADS: dict[str, type[OutputHead]] = {
    "softmax": SoftmaxHead,
}

__all__ = ["HEADS", "HeadOutput", "NoOptions", "OutputHead"]
