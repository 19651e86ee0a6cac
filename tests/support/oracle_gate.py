"""The gate in front of every test that runs transformers as the oracle: torch and
transformers imported, or the test skipped; where CI sets MOEGEN_REQUIRE_ORACLE, a missing
oracle is a failure (an ImportError), not a skip."""

from __future__ import annotations

import os
from typing import Any

import pytest


def require_oracle() -> tuple[Any, Any]:
    """torch and transformers; a skip without them unless MOEGEN_REQUIRE_ORACLE is set. Called
    at a test module's top, it skips the whole module."""
    if os.environ.get("MOEGEN_REQUIRE_ORACLE"):
        import torch
        import transformers

        return torch, transformers
    return pytest.importorskip("torch"), pytest.importorskip("transformers")
