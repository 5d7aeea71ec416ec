"""Importing a user's own env module, by module name or `.py` file, so the envs it registers become known.

One helper for every place that takes user code: the CLI's `--import`, a training config's `imports:`, the
Ray env workers (which import the same list the driver did) and the trainer integrations. A module that defines
`register_envs()` (the plugin entry-point convention, docs/authoring.md) has it called after the import, so a
plugin's module works straight from a checkout before it is pip installed.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

from envhub.errors import ConfigError

_loaded: dict[str, ModuleType] = {}  # what was asked for (module name or resolved file) -> the module it gave


def is_file_target(target: str) -> bool:
    """Whether `target` names a file (ends in .py or has a path separator) rather than a module."""
    return target.endswith(".py") or os.sep in target or "/" in target


def resolve_target(target: str, base: str | Path | None = None) -> str:
    """`target` with a relative file path made absolute against `base` (default: the working directory)."""
    if not is_file_target(target):
        return target
    path = Path(target).expanduser()
    return str((Path(base or os.getcwd()) / path).resolve() if not path.is_absolute() else path.resolve())


def load_user_module(target: str, *, option: str = "--import") -> ModuleType:
    """Import a module name or a `.py` file (once per process) and call its `register_envs()` if it has one.

    `option` names where the target came from (`--import`, `imports:`), for the error message.
    """
    target = target.strip()
    if not target:
        raise ConfigError(f"{option} got an empty name", hint="give a module name (my_envs) or a file (./my_envs.py)")
    key = resolve_target(target)
    if key in _loaded:
        return _loaded[key]
    module = _import_file(key, target, option) if is_file_target(target) else _import_name(target, option)
    register_envs = getattr(module, "register_envs", None)
    if callable(register_envs):
        try:
            register_envs()
        except Exception as exc:
            raise ConfigError(
                f"{option} {target}: its register_envs() raised {type(exc).__name__}: {exc}{_where(exc)}",
                hint="fix register_envs() in that module (envhub calls it after importing the module)",
            ) from None
    _loaded[key] = module
    return module


def load_user_modules(targets: Iterable[str], *, option: str = "--import") -> list[ModuleType]:
    """`load_user_module` for each target, in order."""
    return [load_user_module(t, option=option) for t in targets]


def _import_name(name: str, option: str) -> ModuleType:
    cwd = os.getcwd()
    if cwd not in sys.path:  # the console script, unlike `python -m`, does not look in the working directory
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):
            raise ConfigError(
                f"{option} {name}: no module named {name!r} in the working directory or the Python path",
                hint=f"pass the file instead ({option} ./{name.replace('.', '/')}.py), or pip install the package "
                "that provides it",
            ) from None
        raise _failed(option, name, exc, rerun=f"python -c 'import {name}'") from None
    except Exception as exc:
        raise _failed(option, name, exc, rerun=f"python -c 'import {name}'") from None


def _import_file(path_text: str, target: str, option: str) -> ModuleType:
    path = Path(path_text)
    if path.is_dir() and (path / "__init__.py").exists():
        path = path / "__init__.py"
    if not path.is_file():
        raise ConfigError(
            f"{option} {target}: no such file ({path})",
            hint="give the path of a .py file, or a module name importable from the working directory",
        )
    if path.suffix != ".py":
        raise ConfigError(f"{option} {target}: not a Python file", hint="give a .py file or a module name")
    package_dir = path.parent if path.name == "__init__.py" else None  # a package folder, imported as a package
    name = package_dir.name if package_dir else path.stem
    existing = sys.modules.get(name)
    if existing is not None:
        origin = getattr(existing, "__file__", None)
        if origin and Path(origin).resolve() == path.resolve():
            return existing
        raise ConfigError(
            f"{option} {target}: a different module named {name!r} is already imported ({origin or 'built in'})",
            hint=f"rename {path.name} so its module name does not clash",
        )
    # as `python FILE` does: the file's folder goes on the path, so it can import its neighbours
    folder = str((package_dir or path).parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(
        name, path, submodule_search_locations=[str(package_dir)] if package_dir else None
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it: dataclasses, pickling and `name:Class` entry points look it up
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        sys.modules.pop(name, None)
        if isinstance(exc, Exception):
            raise _failed(option, target, exc, rerun=f"python {target}") from None
        raise
    return module


def _failed(option: str, target: str, exc: Exception, rerun: str) -> ConfigError:
    return ConfigError(
        f"{option} {target}: importing it raised {type(exc).__name__}: {exc}{_where(exc)}",
        hint=f"fix the module; `{rerun}` shows the full traceback",
    )


def _where(exc: BaseException) -> str:
    """` (at FILE:LINE)` of the innermost frame outside the import machinery, or ""."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "importlib" not in f.filename]
    if not frames or frames[-1].filename == __file__:
        return ""
    return f" (at {frames[-1].filename}:{frames[-1].lineno})"
