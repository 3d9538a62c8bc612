"""Shared pytest fixtures."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Make the repository's packages importable when pytest is run as `pytest`
# (which, unlike `python -m pytest`, does not put the working directory on sys.path).
REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """The read-only folder with the real corpora ($AWD_DATA_DIR, set by CI)."""
    value = os.environ.get("AWD_DATA_DIR")
    if not value:
        pytest.skip(
            "AWD_DATA_DIR is not set: it must point at the folder holding ptb/ and wikitext-2/"
        )
    return Path(value)
