"""What several test files share: the repository's root, running a script as a user runs it, reading a run's
TensorBoard scalars, and a perturbed Agent for the update tests. Plain functions, imported with
`from tests.conftest import ...`; imports the tests do not all need are made where they are used."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import ppo_continuous

REPO = Path(__file__).resolve().parent.parent


def script_env(env: Mapping[str, str] | None = None, repo_on_path: bool = True) -> dict[str, str]:
    """This process's environment, with PYTHONPATH the repository (so `--env-id tests.envs:...` imports the test envs)
    unless `repo_on_path` is False, and `env` on top."""
    return {**os.environ, **({"PYTHONPATH": str(REPO)} if repo_on_path else {}), **(env or {})}


def run_python(
    script: str | Path,
    args: Sequence[str] = (),
    cwd: Path | None = None,
    timeout: float = 300,
    env: Mapping[str, str] | None = None,
    *,
    repo_on_path: bool = True,
    **kwargs,
) -> subprocess.CompletedProcess:
    """`python script *args` in `cwd`, to its end, its output captured as text (environment as in script_env)."""
    return subprocess.run(
        [sys.executable, str(script), *args],
        cwd=cwd,
        env=script_env(env, repo_on_path),
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )


def start_python(
    script: str | Path,
    args: Sequence[str] = (),
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    *,
    repo_on_path: bool = True,
    **kwargs,
) -> subprocess.Popen:
    """`python script *args` in `cwd`, started and left running; stdout and stderr piped as text unless `kwargs` say
    otherwise (environment as in script_env)."""
    kwargs = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **kwargs}
    return subprocess.Popen(
        [sys.executable, str(script), *args], cwd=cwd, env=script_env(env, repo_on_path), text=True, **kwargs
    )


PPO_SCRIPT = REPO / "ppo_continuous.py"


def run_ppo(args: Sequence[str], cwd: Path, timeout: float = 240, **kwargs) -> subprocess.CompletedProcess:
    """`python ppo_continuous.py *args` in `cwd`, as a user runs it (run_python)."""
    return run_python(PPO_SCRIPT, args, cwd, timeout, **kwargs)


def tensorboard_events(run_dir: Path, **size_guidance: int) -> EventAccumulator:
    """A run folder's TensorBoard events, loaded, with every scalar kept (TensorBoard keeps only a sample by default);
    `size_guidance` for other kinds, e.g. histograms=0 to keep every histogram too."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, **size_guidance})
    acc.Reload()
    return acc


def scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    """The (step, value) of every scalar a run logged under `tag`."""
    return [(e.step, e.value) for e in tensorboard_events(run_dir).Scalars(tag)]


def perturbed_agent(obs_dim: int = 5, act_dim: int = 2, discrete: bool = False, seed: int = 0) -> ppo_continuous.Agent:
    """An Agent whose initial weights are each moved by seeded Gaussian noise of scale 0.3: ppo_continuous.py's, or
    with `discrete` dppo_ray.py's (the only one that builds a categorical policy)."""
    import torch

    import ppo_continuous

    torch.manual_seed(seed)
    if discrete:
        import dppo_ray

        agent = dppo_ray.Agent(obs_dim, act_dim, discrete=True)
    else:
        agent = ppo_continuous.Agent(obs_dim, act_dim)
    with torch.no_grad():
        for p in agent.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return agent


# ppo_continuous.py's flags for short runs. SMALL: small, fast settings (2 iterations of 4 envs x 64 steps per 512
# steps). VALUE_FIT: a critic fitted on the deterministic test envs (tests/envs.py), without normalization.
# --no-compile: loss.backward(), the same gradient without torch.compile's seconds of start-up (test_edits.py and the
# compiled-gradient tests in test_fast_paths.py run the compiled path)
SMALL = ["--num-envs", "4", "--num-steps", "64", "--num-minibatches", "4", "--update-epochs", "2", "--quiet"]
SMALL += ["--no-compile"]
VALUE_FIT = ["--no-norm-obs", "--no-norm-reward", "--no-clip-vloss", "--gamma", "0.5", "--learning-rate", "3e-3"]
VALUE_FIT += ["--num-envs", "2", "--num-steps", "128", "--num-minibatches", "4", "--quiet", "--no-compile"]
