"""A training script's command line, read without importing the script (so without torch): its flags as its parser
reads them, the fields of its `Args` (from its source), and a grid of their values. The launcher reads its command
line with it, benchmarks/learning.py its sweeps' grids and the runs it compares, run_management.py the flags it
refuses. Standard library only.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import os
import re

# The fields a script computes from its flags rather than takes on its command line (checkpoints.computed_flags adds
# those tyro.conf.Suppress keeps off it)
COMPUTED_FLAGS = {"batch_size", "minibatch_size", "num_iterations"}


class LaunchError(Exception):
    """Flags or folders that do not fit: one line, exit status 2."""


def flag_items(argv: list[str]) -> list[tuple[str | None, str | None, list[str]]]:
    """argv as the scripts' parsers read it: (name, value, its items) for each flag, --flag=value, --flag value (the
    next item, unless that is a flag) or a switch (value None), with underscores read as dashes (--run_name is
    --run-name); (None, None, [item]) for an item that belongs to no flag."""
    items = []
    index = 0
    while index < len(argv):
        item = argv[index]
        if not item.startswith("--"):
            items.append((None, None, [item]))
            index += 1
            continue
        name, sep, value = item.partition("=")
        name = name.replace("_", "-")
        if sep:
            items.append((name, value, [item]))
        elif index + 1 < len(argv) and not argv[index + 1].startswith("--"):
            items.append((name, argv[index + 1], argv[index : index + 2]))
            index += 1
        else:
            items.append((name, None, [item]))
        index += 1
    return items


def command_flags(argv: list[str]) -> dict[str, str | None]:
    """{--flag: value} of every flag in argv (flag_items; a switch's value is None); a flag given twice has its last
    value."""
    flags: dict[str, str | None] = {}
    for name, value, _ in flag_items(argv):
        if name is not None:
            flags[name] = value
    return flags


def flag_value(argv: list[str], name: str) -> str | None:
    """The value of the last `name VALUE` or `name=VALUE` in argv (underscores or dashes), else None."""
    return command_flags(argv).get(name)


def split_grid(argv: list[str]) -> tuple[list[str], list[str]]:
    """(argv less --grid, the grid's axes): --grid takes every item after it up to the next flag, each FLAG=V1,V2,..."""
    rest, axes, in_grid = [], [], False
    for item in argv:
        if item == "--grid" or item.startswith("--grid="):
            in_grid = True
            axes += [item.partition("=")[2]] if "=" in item else []
        elif in_grid and not item.startswith("--"):
            axes.append(item)
        else:
            in_grid = False
            rest.append(item)
    return rest, axes


def script_fields(script: str) -> dict[str, tuple[str, object]]:
    """{name: (annotation, literal default)} of the script's `Args` fields that are flags, read from its source (the
    launcher imports no torch), those of an `Args` it extends (dppo_ray.py's: `ppo.Args`, from the module it imports
    as `ppo`) first; a default that is not a literal is None. The fields the script computes (COMPUTED_FLAGS) and
    those kept off its command line (tyro.conf.Suppress) are no flags."""
    try:
        with open(script) as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError):
        return {}
    modules = {}  # the name a module is imported as -> its file beside the script
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                path = os.path.join(os.path.dirname(script), alias.name.replace(".", os.sep) + ".py")
                modules[alias.asname or alias.name] = path
    fields: dict[str, tuple[str, object]] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef) or node.name != "Args":
            continue
        for base in node.bases:
            if isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name) and base.value.id in modules:
                fields |= script_fields(modules[base.value.id])
        for item in node.body:
            if not isinstance(item, ast.AnnAssign) or not isinstance(item.target, ast.Name):
                continue
            annotation = ast.unparse(item.annotation)
            if "Suppress" in annotation or item.target.id in COMPUTED_FLAGS:
                fields.pop(item.target.id, None)
                continue
            default = None
            with contextlib.suppress(ValueError, TypeError, SyntaxError):
                default = ast.literal_eval(item.value) if item.value is not None else None
            fields[item.target.id] = (annotation, default)
    return fields


def script_defaults(script: str) -> dict:
    """The literal defaults of the script's `Args` fields."""
    return {name: default for name, (_, default) in script_fields(script).items() if default is not None}


def grid_configurations(axes: list[str], script: str, reserved: dict[str, str] | None = None) -> list[tuple[str, list]]:
    """(label, flags) of every combination of the grid's values, in the order given (the first is the baseline of
    the comparisons); `axes`: FLAG=V1,V2 each. A label is FLAG=VALUE for each axis, joined by "__", so that the
    folders' names say it; each value is written one way for its flag's type (1e-4 and 0.0001 are one configuration,
    0.0001), and a switch's values are true or false (--flag, --no-flag). `reserved`: flags the grid may not vary, each
    with why. The one reading of a grid: the launcher's --grid and benchmarks/learning.py's."""
    fields = script_fields(script)
    choices: list[tuple[str, list[tuple[str, str]]]] = []
    for axis in axes:
        name, sep, values = axis.partition("=")
        name = name.removeprefix("--").replace("_", "-")
        if not sep or not name or not all(values.split(",")):
            raise LaunchError(f"--grid {axis}: each axis is FLAG=V1,V2 (values separated by commas, none empty)")
        if name in (reserved or {}):
            raise LaunchError(f"--grid {axis}: {reserved[name]}")
        if name.replace("-", "_") not in fields:
            raise LaunchError(f"--grid {axis}: {os.path.basename(script)} has no flag --{name}")
        if name in [chosen for chosen, _ in choices]:
            raise LaunchError(f"--grid names --{name} twice: give all its values in one axis")
        kind = fields[name.replace("-", "_")][0]
        written = [grid_value(name, value, kind) for value in values.split(",")]
        if any(not re.fullmatch(r"[A-Za-z0-9._+-]+", v) or "__" in v for v in written):
            raise LaunchError(f"--grid {axis}: a value is letters, digits and . _ + - (not __): they name folders")
        if len(set(written)) < len(written):
            raise LaunchError(f"--grid {axis}: give distinct values (1e-4 and 0.0001 are one value)")
        if flag_type(kind) == "bool":
            choices.append((name, [(f"{name}={v}", f"--{'' if v == 'True' else 'no-'}{name}") for v in written]))
        else:
            choices.append((name, [(f"{name}={v}", f"--{name}={v}") for v in written]))
    combos: list[tuple[str, list]] = [("", [])]
    for _, options in choices:
        combos = [(f"{label}__{part}".strip("_"), [*flags, flag]) for label, flags in combos for part, flag in options]
    return combos


def optional_switches(argv: list[str], args_type: type) -> list[str]:
    """`argv` with a bare --FLAG or --no-FLAG of a `bool | None` field (tyro gives such a field no switch pair, only
    --FLAG {None,True,False}) written as --FLAG True or --FLAG False."""
    optional = {f"--{f.name.replace('_', '-')}" for f in dataclasses.fields(args_type) if str(f.type) == "bool | None"}
    out = []
    for index, token in enumerate(argv):
        negated = token.replace("--no-", "--", 1) if token.startswith("--no-") else None
        if negated in optional:
            out += [negated, "False"]
        elif token in optional and (argv[index + 1 : index + 2] or ["--"])[0] not in ("True", "False", "None"):
            out += [token, "True"]
        else:
            out.append(token)
    return out


def flag_type(kind: str) -> str:
    """The type a flag's annotation (its text) takes its value as: bool for a switch (a tyro.conf marker's too), else
    the annotation's first alternative (float of `float | None`)."""
    return "bool" if kind == "bool" or kind.endswith("bool]") else kind.split("|")[0].strip()


def grid_value(name: str, value: str, kind: str) -> str:
    """A grid value written one way for its flag's type (the annotation's text): a float as Python writes it (0.0003),
    an int as an int, a switch as True or False, None where the flag takes it, one of a Literal's choices; other
    values as given."""
    if value == "None" and "None" in [part.strip() for part in kind.split("|")]:
        return value
    base = flag_type(kind)
    if base.startswith("Literal[") and base.endswith("]"):
        choices = [str(choice) for choice in ast.literal_eval(base[len("Literal[") : -1] + ",")]
        if value not in choices:
            raise LaunchError(f"--grid {name}={value}: --{name} takes {', '.join(choices)}")
        return value
    try:
        if base == "float":
            return repr(float(value))
        if base == "int":
            return str(int(value))
    except ValueError:
        kind_name = "a number" if base == "float" else "an integer"
        raise LaunchError(f"--grid {name}={value}: --{name} takes {kind_name}") from None
    if base == "bool":
        if value.lower() not in ("true", "false"):
            raise LaunchError(f"--grid {name}={value}: --{name} is a switch; its values are true and false")
        return "True" if value.lower() == "true" else "False"
    return value


def whole_number(argv: list[str], name: str, default: int, least: int) -> int:
    value = flag_value(argv, name)
    try:
        number = default if value is None else int(value)
    except ValueError:
        raise LaunchError(f"{name} takes a whole number, got {value!r}") from None
    if number < least:
        raise LaunchError(f"{name} must be >= {least}, got {number}")
    return number
