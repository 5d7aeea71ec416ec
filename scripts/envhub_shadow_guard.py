"""Installed beside envhub (site-packages, run by envhub-shadow-guard.pth at start-up): a directory named `envhub`
without an `__init__.py`, such as a clone's root seen from its parent directory, must not shadow the installed
envhub. Python imports such a directory as an empty namespace package ahead of an editable install's finder;
`envhub.make` then does not exist and gymnasium says `NamespaceNotFound: Namespace envhub not found`. This finder
imports the installed envhub instead, and says which directory was in the way.
"""

from __future__ import annotations

import sys
from importlib.machinery import ModuleSpec, PathFinder


class EnvhubShadowGuard:
    """A meta path finder for the name `envhub` only: the installed package when plain directories would shadow it."""

    @staticmethod
    def find_spec(name: str, path: object = None, target: object = None) -> ModuleSpec | None:
        if name != "envhub":
            return None
        found = PathFinder.find_spec(name)
        if found is None or found.origin is not None:  # nothing on sys.path, or a real package: the usual import
            return None
        for finder in sys.meta_path:  # a namespace of plain directories: the installed package's own finder
            if finder in (EnvhubShadowGuard, PathFinder) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.origin is not None:
                import warnings  # only now: this module runs in every Python start-up of the environment

                shadow = ", ".join(dict.fromkeys(found.submodule_search_locations or []))
                warnings.warn(
                    f"the directory {shadow} (no __init__.py; a clone of envhub?) shadows the installed envhub: "
                    "importing the installed one. Run from inside the clone, or rename the directory.",
                    stacklevel=2,
                )
                return spec
        return None


def install() -> None:
    """Put the guard first on sys.meta_path (once)."""
    if EnvhubShadowGuard not in sys.meta_path:
        sys.meta_path.insert(0, EnvhubShadowGuard)
