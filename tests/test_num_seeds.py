"""--num-seeds N: N single runs of the script as it was invoked, each a process of its own (launcher.py).

Each seed is the command its run.json records, so each seed is that single run bit for bit: every TensorBoard scalar
(but charts/SPS, a wall-clock rate) and the final checkpoint's weights equal, with exact equality, for the stock script
and for edits that keep state anywhere a researcher's code can (module globals, caches, class attributes, the global
random generators, the Sampler). One seed's failure stops that seed only; Ctrl-C or SIGTERM checkpoints every running
seed and starts no new one; --resume continues them all, or one; refused flags are one line, said once."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import launcher
import seed_statistics
from run_record import SturdyStream
from tests.conftest import (
    PPO_SCRIPT,
    REPO,
    SAFETY_NET,
    ForkedScript,
    run_forked,
    run_ppo,
    run_python,
    start_python,
    tensorboard_events,
    wait_until_trained,
)

sys.path.insert(0, str(REPO / "benchmarks"))
from edits import edited_copy  # noqa: E402

RUN = ["--env-id", "Pendulum-v1", "--total-timesteps", "768", "--num-steps", "256", "--num-minibatches", "4"]
RUN += ["--update-epochs", "2", "--quiet", "--checkpoint-every", "0"]
WALL_CLOCK_TAGS = {"charts/SPS"}


def all_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar a run logged, by tag, as (step, value): all but the wall-clock rates."""
    events = tensorboard_events(run_dir)
    tags = [tag for tag in events.Tags()["scalars"] if tag not in WALL_CLOCK_TAGS]
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in tags}


def assert_identical(seed_dir: Path, single_dir: Path) -> None:
    """Two runs trained alike, bit for bit: every scalar and every tensor of the final checkpoint equal."""
    a, b = all_scalars(seed_dir), all_scalars(single_dir)
    assert a.keys() == b.keys() and "losses/value_loss" in a
    for tag in a:
        assert a[tag] == b[tag], tag
    saved = torch.load(seed_dir / "checkpoint.pt", weights_only=True)
    single = torch.load(single_dir / "checkpoint.pt", weights_only=True)
    assert saved["global_step"] == single["global_step"] > 0
    assert saved["agent"].keys() == single["agent"].keys()
    for name, value in single["agent"].items():
        assert torch.equal(saved["agent"][name], value), name


def trained_once(run_dir: Path) -> bool:
    """Whether a run's TensorBoard events hold an update's losses (it has trained once)."""
    events = list(run_dir.glob("events.*"))
    return bool(events) and "losses/approx_kl" in tensorboard_events(run_dir).Tags()["scalars"]


def recorded_command(run_dir: Path) -> list[str]:
    return json.loads((run_dir / "run.json").read_text())["command"]


def run_recorded_singles(folder: Path, run_dirs: list[Path], script: str = "ppo_continuous.py") -> Path:
    """Each seed's recorded command run by hand, as its single run, in a fresh working folder beside `folder`'s runs
    (the same run names; two at a time; each forked from a process that has imported torch, ForkedScript, while the
    launcher's seeds are `python` processes of their own); returns that folder."""
    alone = folder / "alone"
    alone.mkdir()
    for name in os.listdir(folder):
        if name.endswith(".py"):  # the scripts and modules of an edited copy
            shutil.copy(folder / name, alone / name)
    runs = []
    for run_dir in run_dirs:
        command = recorded_command(run_dir)
        assert command[0] == script
        runs.append(ForkedScript(alone / script if (alone / script).exists() else PPO_SCRIPT, command[1:], alone))
        if len(runs) % 2 == 0 or run_dir == run_dirs[-1]:
            for run in runs:
                result = run.result()
                assert result.returncode == 0, result.stderr
            runs = []
    return alone


def test_each_seed_is_its_single_run_bit_for_bit_and_writes_what_it_writes(tmp_path):
    """(Eager: the HalfCheetah seeds below are compiled.)"""
    flags = [*RUN]
    together = run_ppo(
        [*flags, "--num-seeds", "3", "--run-name", "s", "--save-model", "--eval-episodes", "1"], tmp_path
    )
    assert together.returncode == 0, together.stderr
    assert "Traceback" not in together.stderr and "off at iteration" not in together.stderr
    runs = tmp_path / "runs"
    assert sorted(p.name for p in runs.iterdir()) == ["s__1", "s__2", "s__3"]
    for seed in (1, 2, 3):
        command = recorded_command(runs / f"s__{seed}")
        assert command == ["ppo_continuous.py", *flags, "--save-model", "--eval-episodes", "1", f"--seed={seed}",
                           f"--run-name=s__{seed}"]  # fmt: skip
        assert f"seed {seed}: ppo_continuous.py: completed at step 768; run folder runs/s__{seed}" in together.stdout
        log = (runs / f"s__{seed}" / "output.log").read_text()
        assert f"completed at step 768; run folder runs/s__{seed}" in log
    alone = run_recorded_singles(tmp_path, [runs / f"s__{seed}" for seed in (1, 2, 3)])
    for seed in (1, 2, 3):
        assert_identical(runs / f"s__{seed}", alone / "runs" / f"s__{seed}")
        kinds = {"events" if p.name.startswith("events.") else p.name for p in (runs / f"s__{seed}").iterdir()}
        single = {
            "events" if p.name.startswith("events.") else p.name for p in (alone / "runs" / f"s__{seed}").iterdir()
        }
        assert kinds == single | {"output.log"}
    assert all_scalars(runs / "s__1")["losses/value_loss"] != all_scalars(runs / "s__2")["losses/value_loss"]
    # the closing table: each seed's final return, their mean, std and t-interval, and the TensorBoard command
    finals = [
        json.loads((runs / f"s__{s}" / "summary.json").read_text())["mean_return_last_episodes"] for s in (1, 2, 3)
    ]
    mean, std, (low, high) = seed_statistics.mean_std_interval(finals)
    assert f"mean {mean:.2f} over 3 seeds, std {std:.2f}, 95% t-interval [{low:.2f}, {high:.2f}]" in together.stdout
    assert "tensorboard --logdir_spec seed1:runs/s__1,seed2:runs/s__2,seed3:runs/s__3" in together.stdout
    for seed, final in zip((1, 2, 3), finals):
        assert any(line.split()[:2] == [str(seed), "completed"] and line.endswith(f"{final:.2f}")
                   for line in together.stdout.splitlines()), together.stdout  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("edit", ["seed_all_layers", "seed_random_layers", "seed_state_everywhere"])
def test_edits_that_keep_state_anywhere_train_in_every_seed_as_in_its_single_run(edit, tmp_path):
    """benchmarks/edits.py's SEED_EDITS: the update loop, the training loop, make_learner, the Agent, the loss, random
    layers, and state kept in module globals, an lru_cache, a class attribute, numpy's and torch's global generators,
    an attribute made on first use, an edited Sampler.rollout and the loop reading run.sampler.envs. The copy is run as
    a researcher runs it, renamed my_ppo.py with the stock script beside it: each seed is the copy's single run."""
    folder = edited_copy(tmp_path, edit)
    (folder / "ppo_continuous.py").rename(folder / "my_ppo.py")
    shutil.copy(REPO / "ppo_continuous.py", folder / "ppo_continuous.py")
    # the scheduler of seed_all_layers sets the learning rate. The compiled gradient is left out: what a seed shares
    # with its single run here is the process, and the stock seeds above (compiled) and tests/test_edits.py (each edit
    # compiled and eager) cover the gradient's paths.
    flags = [*RUN, "--no-anneal-lr"]
    together = run_python("my_ppo.py", [*flags, "--num-seeds", "2", "--run-name", "e"], folder, repo_on_path=False)
    assert together.returncode == 0, together.stderr
    assert "Traceback" not in together.stderr, together.stderr
    if edit == "seed_random_layers":  # each seed's start-up line, behind its seed
        for seed in (1, 2):
            assert f"seed {seed}: my_ppo.py: fast acting off: a random layer" in together.stderr
    runs = [folder / "runs" / f"e__{seed}" for seed in (1, 2)]
    alone = run_recorded_singles(folder, runs, script="my_ppo.py")
    for run_dir in runs:
        assert_identical(run_dir, alone / "runs" / run_dir.name)
    stock = run_forked(
        folder / "ppo_continuous.py", [*flags, "--seed", "1", "--run-name", "stock"], folder, repo_on_path=False
    )
    assert stock.returncode == 0, stock.stderr
    edited, unedited = all_scalars(runs[0]), all_scalars(folder / "runs" / "stock")
    assert edited["losses/value_loss"] != unedited["losses/value_loss"], "the copy's seeds train its own code"


@pytest.mark.slow
def test_a_grid_of_an_edited_copy_trains_every_configuration_and_seed_as_its_single_run(tmp_path):
    """--num-seeds 2 --grid learning-rate=1e-4,1e-3 on a researcher's copy (my_ppo.py, which keeps state in globals,
    caches and generators): 4 runs, each the single run its run.json records, bit for bit; the closing lines name both
    configurations, compare the second with the first, and point to the plot of their curves."""
    folder = edited_copy(tmp_path, "seed_state_everywhere")
    (folder / "ppo_continuous.py").rename(folder / "my_ppo.py")
    shutil.copy(REPO / "ppo_continuous.py", folder / "ppo_continuous.py")
    flags = [*RUN]
    grid = ["--num-seeds", "2", "--run-name", "g", "--grid", "learning-rate=1e-4,1e-3"]
    together = run_python("my_ppo.py", [*flags, *grid], folder, repo_on_path=False)
    assert together.returncode == 0, together.stderr
    assert "Traceback" not in together.stderr, together.stderr
    configs = ["learning-rate=0.0001", "learning-rate=0.001"]
    runs = [folder / "runs" / f"g__{config}__{seed}" for config in configs for seed in (1, 2)]
    assert sorted(p.name for p in (folder / "runs").iterdir() if p.is_dir()) == sorted(run.name for run in runs)
    for run in runs:
        config, seed = run.name.split("__")[1:]
        assert recorded_command(run) == ["my_ppo.py", *flags, f"--{config}", f"--seed={seed}", f"--run-name={run.name}"]
        assert f"{config} seed {seed}: my_ppo.py: completed at step 768" in together.stdout
    alone = run_recorded_singles(folder, runs, script="my_ppo.py")
    for run in runs:
        assert_identical(run, alone / "runs" / run.name)
    assert all_scalars(runs[0])["losses/value_loss"] != all_scalars(runs[2])["losses/value_loss"], "the rates differ"
    lines = together.stdout.splitlines()
    assert "my_ppo.py: 2 configurations x 2 seeds" in lines
    for config in configs:
        assert any(line.startswith(f"{config}: final return") and "over 2 seeds" in line for line in lines), lines
    comparison = [line for line in lines if line.startswith(f"{configs[1]} vs {configs[0]}: difference ")]
    assert len(comparison) == 1 and "the least p 2 + 2 seeds allow: 0.333" in comparison[0], lines
    if importlib.util.find_spec("matplotlib") is None:  # matplotlib is a benchmark requirement, not a training one
        assert "no plot of the curves: matplotlib is not installed (pip install matplotlib)" in lines
    else:
        assert f"curves of the configurations (mean and std over seeds): {os.path.join('runs', 'g.png')}" in lines
        assert (folder / "runs" / "g.png").stat().st_size > 0


@pytest.mark.slow
def test_a_configuration_refused_stops_alone_and_its_line_is_said_once(tmp_path):
    """--grid gamma=1.5,0.99: the first configuration's flags are refused (one line, once), the second trains; the
    closing lines say which configuration did not complete and how to start it, and the exit status is 1."""
    args = [*RUN, "--run-name", "r", "--grid", "gamma=1.5,0.99"]
    result = run_ppo(args, tmp_path)
    assert result.returncode == 1, result.stderr
    refusal = "--gamma must be in (0, 1] and --gae-lambda in [0, 1], got 1.5"
    assert result.stderr.count(refusal) == 1 and "Traceback" not in result.stderr, result.stderr
    summary = json.loads((tmp_path / "runs" / "r__gamma=0.99__1" / "summary.json").read_text())
    assert summary["status"] == "completed" and not (tmp_path / "runs" / "r__gamma=1.5__1").exists()
    assert "not completed: gamma=1.5 seed 1; none started: start them alone with: " in result.stdout


@pytest.mark.slow
def test_halfcheetah_seeds_are_their_single_runs_bit_for_bit(tmp_path):
    """On MuJoCo, where float rounding grows into other episodes, a seed is still its single run, every scalar equal."""
    args = ["--env-id", "HalfCheetah-v5", "--total-timesteps", "1024", "--num-steps", "512", "--num-minibatches", "8"]
    args += ["--update-epochs", "2", "--quiet", "--checkpoint-every", "0", "--num-seeds", "2", "--run-name", "h"]
    together = run_ppo(args, tmp_path)
    assert together.returncode == 0, together.stderr
    runs = [tmp_path / "runs" / f"h__{seed}" for seed in (1, 2)]
    alone = run_recorded_singles(tmp_path, runs)
    for run_dir in runs:
        assert_identical(run_dir, alone / "runs" / run_dir.name)


@pytest.mark.slow
def test_a_seed_whose_env_fails_stops_alone_with_its_checkpoint(tmp_path):
    args = ["--env-id", "tests.envs:FailsForSeed2-v0", "--num-steps", "64", "--num-minibatches", "2"]
    args += ["--total-timesteps", "640", "--obs-warmup-steps", "0", "--quiet", "--num-seeds", "3", "--run-name", "f"]
    result = run_ppo(args, tmp_path)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("seed 2: ppo_continuous.py: error: ")]
    assert len(lines) == 1 and "RuntimeError: simulator diverged at step 300 (envs.py:" in lines[0], result.stderr
    runs = tmp_path / "runs"
    failed = json.loads((runs / "f__2" / "summary.json").read_text())
    assert failed["status"] == "failed" and failed["env_steps"] == 256  # four whole iterations before step 300
    assert torch.load(runs / "f__2" / "checkpoint.pt", weights_only=True)["global_step"] == 256
    assert "simulator diverged" in (runs / "f__2" / "output.log").read_text()
    for seed in (1, 3):
        summary = json.loads((runs / f"f__{seed}" / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["env_steps"] == 640
    rows = {
        line.split()[0]: line.split()[1]
        for line in result.stdout.splitlines()
        if line.split()[:1] in (["1"], ["2"], ["3"])
    }
    assert rows == {"1": "completed", "2": "failed", "3": "completed"}, result.stdout
    (row,) = [line for line in result.stdout.splitlines() if line.split()[:2] == ["2", "failed"]]
    assert row.split()[2] == "256" and row.split(None, 4)[4].startswith("the rollout failed: RuntimeError: simulator")
    resume = "python ppo_continuous.py --resume runs/f__1/checkpoint.pt --seed 1 --num-seeds 3"
    assert f"not completed: seed 2; continue every seed with: {resume}" in result.stdout


@pytest.mark.slow
def test_sigterm_checkpoints_every_running_seed_starts_no_new_one_and_resume_continues_them_all(tmp_path):
    """With --overwrite over an earlier launch's folders (all removed at the start, so that none mixes into the new
    results), two seeds at a time, SIGTERM while the third waits."""
    args = ["--env-id", "Pendulum-v1", "--num-steps", "64", "--num-minibatches", "2", "--update-epochs", "2"]
    args += ["--total-timesteps", "1000000", "--checkpoint-every", "0", "--quiet", "--no-compile", "--overwrite"]
    args += ["--num-seeds", "3", "--seed-processes", "2", "--run-name", "c"]
    for seed in (1, 2, 3):  # an earlier launch's folders, completed
        (tmp_path / "runs" / f"c__{seed}").mkdir(parents=True)
        (tmp_path / "runs" / f"c__{seed}" / "summary.json").write_text('{"status": "completed"}')
    proc = start_python(PPO_SCRIPT, args, tmp_path)
    for seed in (1, 2):  # two at a time: seeds 1 and 2 have trained once, seed 3 waits for a free slot
        assert wait_until_trained(tmp_path / "runs" / f"c__{seed}", proc), "the run ended before its first update"
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=SAFETY_NET)
    assert proc.returncode == 143, stderr
    assert "Traceback" not in stderr
    assert not (tmp_path / "runs" / "c__3").exists(), "no new seed starts, and --overwrite removed its old folder"
    steps = []
    for seed in (1, 2):
        folder = tmp_path / "runs" / f"c__{seed}"
        assert json.loads((folder / "summary.json").read_text())["status"] == "interrupted"
        steps.append(torch.load(folder / "checkpoint.pt", weights_only=True)["global_step"])
    assert min(steps) > 0 and all(step % 64 == 0 for step in steps)
    assert "not completed: seed 1, 2, 3; continue every seed with: python ppo_continuous.py --resume " in stdout
    assert "runs/c__1/checkpoint.pt --seed 1 --num-seeds 3" in stdout
    total = max(steps) + 128
    resume = ["--resume", "runs/c__1/checkpoint.pt", "--num-seeds", "3", "--total-timesteps", str(total)]
    resumed = run_ppo(resume, tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "seed 3 starts: it had not started" in resumed.stderr
    for seed in (1, 2, 3):
        folder = tmp_path / "runs" / f"c__{seed}"
        assert torch.load(folder / "checkpoint.pt", weights_only=True)["global_step"] == total
        assert json.loads((folder / "summary.json").read_text())["status"] == "completed"
    resumes = json.loads((tmp_path / "runs" / "c__1" / "run.json").read_text())["resumes"]
    assert len(resumes) == 1 and resumes[0]["at_step"] == steps[0]

    def eager(command: list[str]) -> bool:  # --no-compile, as the run records it
        return "--no-compile" in command

    for seed in (1, 2):  # the launch's flags, those the checkpoints do not carry (--no-compile) included
        (again,) = json.loads((tmp_path / "runs" / f"c__{seed}" / "run.json").read_text())["resumes"]
        assert eager(again["command"]) and "--overwrite" not in again["command"], again["command"]
    seed3 = recorded_command(tmp_path / "runs" / "c__3")  # the launch's flags, with its own seed and folder
    assert eager(seed3)
    assert [launcher.flag_value(seed3, flag) for flag in ("--seed", "--run-name", "--total-timesteps")] == [
        "3",
        "c__3",
        str(total),
    ]


@pytest.mark.slow
def test_a_killed_launcher_or_a_signal_at_start_up_leaves_every_started_seed_its_checkpoint(tmp_path):
    """SIGINT as the seeds start (before their training loops) reaches each at its first update: no traceback, each a
    checkpoint. Then SIGKILL to a launcher mid-run: its seeds, whose console was a pipe to it, get SIGHUP
    (PR_SET_PDEATHSIG; Linux may send it more than once), save their checkpoints and stop, and none is left running;
    each seed's output.log holds the line it printed at its start (the launcher writes each line as it comes)."""
    from tests.conftest import OwnProcesses

    args = ["--env-id", "Pendulum-v1", "--num-steps", "64", "--num-minibatches", "2", "--update-epochs", "2"]
    args += ["--total-timesteps", "1000001", "--checkpoint-every", "0", "--no-compile", "--num-seeds", "2"]
    own = OwnProcesses()
    proc = own.start(PPO_SCRIPT, [*args, "--run-name", "i"], tmp_path)
    while proc.poll() is None and not (tmp_path / "runs" / "i__1").is_dir():  # seed 1 is starting
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=SAFETY_NET)
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    for seed in (1, 2):
        folder = tmp_path / "runs" / f"i__{seed}"
        assert json.loads((folder / "summary.json").read_text())["status"] == "interrupted"
        assert torch.load(folder / "checkpoint.pt", weights_only=True)["global_step"] > 0
    proc = own.start(PPO_SCRIPT, [*args, "--run-name", "k", "--quiet"], tmp_path)
    for seed in (1, 2):
        assert wait_until_trained(tmp_path / "runs" / f"k__{seed}", proc), "the run ended before its first update"
    rounded = "ppo_continuous.py: --total-timesteps 1000001 is rounded down to whole batches of 64 steps"
    logs = [tmp_path / "runs" / f"k__{seed}" / "output.log" for seed in (1, 2)]
    deadline = time.monotonic() + 120  # a safety net: the launcher writes the line once the seed reports its update
    while time.monotonic() < deadline and not all(log.is_file() and rounded in log.read_text() for log in logs):
        time.sleep(0.1)
    proc.kill()
    proc.communicate(timeout=SAFETY_NET)
    assert not own.left_behind(), "a seed kept training after its launcher was killed"
    for seed, log in zip((1, 2), logs):
        folder = tmp_path / "runs" / f"k__{seed}"
        assert json.loads((folder / "summary.json").read_text())["status"] == "interrupted"
        assert torch.load(folder / "checkpoint.pt", weights_only=True)["global_step"] > 0
        assert log.read_text().startswith(rounded), "the seed's line should be in its output.log, not in a buffer"


@pytest.mark.slow
def test_resuming_one_seed_alone_leaves_the_others_and_a_refused_resume_of_all_is_one_line(tmp_path):
    """A flag that --resume refuses, given to --resume ... --num-seeds 2: every seed's refusal said once, in one line,
    exit status 2, no table, and nothing of the seeds' folders touched (output.log included)."""
    args = [*RUN, "--num-seeds", "2", "--run-name", "r"]
    assert run_ppo(args, tmp_path).returncode == 0
    logs = [(tmp_path / "runs" / f"r__{seed}" / "output.log").read_text() for seed in (1, 2)]
    resume_all = ["--resume", "runs/r__1/checkpoint.pt", "--num-seeds", "2", "--gamma", "0.5", "--quiet"]
    refused = run_ppo(resume_all, tmp_path)
    assert refused.returncode == 2 and refused.stdout == "", refused.stdout
    (line,) = refused.stderr.splitlines()
    assert line.startswith("ppo_continuous.py: error: --gamma 0.5 contradicts --resume runs/r__"), line
    assert [(tmp_path / "runs" / f"r__{seed}" / "output.log").read_text() for seed in (1, 2)] == logs
    before = (tmp_path / "runs" / "r__1" / "checkpoint.pt").read_bytes()
    ckpt = str(Path("runs") / "r__2" / "checkpoint.pt")
    resumed = run_ppo(["--resume", ckpt, "--total-timesteps", "1024"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert torch.load(tmp_path / ckpt, weights_only=True)["global_step"] == 1024
    assert (tmp_path / "runs" / "r__1" / "checkpoint.pt").read_bytes() == before


@pytest.mark.slow
def test_flags_that_do_not_fit_are_one_line_said_once_and_the_launcher_imports_no_torch(tmp_path):
    bad_env = run_ppo(["--env-id", "NoSuchEnv-v0", "--num-seeds", "3", "--quiet"], tmp_path)
    assert bad_env.returncode == 2, bad_env.stderr
    assert bad_env.stderr.strip().splitlines() == [
        "ppo_continuous.py: error: cannot make env 'NoSuchEnv-v0': Environment `NoSuchEnv` doesn't exist."
    ], bad_env.stderr
    assert not (tmp_path / "runs").exists()
    (tmp_path / "runs" / "x__2").mkdir(parents=True)
    # -X importtime in the launcher only: its own imports, in one line each on its stderr
    taken = subprocess.run(
        [sys.executable, "-X", "importtime", str(PPO_SCRIPT), *RUN, "--num-seeds", "3", "--run-name", "x"],
        cwd=tmp_path, capture_output=True, text=True, timeout=SAFETY_NET,
    )  # fmt: skip
    assert taken.returncode == 2
    assert (
        "ppo_continuous.py: error: runs/x__2 already exists: continue the seeds with --resume runs/x__2/checkpoint.pt "
        "--seed 1 --num-seeds 3, or start them afresh with --overwrite"
    ) in taken.stderr
    imported = [line.split("|")[-1].strip() for line in taken.stderr.splitlines() if line.startswith("import time:")]
    assert "launcher" in imported and "torch" not in imported and "numpy" not in imported
    refused = [
        (run_ppo(["--num-seeds", "0"], tmp_path), "ppo_continuous.py: error: --num-seeds must be positive, got 0"),
        (run_ppo(["--num-seeds", "2", "--eval-checkpoint", "m"], tmp_path), "--eval-checkpoint evaluates one policy"),
        (run_ppo(["--num-seeds", "2", "--seed-processes", "-1"], tmp_path), "--seed-processes must be >= 0, got -1"),
        (run_ppo(["--num-seeds", "2", "--seed=-1"], tmp_path), "ppo_continuous.py: error: --seed must be >= 0, got -1"),
        (run_ppo(["--seed=-1"], tmp_path), "ppo_continuous.py: error: --seed must be >= 0 (numpy's and gymnasium's"),
        (run_ppo(["--resume", "runs/nothing/checkpoint.pt", "--num-seeds", "2"], tmp_path), "no run folder at runs/no"),
        (run_ppo(["--ray-address", "auto"], tmp_path), "--ray-address sends the runs of --num-seeds or --grid to a"),
        (run_ppo(["--grid", "seed=1,2"], tmp_path), "ppo_continuous.py: error: --grid seed=1,2: the launcher's flag"),
        (run_ppo(["--grid", "nope=1,2"], tmp_path), "--grid nope=1,2: ppo_continuous.py has no flag --nope"),
        (run_ppo(["--num-seeds", "2.5"], tmp_path), "ppo_continuous.py: error: --num-seeds takes a whole number"),
        (
            run_python(REPO / "dppo_ray.py", ["--num-seeds", "2"], tmp_path, timeout=SAFETY_NET),
            "dppo_ray.py: error: --num-seeds is ppo_continuous.py's: run each seed of dppo_ray.py as a run of its own",
        ),
    ]
    for result, line in refused:
        assert result.returncode == 2, result.stderr
        assert line in result.stderr and "Traceback" not in result.stderr
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["x__2"]


def work_folders(run_name: str, since: float) -> list[Path]:
    """A cluster seed's folders on its nodes, in progress, written since `since` (time.time()): each node's temporary
    folder is this machine's here, where a killed worker's may be left over."""
    from ray_cluster import WORK_PREFIX

    folders = glob.glob(os.path.join(tempfile.gettempdir(), f"{WORK_PREFIX}*", "runs", run_name))
    return [Path(folder) for folder in folders if os.path.getmtime(folder) >= since]


def training_on_a_node(run_name: str, since: float) -> bool:
    return any(trained_once(folder) for folder in work_folders(run_name, since))


def wait_for(proc: subprocess.Popen, ready) -> None:
    """Wait until `ready()` holds, or fail with the launcher's output if it ends first."""
    while proc.poll() is None and not ready():
        time.sleep(0.5)
    assert proc.poll() is None, proc.communicate()[1][-3000:]


def table_statuses(stdout: str) -> dict[int, str]:
    """Each seed's status in the closing table of a launch without --grid."""
    rows = [line.split("  ") for line in stdout.splitlines() if line[:6].strip().isdigit()]
    return {int(row[0]): row[1].strip() for row in (list(filter(None, row)) for row in rows)}


def assert_one_run_at_a_time_per_node(folders: list[Path]) -> set[str]:
    """No node trained two runs at once (each run's span on its node, from its node.json); returns the nodes."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for folder in folders:
        node = json.loads((folder / "node.json").read_text())
        spans.setdefault(node["node_id"], []).append((node["started"], node["ended"]))
    for node_id, node_spans in spans.items():
        node_spans.sort()
        for (_, ended), (started, _) in zip(node_spans, node_spans[1:]):
            assert started >= ended, f"node {node_id[:8]} trained two runs at once: {node_spans}"
    return set(spans)


@pytest.mark.slow
def test_seeds_on_a_ray_cluster_of_two_1_cpu_nodes_one_a_node_stop_come_home_resume_and_survive_its_loss(
    tmp_path, monkeypatch
):
    """3 seeds on a ray.cluster_utils.Cluster of two 1-CPU nodes: two train, one a node, the third waits; SIGTERM to the
    launcher stops both with a checkpoint, said as stopped, their folders come home and the third never starts. The
    continue line resumes the two and starts the third, and all come home done, spread over both nodes. A grid of
    4 runs (--num-seeds 2 --grid learning-rate=1e-4,1e-3) brings its folders home; no node ever trains two runs at once
    (their spans in node.json). Last, the cluster shut down under a launch: one line, exit 1 within a minute, the table,
    and the folders that had come home kept."""
    from tests.test_sweeps import tagged_cluster

    cluster = tagged_cluster(monkeypatch, 1)
    try:
        worker = cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        address = ["--ray-address", cluster.address]
        args = ["--env-id", "Pendulum-v1", "--num-steps", "64", "--num-minibatches", "2", "--update-epochs", "2"]
        args += ["--checkpoint-every", "0", "--quiet"]
        launch = [*args, "--total-timesteps", "300000", "--num-seeds", "3", "--run-name", "k", *address]
        launched = time.time()
        proc = cluster.own.start(PPO_SCRIPT, launch, tmp_path)
        wait_for(proc, lambda: sum(training_on_a_node(f"k__{seed}", launched) for seed in (1, 2, 3)) >= 2)
        started = [seed for seed in (1, 2, 3) if work_folders(f"k__{seed}", launched)]
        assert len(started) == 2, f"seeds {started} started on a cluster of 2 CPUs"
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=SAFETY_NET)
        assert proc.returncode == 143, stderr[-3000:]
        assert "Traceback" not in stderr and "failed" not in stderr, stderr[-3000:]
        came_home = [seed for seed in (1, 2, 3) if (tmp_path / "runs" / f"k__{seed}").is_dir()]
        assert came_home == started, stderr[-3000:]  # the third waited for a CPU, and never started
        steps = []
        for seed in came_home:
            folder = tmp_path / "runs" / f"k__{seed}"
            assert json.loads((folder / "summary.json").read_text())["status"] == "interrupted", stderr[-3000:]
            steps.append(torch.load(folder / "checkpoint.pt", weights_only=True)["global_step"])
            assert "interrupted at step" in (folder / "output.log").read_text()
            assert f"stopped seed {seed} on " in stderr and ", with its checkpoint" in stderr
        expected = {seed: "interrupted" if seed in came_home else "not started" for seed in (1, 2, 3)}
        assert table_statuses(stdout) == expected, stdout
        continuing = next(line for line in stdout.splitlines() if line.startswith("not completed: seed 1, 2, 3;"))
        command = shlex.split(continuing.split(" with: ", 1)[1])
        assert command[:2] == ["python", "ppo_continuous.py"] and command[-2:] == address, continuing
        total = max(steps) + 128
        resumed = cluster.own.run(PPO_SCRIPT, [*command[2:], "--total-timesteps", str(total)], tmp_path)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        for seed in (1, 2, 3):
            folder = tmp_path / "runs" / f"k__{seed}"
            summary = json.loads((folder / "summary.json").read_text())
            assert summary["status"] == "completed" and summary["env_steps"] == total
            assert launcher.flag_value(recorded_command(folder), "--seed") == str(seed)
            assert f"done seed {seed} on " in resumed.stderr
        nodes = assert_one_run_at_a_time_per_node([tmp_path / "runs" / f"k__{seed}" for seed in (1, 2, 3)])
        assert nodes == {cluster.head_node.node_id, worker.node_id}, "the seeds should be spread over both nodes"
        assert "tensorboard --logdir_spec seed1:runs/k__1,seed2:runs/k__2,seed3:runs/k__3" in resumed.stdout
        # a grid on the same cluster: every configuration's seeds are Ray tasks, and every folder comes home
        grid = [*args, "--total-timesteps", "256", "--num-seeds", "2", "--run-name", "g", *address]
        grid += ["--grid", "learning-rate=1e-4,1e-3"]
        gridded = cluster.own.run(PPO_SCRIPT, grid, tmp_path)
        assert gridded.returncode == 0, gridded.stderr[-3000:]
        configs = ("learning-rate=0.0001", "learning-rate=0.001")
        folders = [tmp_path / "runs" / f"g__{config}__{seed}" for config in configs for seed in (1, 2)]
        for folder in folders:
            summary = json.loads((folder / "summary.json").read_text())
            assert summary["status"] == "completed" and summary["env_steps"] == 256
            assert list(folder.glob("events.*"))
        for config in configs:
            for seed in (1, 2):
                assert f"done {config} seed {seed} on " in gridded.stderr
        assert_one_run_at_a_time_per_node(folders)
        assert "learning-rate=0.001 vs learning-rate=0.0001: difference " in gridded.stdout
        # the cluster goes away under a launch: two seeds have come home, the third is training
        launch = [*args, "--total-timesteps", "8000", "--num-seeds", "3", "--run-name", "x", *address]
        launched = time.time()
        proc = cluster.own.start(PPO_SCRIPT, launch, tmp_path)

        def home() -> list[int]:
            return [seed for seed in (1, 2, 3) if (tmp_path / "runs" / f"x__{seed}" / "node.json").is_file()]

        wait_for(proc, lambda: len(home()) == 2)
        (lost,) = {1, 2, 3} - set(home())
        wait_for(proc, lambda: training_on_a_node(f"x__{lost}", launched))
        cluster.shutdown()
        shut_down = time.monotonic()
        stdout, stderr = proc.communicate(timeout=SAFETY_NET)
        assert time.monotonic() - shut_down < 60, stderr[-3000:]
        assert proc.returncode == 1 and "Traceback" not in stderr, stderr[-3000:]
        said = [line for line in stderr.splitlines() if "lost the cluster" in line]
        assert len(said) == 1 and "1 of 3 runs lost with it; the 2 that ended are kept in runs" in said[0], stderr
        for seed in home():
            assert json.loads((tmp_path / "runs" / f"x__{seed}" / "summary.json").read_text())["status"] == "completed"
        assert table_statuses(stdout) == {seed: "lost" if seed == lost else "completed" for seed in (1, 2, 3)}, stdout
    finally:
        cluster.shutdown()


# ---------------------------------------------------------------------------------------------------------------------
# The launcher's parts
# ---------------------------------------------------------------------------------------------------------------------
def test_launcher_flags_are_taken_out_and_every_other_flag_kept_in_order():
    argv = [
        "--env-id",
        "Hopper-v5",
        "--num-seeds=4",
        "--seed",
        "3",
        "--quiet",
        "--run_name",
        "x",
        "--seed-processes",
        "2",
    ]
    assert launcher.without_launcher_flags(argv) == ["--env-id", "Hopper-v5", "--quiet"]
    assert launcher.command_flags(argv) == {
        "--env-id": "Hopper-v5",
        "--num-seeds": "4",
        "--seed": "3",
        "--quiet": None,
        "--run-name": "x",
        "--seed-processes": "2",
    }
    assert launcher.flag_value(argv, "--run-name") == "x" and launcher.flag_value(argv, "--num-seeds") == "4"
    assert launcher.asked(argv) and not launcher.asked([*argv, "--help"])
    assert not launcher.asked(["--num-seeds", "1"]) and launcher.asked(["--num-seeds", "two"])  # said in one line
    assert launcher.asked(["--grid", "learning-rate=1e-4,1e-3"]) and launcher.asked(["--ray-address", "auto"])
    assert launcher.script_defaults(str(PPO_SCRIPT))["env_id"] == "HalfCheetah-v5"


def test_new_seeds_are_the_single_runs_of_this_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    seeds = launcher.new_seeds(str(PPO_SCRIPT), ["--env-id", "Hopper-v5", "--num-seeds", "2", "--seed", "5"])
    assert [s.seed for s in seeds] == [5, 6]
    names = [s.run_dir for s in seeds]
    assert names[0].startswith(os.path.join("runs", "Hopper-v5__ppo_continuous__")) and names[0].endswith("__5")
    assert seeds[1].flags == ["--env-id", "Hopper-v5", "--seed=6", f"--run-name={os.path.basename(names[1])}"]


def test_a_grid_is_every_combination_of_its_values_written_one_way_each(tmp_path, monkeypatch):
    """--grid FLAG=V1,V2 ...: the first axis outermost, each value written one way for its flag's type (1e-4 and
    0.0001 are one configuration), switches as --flag/--no-flag; the folders say the configuration and the seed; what
    does not fit is one LaunchError naming it. dppo_ray.py's flags include those of the Args it extends."""
    monkeypatch.chdir(tmp_path)
    argv = ["--env-id", "Pendulum-v1", "--num-seeds", "2", "--run-name", "g", "--grid", "learning-rate=1e-4,1e-3"]
    argv += ["norm-adv=true,False", "--quiet"]
    assert launcher.split_grid(argv) == (
        ["--env-id", "Pendulum-v1", "--num-seeds", "2", "--run-name", "g", "--quiet"],
        ["learning-rate=1e-4,1e-3", "norm-adv=true,False"],
    )
    assert launcher.without_launcher_flags(argv) == ["--env-id", "Pendulum-v1", "--quiet"]
    seeds = launcher.new_seeds(str(PPO_SCRIPT), argv)
    assert [(s.config, s.seed) for s in seeds] == [
        (f"learning-rate={lr}__norm-adv={adv}", seed)
        for lr in ("0.0001", "0.001")
        for adv in ("True", "False")
        for seed in (1, 2)
    ]
    last = seeds[-1]
    assert last.run_dir == os.path.join("runs", "g__learning-rate=0.001__norm-adv=False__2")
    assert last.flags == ["--env-id", "Pendulum-v1", "--quiet", "--learning-rate=0.001", "--no-norm-adv", "--seed=2",
                          "--run-name=g__learning-rate=0.001__norm-adv=False__2"]  # fmt: skip
    assert last.name == "learning-rate=0.001__norm-adv=False seed 2"
    dppo = launcher.configurations(str(REPO / "dppo_ray.py"), ["--grid", "clip-coef=0.1,0.2", "sync-every=1,2"])
    assert [label for label, _ in dppo] == [f"clip-coef={c}__sync-every={k}" for c in ("0.1", "0.2") for k in (1, 2)]
    refused = {
        "seed=1,2": "the launcher's flag",
        "nope=1,2": "ppo_continuous.py has no flag --nope",
        "learning-rate=1e-4,0.0001": "give distinct values",
        "learning-rate=a,b": "--learning-rate takes a number",
        "num-steps=64,1.5": "--num-steps takes an integer",
        "norm-adv=yes,no": "--norm-adv is a switch",
        "env-id=Hopper-v5": "--env-id is also given outside the grid",
        "batch-size=64,128": "ppo_continuous.py has no flag --batch-size",
        "learning-rate": "each axis is FLAG=V1,V2",
    }
    for axis, message in refused.items():
        with pytest.raises(launcher.LaunchError, match=message):
            launcher.configurations(str(PPO_SCRIPT), ["--env-id", "Hopper-v5", "--grid", axis])
    with pytest.raises(launcher.LaunchError, match="names --clip-coef twice"):
        launcher.configurations(str(PPO_SCRIPT), ["--grid", "clip-coef=0.1,0.2", "clip-coef=0.3"])
    with pytest.raises(launcher.LaunchError, match="--resume continues the seeds of one configuration"):
        launcher.plan(str(PPO_SCRIPT), ["--resume", "runs/g__1/checkpoint.pt", "--grid", "clip-coef=0.1,0.2"])


def test_the_closing_lines_compare_each_configuration_with_the_first(tmp_path):
    """Per configuration: the final returns' mean, std and t-interval; each against the first: the difference, Welch's
    interval and the exact permutation p beside the least p its seed counts allow."""
    returns = {"clip-coef=0.1": [10.0, 12.0, 11.0], "clip-coef=0.2": [20.0, 23.0, 21.0]}
    ended = []
    for config, finals in returns.items():
        for seed, final in enumerate(finals, start=1):
            folder = tmp_path / f"g__{config}__{seed}"
            folder.mkdir()
            summary = {"status": "completed", "env_steps": 512, "mean_return_last_episodes": final}
            (folder / "summary.json").write_text(json.dumps(summary))
            ended.append(launcher.Ended(launcher.Seed(seed, str(folder), [], config=config), 0))
    lines = launcher.report("my_ppo.py", ended, [], 1)
    assert lines[0] == "my_ppo.py: 2 configurations x 3 seeds"
    a, b = returns["clip-coef=0.1"], returns["clip-coef=0.2"]
    for config, finals in returns.items():
        mean, std, (low, high) = seed_statistics.mean_std_interval(finals)
        expected = f"{config}: final return (each seed's mean over its last episodes): mean {mean:.2f} over 3 seeds, "
        assert expected + f"std {std:.2f}, 95% t-interval [{low:.2f}, {high:.2f}]" in lines
    low, high = seed_statistics.welch_interval(b, a)
    p = seed_statistics.permutation_pvalue(b, a)
    assert p == pytest.approx(0.1)  # every seed of one above every seed of the other: the least p of 3 + 3 seeds
    assert (
        f"clip-coef=0.2 vs clip-coef=0.1: difference +{np.mean(b) - np.mean(a):.2f}, Welch 95% interval "
        f"[{low:.2f}, {high:.2f}], permutation p = {p:.3f} (the least p 3 + 3 seeds allow: 0.100); too few seeds for "
        "p < 0.05"
    ) in lines


def test_the_t_interval_is_students_for_few_seeds():
    from scipy import stats

    for df in (1, 2, 2.1427, 4, 9, 29, 30, 31, 50, 200):  # Welch's degrees of freedom are not whole
        for probability in (0.9, 0.975, 0.995):
            expected = stats.t.ppf(probability, df)
            assert seed_statistics.t_quantile(probability, df) == pytest.approx(expected, rel=1e-9), (df, probability)
    values = [1.0, 2.0, 4.0]
    mean, std, (low, high) = seed_statistics.mean_std_interval(values)
    half = stats.t.ppf(0.975, 2) * np.std(values, ddof=1) / np.sqrt(3)
    assert mean == pytest.approx(7 / 3) and std == pytest.approx(np.std(values, ddof=1))
    assert (low, high) == pytest.approx((mean - half, mean + half))
    assert seed_statistics.mean_std_interval([5.0]) == (5.0, None, None)


def test_a_seed_is_judged_by_the_summary_its_run_wrote(tmp_path):
    """A signal that came as a seed was closing does not undo its completed summary; an earlier run's summary in the
    folder says nothing of a run that failed now."""
    folder = tmp_path / "runs" / "x__1"
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text('{"status": "completed", "env_steps": 512}')
    seed = launcher.Seed(1, str(folder), [])
    written = os.path.getmtime(folder / "summary.json")
    assert launcher.seed_status(launcher.Ended(seed, -2, started=written - 5)) == "completed"
    assert launcher.seed_status(launcher.Ended(seed, 1, started=written + 5)) == "exit 1"
    assert launcher.seed_status(launcher.Ended(seed, -15, started=written + 5)) == "killed by SIGTERM"
    assert launcher.seed_status(launcher.Ended(seed, 143, started=written + 5)) == "stopped by SIGTERM"
    assert launcher.seed_status(launcher.Ended(seed, 124, started=written - 5)) == "timed out"
    assert launcher.seed_status(launcher.Ended(seed, 0, started=written + 5)) == "completed"  # nothing left to do


# A seed for the launcher's own tests, without torch: it makes its folder, prints a line, reports its progress through
# the launcher's pipe as a run does, then behaves as its role says; the file `go` ends the healthy and the silent one
# (or, as a safety net for a launcher that never names the silent one, two minutes)
FAKE_SEED = """
import os, signal, sys, time
role, folder, go = sys.argv[1:]
deadline = time.monotonic() + 120
os.makedirs(folder)
progress = os.fdopen(int(os.environ["PPO_PROGRESS_FD"]), "w", buffering=1)
print(role + " starts", flush=True)
if role == "healthy":
    step = 0
    while not os.path.exists(go) and time.monotonic() < deadline:
        step = min(step + 10, 990)
        progress.write(f"{step} 1000 -5.0\\n")
        time.sleep(0.05)
    progress.write("1000 1000 -5.0\\n")
elif role == "silent":
    progress.write("100 1000 nan\\n")
    progress.write("200 1000 nan\\n")
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.05)
    print("fake.py: error: --rollout-timeout: env 1 of 1 did not answer within 1 s", file=sys.stderr, flush=True)
    sys.exit(124)
elif role == "killed":
    progress.write("300 1000 nan\\n")
    os.kill(os.getpid(), signal.SIGKILL)
else:
    progress.write("200 1000 nan\\n")
    print("Traceback (most recent call last):\\nRuntimeError: boom", file=sys.stderr, flush=True)
    sys.exit(1)
"""


def test_the_launcher_names_a_silent_seed_and_says_why_each_seed_ended(tmp_path, monkeypatch):
    """A seed without a progress report for longer than the launcher's rule allows is named on the progress line; it
    then stops on its rollout timeout (exit status 124, its error last on stderr): "timed out", with that line as its
    cause, while the healthy seed goes on and completes. A seed killed mid-run is "killed by SIGKILL" and one that
    crashed "exit 1" with its last line; each row has the steps its progress last reported, and each output.log the
    line its seed printed."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fake.py").write_text(FAKE_SEED)
    go = tmp_path / "go"
    roles = ["healthy", "silent", "killed", "crashes"]
    folders = [os.path.join("runs", f"f__{k}") for k in range(1, len(roles) + 1)]
    commands = [[sys.executable, "fake.py", role, folder, str(go)] for role, folder in zip(roles, folders)]
    seeds = [launcher.Seed(k, command[3], [], command=command) for k, command in enumerate(commands, start=1)]
    launch = launcher.Launch("fake.py", seeds, len(seeds), quiet=False)
    launch.stall_floor = 2.0  # the floor (60 s) lowered; the silent seed's reports came at once, the healthy's 20 a s
    shown = []
    progress_line = launch.progress_line

    def seen() -> str:
        line = progress_line()
        shown.append(line)
        if "seed 2: no progress for " in line:
            go.touch()
        return line

    launch.progress_line = seen
    ended = launch.run()
    assert any(" runs done; returns 1:-5 2:n/a" in line for line in shown), shown
    named = [line for line in shown if "seed 2: no progress for " in line]
    assert named and not any("seed 1: no progress" in line for line in shown), named
    lines = launcher.report("fake.py", ended, [], 1)
    assert lines[1].split() == ["seed", "status", "steps", "final", "return", "cause"], lines
    assert lines[2].split() == ["1", "completed", "1000", "n/a"], lines
    assert lines[3].split()[:5] == ["2", "timed", "out", "200", "n/a"], lines
    assert lines[3].endswith("n/a           --rollout-timeout: env 1 of 1 did not answer within 1 s"), lines
    assert lines[4].split() == ["3", "killed", "by", "SIGKILL", "300", "n/a"], lines
    assert lines[5].split() == ["4", "exit", "1", "200", "n/a", "RuntimeError:", "boom"], lines
    assert launcher.exit_status(ended, [], None) == 1
    for k, role in enumerate(roles, start=1):  # stdout's and stderr's lines, each read by a thread, may interleave
        assert f"{role} starts" in (tmp_path / "runs" / f"f__{k}" / "output.log").read_text().splitlines()


def test_no_closing_line_offers_a_checkpoint_that_was_not_saved(tmp_path, monkeypatch):
    """A second signal before any checkpoint: the run's closing line says none was saved, and the launcher's line
    starts the seeds afresh; once one seed has a checkpoint, both offer --resume of it."""
    from types import SimpleNamespace

    import run_management

    monkeypatch.chdir(tmp_path)
    folders = [tmp_path / "runs" / f"c__{seed}" for seed in (1, 2)]
    for folder in folders:
        folder.mkdir(parents=True)
        (folder / "run.json").write_text("{}")
        (folder / "summary.json").write_text('{"status": "interrupted", "env_steps": 512}')
    run_dir = os.path.join("runs", "c__2")
    monitor = SimpleNamespace(run_dir=run_dir, mean_return=lambda: 5.0, args=SimpleNamespace(save_model=False))
    state = SimpleNamespace(global_step=512, recent_returns=[5.0])
    flags = ["--env-id", "Pendulum-v1"]
    seeds = [launcher.Seed(k, os.path.join("runs", f"c__{k}"), [*flags, f"--seed={k}", f"--run-name=c__{k}"])
             for k in (1, 2)]  # fmt: skip
    ended = [launcher.Ended(seed, 130) for seed in seeds]
    closing = run_management.closing_line(monitor, "interrupted", state)
    assert closing.endswith("; no checkpoint was saved: start it afresh with the same command and --overwrite")
    assert "--resume" not in closing
    lines = launcher.report("ppo_continuous.py", ended, [], 1)
    again = "python ppo_continuous.py --env-id Pendulum-v1 --overwrite --seed 1 --num-seeds 2 --run-name c"
    assert lines[-1] == f"not completed: seed 1, 2; none saved a checkpoint: start them afresh with: {again}", lines
    (folders[1] / "checkpoint.pt").write_bytes(b"")
    closing = run_management.closing_line(monitor, "interrupted", state)
    assert closing.endswith(f"; continue with: python {run_management.PROG} --resume {run_dir}/checkpoint.pt")
    resume = f"python ppo_continuous.py --resume {run_dir}/checkpoint.pt --seed 1 --num-seeds 2"
    lines = launcher.report("ppo_continuous.py", ended, [], 1)
    assert lines[-1] == f"not completed: seed 1, 2; continue every seed with: {resume}", lines


def test_resume_finds_the_sibling_seeds_of_a_run_name_with_folders_in_it(tmp_path, monkeypatch):
    """Every seed of a resumed launch runs with the launch's flags, as its run.json records them (each resume's after
    its command's, so the latest value wins; --overwrite left out), those a checkpoint does not carry (--no-compile)
    included, then the flags given beside --resume."""
    monkeypatch.chdir(tmp_path)
    first = tmp_path / "runs" / "exp" / "a__1"
    first.mkdir(parents=True)
    (first / "checkpoint.pt").write_bytes(b"")
    command = ["ppo_continuous.py", "--env-id", "Pendulum-v1", "--seed=1", "--run-name=exp/a__1", "--no-compile"]
    command += ["--overwrite", "--total-timesteps", "1024"]
    resumes = [{"command": ["ppo_continuous.py", "--resume=runs/exp/a__1/checkpoint.pt", "--total-timesteps", "2048"]}]
    record = {"command": command, "hyperparameters": {"seed": 1, "run_name": "exp/a__1"}, "resumes": resumes}
    (first / "run.json").write_text(json.dumps(record))
    argv = ["--resume", "runs/exp/a__1/checkpoint.pt", "--num-seeds", "2", "--quiet"]
    one, two = launcher.resumed_seeds(argv)
    launch_flags = ["--env-id", "Pendulum-v1", "--no-compile", "--total-timesteps", "1024", "--total-timesteps", "2048"]
    assert one.flags == [f"--resume={os.path.join('runs', 'exp', 'a__1', 'checkpoint.pt')}", *launch_flags, "--quiet"]
    assert launcher.flag_value(one.flags, "--total-timesteps") == "2048"
    assert two.run_dir == os.path.join("runs", "exp", "a__2") and not two.fresh
    assert two.flags == [*launch_flags, "--quiet", "--seed=2", "--run-name=exp/a__2"]
    zero = launcher.resumed_seeds([*argv, "--seed", "0"])  # --seed names the first seed of the launch
    assert [s.seed for s in zero] == [0, 1] and zero[1].flags[0].startswith("--resume=")


def test_a_console_whose_reader_went_away_takes_the_rest_quietly():
    read, write = os.pipe()
    stream = SturdyStream(os.fdopen(write, "w", buffering=1))
    os.close(read)
    stream.write("a line nobody reads\n")
    stream.flush()
    assert stream.write("and the next\n") == len("and the next\n")
