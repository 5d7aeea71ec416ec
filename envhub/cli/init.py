"""`envhub init NAME`: scaffold an env package a user can test, install and publish.

The package (templates in `init_template/`) holds a ToolEnv in the pattern of docs/authoring.md, a
`register_envs()` behind an `envhub.envs` entry point, tests (gymnasium's `check_env`, a random agent's episode,
the expert, a seed replay) and a README. `pip install -e NAME` then makes `NAME-v0` known to every envhub command.
"""

from __future__ import annotations

import argparse
import importlib.util
import keyword
import re
import string
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from envhub.errors import ConfigError

TEMPLATES = Path(__file__).with_name("init_template")
# output path (formatted with the names) -> template file
FILES = {
    "pyproject.toml": "pyproject.toml.tmpl",
    "README.md": "README.md.tmpl",
    "{module}/__init__.py": "package_init.py.tmpl",
    "{module}/env.py": "env.py.tmpl",
    "tests/test_env.py": "test_env.py.tmpl",
}
_TEMPLATE_NAMES = {"ToolEnv", "Any"}  # what the env template imports
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9]*(?:[-_][A-Za-z0-9]+)*$")


@dataclass(frozen=True)
class ScaffoldNames:
    """Every name the scaffold derives from the user's NAME."""

    name: str  # as given: the folder
    env_id: str  # NAME-v0
    module: str  # the import name: snake case, ending in _env
    class_name: str  # CamelCase
    dist: str  # the pip distribution: envhub-<name>


def scaffold_names(name: str) -> ScaffoldNames:
    """The names for `name`, or ConfigError when it cannot be an env id, a module and a folder."""
    version = re.search(r"-v\d+$", name)
    if version:
        raise ConfigError(f"give the name without a version: {name!r}", hint=f"envhub init {name[: version.start()]}")
    if not _NAME.match(name):
        raise ConfigError(
            f"{name!r} cannot name an env",
            hint="use letters and digits, a letter first, words joined by - or _ (e.g. envhub init TreasureHunt)",
        )
    words = [w for w in re.split(r"[-_]|(?<=[a-z0-9])(?=[A-Z])", name) if w]
    snake = "_".join(w.lower() for w in words)
    class_name = "".join(w[:1].upper() + w[1:] for w in words)
    if keyword.iskeyword(class_name) or class_name in _TEMPLATE_NAMES:
        raise ConfigError(f"{name!r} would clash with a Python name in the scaffold", hint="choose another NAME")
    return ScaffoldNames(
        name=name,
        env_id=f"{name}-v0",
        module=snake if snake.endswith("_env") else f"{snake}_env",
        class_name=class_name,
        dist="envhub-" + snake.replace("_", "-"),
    )


def check_free(names: ScaffoldNames, target: Path) -> None:
    """ConfigError when the folder, the env id or the module name is already taken."""
    from envhub.registry import list_envs

    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ConfigError(
            f"{target} already exists and is not an empty folder",
            hint="choose another NAME or --dir, or move the existing folder away",
        )
    taken = {s.id: s.source for s in list_envs()}
    if names.env_id in taken:
        raise ConfigError(
            f"{names.env_id} is already registered (by {taken[names.env_id]})", hint="choose another NAME"
        )
    if importlib.util.find_spec(names.module) is not None:
        raise ConfigError(
            f"a module named {names.module!r} is already importable here, so the package's would be shadowed",
            hint="choose another NAME",
        )


def scaffold(name: str, parent: str | Path = ".") -> Path:
    """Write the package for `name` into PARENT/NAME and return that folder."""
    names = scaffold_names(name)
    root = Path(parent) / name
    check_free(names, root)
    values = asdict(names)
    for out, template in FILES.items():
        path = root / out.format(**values)
        text = string.Template((TEMPLATES / template).read_text()).substitute(values)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _cmd_init(args: argparse.Namespace) -> int:
    root = scaffold(args.name, args.dir)
    names = scaffold_names(args.name)
    print(f"created {root}/ with {names.env_id} ({names.module}.env.{names.class_name}); next:")
    print(f"  pip install -e {root}")
    print(f"  envhub eval {names.env_id} --agent random")
    print(f"  cd {root} && pytest")
    return 0


def add_commands(sub: Any) -> None:
    """Register `envhub init`."""
    p = sub.add_parser("init", help="scaffold an env package (env, entry point, tests, README) to edit and publish")
    p.add_argument("name", metavar="NAME", help="the env's name: the folder, and the id NAME-v0")
    p.add_argument("--dir", default=".", help="parent folder of the package (default: the working directory)")
    p.set_defaults(handler=_cmd_init)
