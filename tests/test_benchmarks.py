"""Smoke tests of the benchmark scripts' --quick modes: each must finish and write its table and plot."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def run_quick(script: str, out_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), MPLBACKEND="Agg")
    argv = [sys.executable, str(REPO / "benchmarks" / script), "--quick", "--out-dir", str(out_dir), *extra]
    return subprocess.run(argv, cwd=out_dir, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize(
    "script, name, rows",
    [
        ("throughput.py", "throughput", ["| HalfCheetah-v5 | ppo |", "| HalfCheetah-v5 | sb3 |", "dppo_async"]),
        ("scaling.py", "scaling", ["| dppo | 1 |", "| dppo | 2 |"]),
        ("learning.py", "learning", ["| Pendulum-v1 | ppo |", "| Pendulum-v1 | dppo_sync |", "| Pendulum-v1 | sb3 |"]),
    ],
)
def test_quick_mode_writes_table_and_plot(tmp_path, script, name, rows):
    result = run_quick(script, tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    table = (tmp_path / f"{name}.md").read_text()
    for row in rows:
        assert row in table, f"{row!r} missing from {name}.md:\n{table}"
    png = (tmp_path / f"{name}.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 5000
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{name}.md", f"{name}.png"], "nothing else left behind"
