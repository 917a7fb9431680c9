"""Smoke tests of the benchmark scripts' --quick modes: each must finish and write its table and plot."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


sys.path.insert(0, str(REPO / "benchmarks"))


def test_permutation_pvalue_against_hand_counts():
    from learning import permutation_pvalue

    # [1, 2] against [3, 4]: of the 6 ways to split {1, 2, 3, 4} in two pairs, only {1,2}|{3,4} and {3,4}|{1,2} differ
    # in mean by 2 or more.
    assert permutation_pvalue([1.0, 2.0], [3.0, 4.0]) == pytest.approx(2 / 6)
    # [1, 4] against [2, 3]: the means are equal, so every split is at least as extreme.
    assert permutation_pvalue([1.0, 4.0], [2.0, 3.0]) == 1.0
    # 3 + 3 fully separated: 2 of the 20 splits are that extreme.
    assert permutation_pvalue([10.0, 11.0, 12.0], [0.0, 1.0, 2.0]) == pytest.approx(2 / 20)
    # [0] against [0, 1, 5]: mean gap 2; the splits putting 5 alone (gap 4.67) or either 0 alone (gap 2) count, 1 alone
    # (gap 0.67) does not: 3 of the 4 choices, so p = 3/4.
    assert permutation_pvalue([0.0], [0.0, 1.0, 5.0]) == pytest.approx(3 / 4)


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
