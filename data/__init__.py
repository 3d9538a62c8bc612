"""Corpora for the language models: loading, tokenisation and downloading."""

from .corpus import Corpus, load_corpus, resolve_data_dir
from .download import DATASETS, SOURCES, DataError, ensure_corpus

__all__ = [
    "DATASETS",
    "SOURCES",
    "Corpus",
    "DataError",
    "ensure_corpus",
    "load_corpus",
    "resolve_data_dir",
]
