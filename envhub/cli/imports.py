"""`--import MODULE_OR_FILE`, shared by every command that takes an env id (`envhub.user_modules` does the work).

Commands declare the option with `add_import_option(parser)`; `envhub.cli.main` imports what was given before
the command runs, so an env id the module registers resolves like a built-in one.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

IMPORT_HELP = (
    "import MODULE_OR_FILE first so the envs it registers can be used: a module name (from the working directory "
    "or the Python path) or a .py file; its register_envs() is called if it defines one (repeatable)"
)


def add_import_option(parser: argparse.ArgumentParser) -> None:
    """Give a command the repeatable `--import MODULE_OR_FILE` option (stored in `args.imports`)."""
    parser.add_argument(
        "--import", dest="imports", action="append", default=None, metavar="MODULE_OR_FILE", help=IMPORT_HELP
    )


def apply_imports(args: Any) -> list[str]:
    """Import the command's `--import` targets; returns them resolved (files as absolute paths), in order.

    A target that registers no env gets a warning on stderr, since the command's env id will not resolve.
    """
    from envhub.registry import list_envs
    from envhub.user_modules import load_user_module, resolve_target

    targets = list(dict.fromkeys(getattr(args, "imports", None) or []))
    for target in targets:
        before = {s.id: s for s in list_envs()}
        kinds = _engine_kinds()
        load_user_module(target, option="--import")
        # re-registering an id counts: it is a new spec
        if all(before.get(s.id) is s for s in list_envs()) and _engine_kinds() == kinds:
            print(
                f"envhub: warning: --import {target} registered no env (no envhub.register() call when imported, "
                "no register_envs() function) and no engine kind",
                file=sys.stderr,
            )
    return [resolve_target(t) for t in targets]


def _engine_kinds() -> list[str]:
    """The engine kinds known so far (a module may register one instead of envs); none without the trainer."""
    try:
        from envhub.trainer.engines.kinds import engine_kinds
    except ImportError:
        return []
    return engine_kinds()
