"""What the Python tests share: the `hookscope` binary (for the CLI comparisons and the server)."""

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def binary():
    """HOOKSCOPE_BIN, else `hookscope` on PATH, else the workspace's debug build; skips
    without one."""
    found = os.environ.get("HOOKSCOPE_BIN") or shutil.which("hookscope")
    if found is None:
        candidate = ROOT / "target" / "debug" / "hookscope"
        found = str(candidate) if candidate.exists() else None
    if found is None:
        pytest.skip("no hookscope binary (set HOOKSCOPE_BIN)")
    assert Path(found).exists(), f"HOOKSCOPE_BIN={found} does not exist"
    return found
