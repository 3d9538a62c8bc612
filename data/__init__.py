"""Corpora for the language models: loading, tokenisation and downloading."""

import importlib

# Imported on first use (PEP 562) rather than here: `python -m data.download` runs that module
# as __main__ after importing this package, and runpy warns when the package has already
# imported it.
_HOME = {
    "DATASETS": "download",
    "SOURCES": "download",
    "Corpus": "corpus",
    "DataError": "download",
    "ensure_corpus": "download",
    "load_corpus": "corpus",
    "resolve_data_dir": "corpus",
}

__all__ = list(_HOME)


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
