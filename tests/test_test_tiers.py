"""scripts/test_tiers.py (`make test`): what it does before either tier starts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import test_tiers  # noqa: E402


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_starts_no_tier(flag, monkeypatch, capsys):
    """`--help` started the Ray tier (a Ray cluster, minutes of tests) and printed pytest's help beside it
    (2026-12-07 probe): it prints the script's use and starts nothing."""
    monkeypatch.setattr(test_tiers.threading, "Thread", lambda *a, **k: pytest.fail("a tier was started"))
    monkeypatch.setattr(test_tiers.subprocess, "Popen", lambda *a, **k: pytest.fail("a tier was started"))
    assert test_tiers.main(["-q", flag]) == 0
    assert "usage: python scripts/test_tiers.py" in capsys.readouterr().out
