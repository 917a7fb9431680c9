"""Tests of the benchmark scripts: --quick modes write their table and plot, output folders, the comparison venvs'
one-line errors, the CleanRL plumbing (with a stand-in script: neither comparison venv is needed), --help."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO, SAFETY_NET, run_python

sys.path.insert(0, str(REPO / "benchmarks"))


def test_permutation_pvalue_against_hand_counts():
    from seed_statistics import permutation_pvalue

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
    # past EXACT_SPLITS the splits are drawn: 12 + 12 seeds (2.7 million splits) answer at once, and clearly apart
    from seed_statistics import RANDOM_SPLITS, permutation_is_exact

    assert permutation_is_exact(10, 10) and not permutation_is_exact(12, 12)
    apart = permutation_pvalue([float(v) for v in range(12, 24)], [float(v) for v in range(12)])
    assert apart == pytest.approx(1 / (RANDOM_SPLITS + 1), rel=0.5)
    mixed = permutation_pvalue([float(v) for v in range(0, 24, 2)], [float(v) for v in range(1, 24, 2)])
    assert 0.5 < mixed < 1.0  # means 11 and 12 of interleaved seeds: most splits differ as much


def run_quick(script: str, out_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    args = ["--quick", "--out-dir", str(out_dir), *extra]
    return run_python(REPO / "benchmarks" / script, args, out_dir, timeout=SAFETY_NET, env={"MPLBACKEND": "Agg"})


@pytest.mark.parametrize(
    "script, name, rows, extra",
    [
        # DPPO's rows come from ppo's runner (run_summary_script) with DPPO's flags; scaling.py runs DPPO on Ray
        ("throughput.py", "throughput", [f"| HalfCheetah-v5 | {impl} |" for impl in ("raw", "ppo", "sb3")],
         ["--impls", "raw", "ppo", "sb3"]),
        ("scaling.py", "scaling", ["| dppo | 1 |", "| dppo | 2 |"], []),
        ("learning.py", "learning", ["| Pendulum-v1 | ppo |", "| Pendulum-v1 | dppo_sync |", "| Pendulum-v1 | sb3 |"],
         []),
    ],
)  # fmt: skip
@pytest.mark.slow
def test_quick_mode_writes_table_and_plot(tmp_path, script, name, rows, extra):
    result = run_quick(script, tmp_path, *extra)
    assert result.returncode == 0, result.stderr[-2000:]
    table = (tmp_path / f"{name}.md").read_text()
    for row in rows:
        assert row in table, f"{row!r} missing from {name}.md:\n{table}"
    png = (tmp_path / f"{name}.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 5000
    grid = ["learning_grid.png"] if name == "learning" else []  # one panel per task
    assert all((tmp_path / g).read_bytes().startswith(b"\x89PNG") for g in grid)
    expected = sorted([f"{name}.md", f"{name}.png", *grid])
    assert sorted(p.name for p in tmp_path.iterdir()) == expected, "nothing else left behind"
    if name == "learning":  # one checkout trained every row (SB3's run records its own script, not a version of ours)
        assert "Mixed" not in table and "Ran on Python" in table and "Runs' code: commit" in table, table
    if name == "scaling":  # the code it measured, and each run's start-up: a first update before the run ended
        assert "repo at " in table and "ray " in table, table
        for line in (row for row in table.splitlines() if "| dppo |" in row):
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            actors, whole_rate = int(cells[2]), float(cells[4].replace(",", ""))
            most_steps = actors * 64 * 6 * 2  # 6 updates of 64-step rollouts, each actor's stale ones counted too
            assert 0 < float(cells[7]) < most_steps / whole_rate, line


# ---------------------------------------------------------------------------------------------------------------------
# Output folders: a new git-ignored folder by default, benchmarks/results only when asked
# ---------------------------------------------------------------------------------------------------------------------
def parsers():
    import learning
    import scaling
    import throughput

    return {
        "throughput.py": throughput.parse_args,
        "scaling.py": scaling.parse_args,
        "learning.py": learning.parse_args,
    }


def git_ignores(path: Path) -> bool:
    rel = os.path.relpath(path, REPO)
    return subprocess.run(["git", "check-ignore", "-q", "--no-index", rel], cwd=REPO).returncode == 0


@pytest.mark.parametrize("script", ["throughput.py", "scaling.py", "learning.py"])
def test_default_out_dir_is_a_new_ignored_folder_not_the_committed_results(script, tmp_path, monkeypatch):
    import common

    monkeypatch.chdir(tmp_path)  # the default does not depend on the working directory
    out_dir = Path(parsers()[script]([]).out_dir)
    assert out_dir.is_absolute()
    assert out_dir.parent == Path(common.LOCAL_RESULTS_DIR)
    assert out_dir != Path(common.RESULTS_DIR) and Path(common.RESULTS_DIR) in out_dir.parents
    assert git_ignores(out_dir / f"{script.removesuffix('.py')}.md")
    assert not git_ignores(REPO / "benchmarks" / "results" / "throughput.md"), "the committed results stay tracked"


@pytest.mark.parametrize("script", ["throughput.py", "scaling.py", "learning.py"])
def test_update_committed_and_out_dir(script, tmp_path, monkeypatch):
    import common

    parse = parsers()[script]
    assert parse(["--update-committed"]).out_dir == common.RESULTS_DIR
    monkeypatch.chdir(tmp_path)
    assert parse(["--out-dir", "here"]).out_dir == str(tmp_path / "here")  # relative to the working directory
    with pytest.raises(SystemExit):
        parse(["--out-dir", "here", "--update-committed"])


def test_default_out_dir_names_sort_by_time():
    import datetime as dt

    import common

    args = argparse.Namespace(out_dir=None, update_committed=False)
    early = common.resolve_out_dir(args, now=dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC))
    late = common.resolve_out_dir(args, now=dt.datetime(2026, 11, 2, 3, 4, 5, tzinfo=dt.UTC))
    assert os.path.basename(early) == "2026-01-02T030405Z" and early < late


# ---------------------------------------------------------------------------------------------------------------------
# Comparison venvs: found in the repository by default, one clear line when missing
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["rllib", "cleanrl"])
def test_missing_default_venv_is_one_line_naming_the_command(kind, tmp_path):
    import common

    assert common.default_venv_python(kind) == str(REPO / "benchmarks" / f".venv-{kind}" / "bin" / "python")
    with pytest.raises(common.BenchError) as e:
        common.venv_python(kind, None, repo=str(tmp_path))  # a checkout without the venv
    message = str(e.value)
    assert "\n" not in message
    command = common.venv_command(kind)
    assert command in message
    assert command == (
        f"python3 -m venv benchmarks/.venv-{kind} && benchmarks/.venv-{kind}/bin/pip install "
        f"-r benchmarks/requirements-{kind}.txt"
    )
    assert (REPO / "benchmarks" / f"requirements-{kind}.txt").is_file()
    assert git_ignores(REPO / "benchmarks" / f".venv-{kind}" / "bin" / "python")


def test_venv_python_found_by_location_not_working_directory(tmp_path, monkeypatch):
    import common

    python = tmp_path / "benchmarks" / ".venv-rllib" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    monkeypatch.chdir(tmp_path.parent)
    assert common.venv_python("rllib", None, repo=str(tmp_path)) == str(python)
    monkeypatch.chdir(tmp_path)
    assert common.venv_python("rllib", "benchmarks/.venv-rllib/bin/python") == str(python)  # a flag: cwd-relative


def run_script(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run_python(REPO / "benchmarks" / script, args, cwd, timeout=SAFETY_NET, env={"MPLBACKEND": "Agg"})


@pytest.mark.parametrize(
    "script, args, expected",
    [
        ("throughput.py", ["--impls", "ppo", "rllib", "--rllib-python", "no/such/python"], "--rllib-python"),
        ("throughput.py", ["--impls", "cleanrl"], "--cleanrl-script PATH"),
        ("throughput.py", ["--impls", "cleanrl", "--cleanrl-script", "no_such.py"], "no_such.py does not exist"),
        (
            "throughput.py",
            ["--impls", "cleanrl", "--cleanrl-script", __file__, "--cleanrl-python", "no/such/python"],
            "--cleanrl-python",
        ),
        ("scaling.py", ["--rllib-python", "no/such/python"], "--rllib-python"),
    ],
)
@pytest.mark.slow
def test_missing_venv_or_script_fails_at_once_with_one_line(script, args, expected, tmp_path):
    result = run_script(script, *args, "--out-dir", str(tmp_path / "out"), cwd=tmp_path)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{script}: error:") and expected in lines[0], result.stderr
    assert not (tmp_path / "out").exists(), "nothing ran, nothing written"


# ---------------------------------------------------------------------------------------------------------------------
# cleanrl: the command line, environment and parsing, with a stand-in for CleanRL's script
# ---------------------------------------------------------------------------------------------------------------------
FAKE_CLEANRL = textwrap.dedent(
    """
    import argparse, os
    p = argparse.ArgumentParser()
    for flag in ("--env-id", "--seed", "--total-timesteps", "--num-steps", "--num-minibatches", "--update-epochs",
                 "--learning-rate", "--gamma", "--gae-lambda", "--clip-coef", "--ent-coef", "--max-grad-norm",
                 "--num-envs", "--vf-coef"):
        p.add_argument(flag)
    for flag in ("--anneal-lr", "--clip-vloss", "--norm-adv", "--no-cuda", "--no-track"):
        p.add_argument(flag, action="store_true")
    args = p.parse_args()  # an unknown flag (--torch-threads, say) fails, as in CleanRL's tyro CLI
    assert os.environ["OMP_NUM_THREADS"] == "1" and args.no_cuda and args.num_envs == "1"
    os.makedirs("runs/x")  # CleanRL writes into its working directory: a temporary one
    for i in range(int(args.total_timesteps) // int(args.num_steps)):
        print(f"global_step={i}, episodic_return=[-1.0]")
        print(f"SPS: {1000 + 100 * i}")
    print("env", args.env_id, "seed", args.seed)
    """
)


def test_cleanrl_runs_the_given_script_on_v4_with_one_thread(tmp_path):
    import throughput
    from common import BenchError

    script = tmp_path / "ppo_continuous_action.py"
    script.write_text(FAKE_CLEANRL)
    cfg = argparse.Namespace(
        total_timesteps=5000,
        num_steps=1024,
        num_minibatches=16,
        cleanrl_script=str(script),
        cleanrl_python=sys.executable,
    )
    result = throughput.run_cleanrl("HalfCheetah-v5", 3, cfg)
    assert result.steps == 4 * 1024  # 4 iterations of 1024 steps, like CleanRL's total_timesteps // batch_size
    assert result.inloop_sps == 1300.0  # the last SPS line: the rate of the whole loop
    assert result.whole_seconds > 0 and result.env_run == "HalfCheetah-v4"
    assert throughput.cleanrl_env_id("Pendulum-v1") == "Pendulum-v1"
    with pytest.raises(BenchError, match="no 'SPS:' line"):
        throughput.parse_cleanrl_stdout("global_step=1\n", 1024)


def test_recorded_command_has_no_machine_paths():
    import common

    argv = [str(REPO / "benchmarks" / "throughput.py"), "--out-dir", str(REPO / "benchmarks" / "results" / "x")]
    elsewhere = os.path.join(os.sep, "some", "where", "ppo_continuous_action.py")  # an absolute path of a user's
    argv += [f"--cleanrl-script={elsewhere}", "--envs", "HalfCheetah-v5"]
    assert common.display_command(argv) == (
        "python benchmarks/throughput.py --out-dir benchmarks/results/x "
        "--cleanrl-script=.../ppo_continuous_action.py --envs HalfCheetah-v5"
    )


# ---------------------------------------------------------------------------------------------------------------------
# --help, and no absolute path of a particular machine in what the repository ships
# ---------------------------------------------------------------------------------------------------------------------
MACHINE_PATH = re.compile(r"(?<![\w.])/(work|root|tmp|home)/")


@pytest.mark.parametrize(
    "script",
    [
        "throughput.py",
        "scaling.py",
        "learning.py",
        "sb3_ppo.py",
        "rllib_ppo.py",
        "iteration_profile.py",
        "local_cluster.py",
        "startup.py",
    ],
)
@pytest.mark.slow
def test_help_exits_0_and_names_only_files_that_exist(script, tmp_path):
    result = run_script(script, "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    text = result.stdout
    assert "usage:" in text and not MACHINE_PATH.search(text)
    mentioned = set(re.findall(r"(?<![\w/.])benchmarks/[\w./-]*\w", text)) | set(re.findall(r"\bREADME\.md\b", text))
    for path in mentioned:
        if path.startswith(("benchmarks/.venv-", "benchmarks/results/local")):
            continue  # created by the user (the venv command) or by the scripts themselves
        assert (REPO / path).exists(), f"{script} --help names {path}, which does not exist"
    assert list(tmp_path.iterdir()) == [], "--help wrote nothing"


def test_no_machine_paths_anywhere_in_the_repository():
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert {"README.md", "benchmarks/throughput.py", "docs/ppo_continuous.md", "ppo_continuous.py"} <= set(files)
    for name in files:
        path = REPO / name
        if not path.is_file() or path.suffix == ".png":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            assert not MACHINE_PATH.search(line), f"{name}:{number}: {line}"


def test_cleanrl_script_is_not_in_the_repository():
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert not [f for f in files if os.path.basename(f) == "ppo_continuous_action.py"]


def test_learning_run_resumes_a_half_finished_set(tmp_path):
    """learning.py --run after an interruption: finished runs are kept, an interrupted ppo/DPPO run resumes from its
    checkpoint.pt, a half-finished run without one starts afresh, a missing one starts."""
    import json

    from learning import run_status

    cfg = argparse.Namespace(total_timesteps=4096, num_steps=2048)
    finished, interrupted, killed = tmp_path / "finished", tmp_path / "interrupted", tmp_path / "killed"
    for folder in (finished, interrupted, killed):
        folder.mkdir()
    (finished / "summary.json").write_text(json.dumps({"status": "completed"}))
    (interrupted / "summary.json").write_text(json.dumps({"status": "interrupted"}))
    (interrupted / "checkpoint.pt").write_bytes(b"")
    assert run_status(str(finished), cfg) == "done"
    assert run_status(str(interrupted), cfg) == "resume"
    assert run_status(str(killed), cfg) == "restart"
    assert run_status(str(tmp_path / "never"), cfg) == "new"


@pytest.mark.slow
def test_iteration_profile_quick_times_both_update_paths_and_the_rollout(tmp_path):
    out = tmp_path / "profile.md"
    result = run_script("iteration_profile.py", "--quick", "--env-id", "Pendulum-v1", "--out", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    table = out.read_text()
    update = re.search(r"\| update, ms per minibatch [^|]*\| ([\d.]+) \| ([\d.]+) \|", table)
    rollout = re.search(r"\| rollout, us per env step [^|]*\| ([\d.]+) \| ([\d.]+) \| (\d+)% ", table)
    assert update and rollout, table
    assert all(float(x) > 0 for x in update.groups()) and 0 < int(rollout.group(3)) < 100
    bad = run_script("iteration_profile.py", "--quick", "--env-id", "NoSuchEnv-v0", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.strip().startswith("iteration_profile.py: error: cannot make env")


def learning_rows(finals_by_task: dict[str, list[float]], impl: str = "ppo") -> list[dict]:
    import numpy as np

    return [
        {
            "env": env_id,
            "impl": impl,
            "seeds": len(finals),
            "finals": finals,
            "final": float(np.mean(finals)),
            "final_std": float(np.std(finals, ddof=1)) if len(finals) > 1 else 0.0,
        }
        for env_id, finals in finals_by_task.items()
    ]


def test_learning_reference_table_sets_each_task_beside_cleanrl():
    from learning_report import CLEANRL, reference_tables

    rows = learning_rows({"Hopper-v5": [2000.0, 2400.0, 2800.0], "dm_control/cheetah-run-v0": [300.0, 340.0]})
    rows += learning_rows({"Hopper-v5": [1000.0]}, impl="dppo_async")
    table = "\n".join(reference_tables(rows, ["ppo", "dppo_async"]))
    mean, std = CLEANRL["Hopper"][:2]
    gap = (2400.0 - mean) / std
    assert f"| Hopper-v5 | 2400 ± 400 (3) | 1000 ± 0 (1) | 2383 ± 272 (3, 1M steps) | {gap:+.1f} |" in table
    assert "| dm_control/cheetah-run-v0 | 320 ± 28 (2) | 433 ± 83 (10, 8M steps) |" in table  # its own family
    assert table.index("MuJoCo") < table.index("dm_control:")


@pytest.mark.slow
def test_learning_aggregate_is_rliables_iqm_of_normalized_scores():
    """Scores: random actions 0, CleanRL's published mean 1. The IQM of a (seeds, tasks) matrix is the mean of its
    middle 50% of runs (scipy's trim_mean at 25%), and its bootstrap interval holds it."""
    import numpy as np
    from learning_report import CLEANRL, aggregate_table, normalized_scores
    from scipy.stats import trim_mean

    finals = {"Hopper-v5": [1000.0, 2000.0, 3000.0], "Walker2d-v5": [500.0, 2500.0, 4000.0]}
    finals["Pusher-v5"] = [-50.0, -45.0, -30.0]
    random = {"Hopper-v5": 20.0, "Walker2d-v5": 0.0, "Pusher-v5": -150.0}
    rows = learning_rows(finals)
    scores = normalized_scores(rows, list(finals), "ppo", random)
    expected = np.stack(
        [(np.array(f) - random[e]) / (CLEANRL[e.split("-v")[0]][0] - random[e]) for e, f in finals.items()], axis=1
    )
    np.testing.assert_allclose(scores, expected)
    assert scores[2, 2] == pytest.approx((-30.0 + 150.0) / (-40.38 + 150.0))  # better than CleanRL on Pusher: > 1
    assert normalized_scores(rows[:2] + learning_rows({"Pusher-v5": [-40.0]}), list(finals), "ppo", random) is None
    line = [row for row in aggregate_table(rows, ["ppo"], random, reps=500) if row.startswith("| ppo |")][0]
    iqm, low, high = (float(x) for x in re.search(r"\| ([\d.]+) \[([\d.]+), ([\d.]+)\] \|", line).groups())
    assert iqm == pytest.approx(trim_mean(expected.reshape(-1), 0.25), abs=0.005)
    assert low <= iqm <= high and low < high
    # the bootstrap is seeded: whatever state numpy's global generator is in (a new process, say), the same runs give
    # the same intervals (with as few as 20 resamples, unseeded ones would differ)
    tables = []
    for global_seed in (1, 2):
        np.random.seed(global_seed)  # noqa: NPY002 (the generator rliable uses)
        tables.append(aggregate_table(rows, ["ppo"], random, reps=20))
    assert tables[0] == tables[1]
    # an implementation run on two of the three tasks: a second table, both implementations on those two
    rows += learning_rows({"Hopper-v5": [2500.0] * 3, "Pusher-v5": [-35.0] * 3}, impl="dppo_async")
    table = aggregate_table(rows, ["ppo", "dppo_async"], random, reps=200)
    assert sum(line.startswith("| ppo |") for line in table) == 2
    assert [line.startswith("| dppo_async |") for line in table].count(True) == 1
    assert any("2 tasks (the tasks all have: Hopper, Pusher)" in line for line in table)


def test_learning_runs_side_by_side_phase_by_phase_and_a_failure_does_not_stop_the_others(tmp_path, capsys):
    from common import BenchError
    from learning import run_here

    from launcher import Seed

    def run(name: str, code: str) -> Seed:
        """A run that makes its folder, says so, and then does what `code` says."""
        folder = tmp_path / name
        script = f"import os, sys, time\nos.mkdir({str(folder)!r})\nprint('made', {name!r})\n{code}"
        return Seed(1, str(folder), [], config=name, command=[sys.executable, "-c", script])

    # the first waits until the second has made its folder, so it passes only if both run at once
    wait = f"end = time.time() + {SAFETY_NET}\nwhile not os.path.exists({str(tmp_path / 'b')!r}):\n"
    wait += "    time.sleep(0.05)\n    if time.time() > end: sys.exit('b never ran beside me')"
    side_by_side = [run("a", wait), run("b", ""), run("bad", "sys.exit('bad went wrong')"), run("c", "")]
    # the next phase starts once the last run of the first has ended
    after = f"sys.exit(0 if all(os.path.isdir(os.path.join({str(tmp_path)!r}, n)) for n in 'abc') else 'too early')"
    with pytest.raises(BenchError, match=r"^1 of 5 runs failed; the first: bad seed 1 \(its lines are above\)$"):
        run_here([(side_by_side, 2), ([run("d", after)], 1)], cwd=str(tmp_path))
    assert all((tmp_path / name).is_dir() for name in "abcd")
    out, err = capsys.readouterr()
    assert "c seed 1: made c" in out and "bad seed 1: bad went wrong" in err
    logged = (tmp_path / "bad" / "output.log").read_text().splitlines()  # stdout's and stderr's, in either order
    assert sorted(logged) == ["bad went wrong", "made bad"], "its lines in its folder"


@pytest.mark.slow
def test_learning_random_returns_run_in_the_given_interpreter_and_are_cached(tmp_path):
    import gymnasium as gym
    from learning_report import random_returns

    env = gym.make("Pendulum-v1")
    env.action_space.seed(0)
    expected = 0.0
    for episode in range(2):
        env.reset(seed=episode)
        done = False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            expected, done = expected + float(reward), terminated or truncated
    cache = tmp_path / "group" / "random_returns.json"
    assert random_returns(["Pendulum-v1"], str(cache), sys.executable, episodes=2) == {
        "Pendulum-v1": pytest.approx(expected / 2)
    }
    # measured once: a second call reads the cache and never starts the (here missing) interpreter
    assert random_returns(["Pendulum-v1"], str(cache), str(tmp_path / "no-python"))["Pendulum-v1"] == pytest.approx(
        expected / 2
    )
    from common import BenchError

    with pytest.raises(BenchError, match="random actions on CartPole-v1"):
        random_returns(["CartPole-v1"], str(cache), str(tmp_path / "no-python"))


def test_learning_python_is_checked_and_made_absolute(tmp_path, monkeypatch, capsys):
    from learning import parse_args

    venv_python = tmp_path / "venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.symlink_to(sys.executable)
    monkeypatch.chdir(tmp_path)
    # relative to where the user is, absolute for runs that start elsewhere; the venv's link is kept, not resolved
    cfg = parse_args(["--python", "venv/bin/python", "--out-dir", str(tmp_path / "out")])
    assert cfg.python == str(venv_python)
    with pytest.raises(SystemExit) as stop:
        parse_args(["--python", "venv/bin/nothing"])
    assert stop.value.code == 2 and "--python venv/bin/nothing: no such executable" in capsys.readouterr().err


def test_learning_reads_what_a_run_ran_on_without_importing_torch():
    """learning.py's driver, and the interpreter it asks what its runs would record, read versions from the packages'
    metadata: a refusal or a report of a sweep without --grid imports no torch. What they read is what a run records
    (run_management's run.json)."""
    import run_management

    code = "import json, sys; sys.path.insert(0, 'benchmarks'); import learning; "
    code += "print(json.dumps([learning.expected_environment(sys.executable), sorted(sys.modules)]))"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=SAFETY_NET)
    assert result.returncode == 0, result.stderr[-2000:]
    environment, modules = json.loads(result.stdout)
    assert "torch" not in modules and "gymnasium" not in modules
    assert environment == run_management.run_environment() and environment["packages"]["torch"]


@pytest.mark.slow
def test_num_seeds_quick_times_the_launcher_against_single_runs_and_finds_the_same_returns(tmp_path):
    out = tmp_path / "num_seeds.md"
    result = run_script("num_seeds.py", "--quick", "--out", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    table = out.read_text()
    rows = {}
    for way in ("--num-seeds 2", "2 by hand", "one seed"):
        row = re.search(
            rf"\| {re.escape(way)} \| ([\d.]+) s \| [\d.]+ s \| [\d.]+ s \| (-?[\d.]+) \| (-?[\d.]*) \|", table
        )
        assert row, table
        rows[way] = row.groups()[1:]
    assert rows["--num-seeds 2"] == rows["2 by hand"] and rows["one seed"][0] == rows["2 by hand"][0]
    assert "Every seed's final return equals its single run's: yes." in table
    peak = re.search(r"peak memory \(VmHWM; its seeds are processes of their own\): (\d+) MiB", table)
    assert peak and 0 < int(peak.group(1)) < 150, table  # the launcher imports no torch


def test_startup_times_each_mode_as_a_whole_process_and_refuses_a_missing_script(tmp_path):
    """benchmarks/startup.py with --no-compile only (the compiled modes cost a compile each): its table has the mode's
    row, with a wall time, a CPU time and a peak memory that a real run of torch takes; a missing script is one line."""
    out = tmp_path / "startup.md"
    args = ["--env-id", "Pendulum-v1", "--total-timesteps", "2048", "--rounds", "1", "--modes", "no-compile"]
    result = run_python(REPO / "benchmarks" / "startup.py", [*args, "--out", str(out)], tmp_path, timeout=SAFETY_NET)
    assert result.returncode == 0, result.stderr[-2000:]
    row = next(line for line in out.read_text().splitlines() if line.startswith("| no-compile |"))
    wall, least, most, cpu, peak = (float(cell) for cell in row.split("|")[2:7])
    assert 0 < least == wall == most and cpu > 0 and peak > 100, row  # torch alone takes more than 100 MiB
    table = out.read_text()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    assert f"repo at {commit.strip()}" in table and "--out .../startup.md" in table, table  # no path of this machine
    missing = run_python(REPO / "benchmarks" / "startup.py", ["--script", str(tmp_path / "nope.py")], tmp_path)
    assert missing.returncode == 2 and f"no script at {tmp_path / 'nope.py'}" in missing.stderr, missing.stderr
