"""What throughput.py, scaling.py and learning.py share: where results and the comparison venvs live, the output-folder
flags, the command line as a results file records it, a report printed and written to --out, and running a
benchmark's subprocess."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import subprocess
import sys
import textwrap
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from run_record import cpu_model, last_line, package_version  # noqa: E402, F401 (one definition of each)

RESULTS_DIR = os.path.join(REPO, "benchmarks", "results")  # committed tables and plots (--update-committed)
LOCAL_RESULTS_DIR = os.path.join(RESULTS_DIR, "local")  # git-ignored; each run gets a new <UTC date-time> folder in it

# The comparison venvs: folder (relative to the repository root, git-ignored) and requirements file. Each is created by
# one command, `venv_command(kind)`, run from the repository root.
VENVS = {
    "rllib": ("benchmarks/.venv-rllib", "benchmarks/requirements-rllib.txt"),
    "cleanrl": ("benchmarks/.venv-cleanrl", "benchmarks/requirements-cleanrl.txt"),
}


class BenchError(Exception):
    """Reported as one line on stderr."""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The description as written; flag help wrapped without breaking paths such as benchmarks/.venv-rllib."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(text, width, break_on_hyphens=False)


def venv_command(kind: str) -> str:
    """The one command, run from the repository root, that creates the `kind` venv."""
    folder, requirements = VENVS[kind]
    return f"python3 -m venv {folder} && {folder}/bin/pip install -r {requirements}"


def venvs_epilog(kinds: list[str]) -> str:
    """--help's last lines: the command that creates each comparison venv."""
    lines = [f"  {kind}: {venv_command(kind)}" for kind in kinds]
    return "\n".join(
        ["Comparison venvs, each created by one command run from the repository root (git ignores them):"] + lines
    )


def default_venv_python(kind: str, repo: str = REPO) -> str:
    folder = os.path.join(repo, *VENVS[kind][0].split("/"))
    if os.name == "nt":
        return os.path.join(folder, "Scripts", "python.exe")
    return os.path.join(folder, "bin", "python")


def venv_python(kind: str, given: str | None, repo: str = REPO) -> str:
    """Absolute path of the python that runs `kind` (rllib, cleanrl): `given` (a --*-python flag, relative to the
    working directory) or the default venv in the repository. Raises BenchError, one line, when it does not exist.
    Not resolved through symlinks: a venv's python is a link to the base interpreter."""
    if given:
        path = os.path.abspath(os.path.expanduser(given))
        if not os.path.isfile(path):
            raise BenchError(f"{kind}: --{kind}-python {given} does not exist")
        return path
    path = default_venv_python(kind, repo)
    if not os.path.isfile(path):
        raise BenchError(
            f"{kind} needs its venv, {VENVS[kind][0]}, which does not exist; create it from the repository root with: "
            f"{venv_command(kind)}  (or pass --{kind}-python)"
        )
    return path


def add_output_args(p: argparse.ArgumentParser, files: str) -> None:
    """--out-dir and --update-committed, the same in throughput.py, scaling.py and learning.py."""
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--out-dir",
        default=None,
        help=f"folder for {files} (default: a new benchmarks/results/local/<UTC date-time>/, which git ignores)",
    )
    group.add_argument(
        "--update-committed",
        action="store_true",
        help=f"write {files} into benchmarks/results/, replacing the committed ones that the README quotes",
    )


def resolve_out_dir(args: argparse.Namespace, now: dt.datetime | None = None) -> str:
    """Absolute output folder: benchmarks/results with --update-committed, --out-dir (relative to the working
    directory) when given, else a new benchmarks/results/local/<UTC date-time> folder (git ignores it)."""
    if getattr(args, "update_committed", False):
        return RESULTS_DIR
    if args.out_dir:
        return os.path.abspath(args.out_dir)
    stamp = (now or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H%M%SZ")
    return os.path.join(LOCAL_RESULTS_DIR, stamp)


def display_path(path: str) -> str:
    """A path as it may appear in a results file: relative to the repository when inside it, else with its folder
    elided, so that no absolute path of the machine that ran the benchmark gets committed."""
    if not os.path.isabs(path):
        return path
    if os.path.commonpath([REPO, os.path.abspath(path)]) == REPO:
        return os.path.relpath(path, REPO)
    return os.path.join("...", os.path.basename(path))


def display_command(argv: list[str]) -> str:
    """`python SCRIPT ARGS...` for a results file, through display_path (also in --flag=PATH arguments)."""
    shown = []
    for arg in argv:
        if arg.startswith("--") and "=" in arg:
            flag, value = arg.split("=", 1)
            shown.append(f"{flag}={display_path(value)}")
        else:
            shown.append(display_path(arg))
    return shlex.join(["python", *shown])


def relative_to_cwd(path: str) -> str:
    """For messages on the terminal: the shorter of the path relative to the working directory and the absolute."""
    rel = os.path.relpath(path)
    return rel if len(rel) < len(path) else path


def pyplot():
    """matplotlib.pyplot on the Agg backend: the plots are written to files, and no display may be there."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def print_report(lines: list[str], out: str | None) -> None:
    """A benchmark's report, its lines printed, and written to the file `out` too when one is given (--out)."""
    print("\n".join(lines))
    if out:
        with open(out, "w") as f:
            f.write("\n".join(lines) + "\n")


def subprocess_env(extra_env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a benchmark's subprocess: this process's, with the repository first on PYTHONPATH (a script
    in benchmarks/ imports the repository's modules), matplotlib on Agg (no display may be there) and `extra_env`."""
    env = dict(os.environ)
    paths = [path for path in env.get("PYTHONPATH", "").split(os.pathsep) if path and path != REPO]
    env["PYTHONPATH"] = os.pathsep.join([REPO, *paths])
    env.setdefault("MPLBACKEND", "Agg")
    env.update(extra_env or {})
    return env


def timed_subprocess(
    name: str, argv: list[str], cwd: str, python: str = sys.executable, extra_env: dict[str, str] | None = None
) -> tuple[str, float]:
    """Run `python argv` in cwd in subprocess_env(extra_env); (stdout, wall seconds). A failure raises BenchError with
    the last line it printed."""
    env = subprocess_env(extra_env)
    cmd = [python, *argv]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    except OSError as e:  # no such interpreter, or not executable
        raise BenchError(f"{name} could not start: {e}  [command: {shlex.join(cmd)}]") from None
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        last = last_line(proc.stderr or proc.stdout) or "(no output)"
        raise BenchError(f"{name} failed (exit {proc.returncode}): {last}  [command: {shlex.join(cmd)}]")
    return proc.stdout, seconds


def json_result(name: str, stdout: str) -> dict:
    """The last JSON line a baseline script (sb3_ppo.py, rllib_ppo.py) printed."""
    try:
        return json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])
    except (IndexError, json.JSONDecodeError):
        raise BenchError(f"{name} printed no JSON line; last output: {stdout.strip()[-200:]!r}") from None
