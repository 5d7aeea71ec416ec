"""`Family`: one other hub whose envs envhub registers under a prefix, and the id list cache.

An adapter's `register_envs()` runs on `import envhub` (through the `envhub.envs` entry point), so
it must stay cheap: it asks `importlib.metadata` whether the hub's package is installed (no
import), and reads the family's ids from a cache keyed by the package's version. Only the first
registration after installing or upgrading the package imports it to enumerate its registry.
A missing package registers no ids; it records the family as missing, so `envhub list` names the
extra to install and `envhub.make("rg-...")` fails with one line saying the same.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import io
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envhub.errors import EnvhubError, EnvUnavailable
from envhub.tools import tool

CACHE_FORMAT = 4  # 2: records may carry `requires` (envhub.availability); 3: ta- broken games; 4: gem- needs


class AdapterUnavailable(EnvUnavailable):
    """An adapted env whose package is missing, or that needs a download it cannot make offline."""


class UpstreamError(EnvhubError):
    """An adapted env that raised inside its own package's code (a bug there, not in envhub)."""


@contextlib.contextmanager
def no_downloads(owner: str) -> Iterator[None]:
    """Turn any NLTK download the other hub's code tries into AdapterUnavailable, never a network call; silence its
    prints."""
    try:
        import nltk
    except ImportError:
        nltk = None

    def refuse(info_or_id: Any = None, *args: Any, **kwargs: Any) -> bool:
        raise AdapterUnavailable(
            f"{owner} tries to download NLTK data ({info_or_id}); envhub makes no download at run time",
            hint=f"install the data once where the internet is reachable: python -m nltk.downloader {info_or_id}",
        )

    original = nltk.download if nltk is not None else None
    if nltk is not None:
        nltk.download = refuse
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # banners and debug prints of the other hub
            yield
    except LookupError as exc:  # NLTK's "Resource 'words' not found"
        found = re.search(r"Resource \W*(\w+)", str(exc))
        name = found.group(1) if found else "?"
        raise AdapterUnavailable(
            f"{owner} needs the NLTK data {name!r}, which is not installed",
            hint=f"install it once where the internet is reachable: python -m nltk.downloader {name}",
        ) from None
    finally:
        if nltk is not None:
            nltk.download = original


def upstream(owner: str, distribution: str, exc: Exception) -> EnvhubError:
    """The one-line error for an exception raised inside another hub's code."""
    if isinstance(exc, EnvhubError):
        return exc
    version = installed_version(distribution) or "?"
    message = " ".join(str(exc).split())[:300]
    if isinstance(exc, SyntaxError):
        return AdapterUnavailable(
            f"{owner}: {distribution} {version} has source this Python cannot compile ({message})",
            hint="it needs a newer Python (3.12 f-strings); pick another env",
        )
    if isinstance(exc, (ImportError, FileNotFoundError)):
        return AdapterUnavailable(
            f"{owner}: {distribution} {version} lacks a module or data file it needs ({type(exc).__name__}: {message})",
            hint="the published package is incomplete for this env; pick another env",
        )
    return UpstreamError(
        f"{owner} raised inside {distribution} {version}: {type(exc).__name__}: {message}",
        hint=f"a bug in {distribution}, not in envhub; pick another env or report it upstream",
    )


@dataclass(frozen=True)
class Family:
    """A hub adapted into envhub: its package, the extra that installs it, its id prefix and licence."""

    name: str
    distribution: str
    module: str
    extra: str
    prefix: str
    licence: str

    @property
    def install_hint(self) -> str:
        """How a user gets this family."""
        return f"pip install 'envhub[{self.extra}]'"


@dataclass
class FamilyStatus:
    """What one family registered here: how many ids, from which package version, or why none."""

    family: Family
    version: str | None = None
    ids: int = 0
    problem: str = ""
    counts: dict[str, int] = field(default_factory=dict)
    problem_ids: list[str] = field(default_factory=list)


STATUS: dict[str, FamilyStatus] = {}


def installed_version(distribution: str) -> str | None:
    """The installed version of a distribution, or None; never imports it."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def require(family: Family, what: str = "") -> Any:
    """Import the family's module, or raise AdapterUnavailable naming the extra to install."""
    try:
        return importlib.import_module(family.module)
    except ImportError as exc:
        subject = what or f"{family.name} environments"
        raise AdapterUnavailable(
            f"{subject} need the {family.distribution!r} package ({exc})", hint=family.install_hint
        ) from None


def cache_root() -> Path:
    """envhub's cache directory: $ENVHUB_CACHE_DIR, else $ENVHUB_CACHE, else ~/.cache/envhub."""
    root = (
        os.environ.get("ENVHUB_CACHE_DIR")
        or os.environ.get("ENVHUB_CACHE")
        or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "envhub")
    )
    return Path(root)


def _cache_dir() -> Path:
    return cache_root() / "families"


def family_catalogue(family: Family, version: str, build: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The family's id records for this package version: from the cache, else built and cached.

    `build` imports the package and lists its registry; each record is a plain JSON dict the
    adapter turns into `envhub.register` calls.
    """
    # the format in the name: envhub installs of different formats sharing one cache do not rewrite each other's
    path = _cache_dir() / f"{family.extra}-{version}-f{CACHE_FORMAT}.json"
    try:
        cached = json.loads(path.read_text())
        if cached.get("format") == CACHE_FORMAT and cached.get("version") == version:
            return cached["records"]
    except (OSError, ValueError, KeyError, AttributeError):
        pass  # no cache yet, or a broken one: rebuild
    records = build()
    try:  # write atomically: a crash mid-write must not leave a half file that later reads trust
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as handle:
            json.dump({"format": CACHE_FORMAT, "version": version, "records": records}, handle)
        os.replace(handle.name, path)
    except OSError:
        pass  # a read-only home only costs the rebuild next time
    return records


def register_family(
    family: Family, build: Callable[[], list[dict[str, Any]]], register_record: Callable[[dict[str, Any]], str]
) -> FamilyStatus:
    """Register every id of `family` (nothing when its package is missing) and record its status."""
    from envhub.registry import note_missing_family

    status = STATUS[family.name] = FamilyStatus(family)
    version = installed_version(family.distribution)
    if version is None:
        status.problem = f"not installed ({family.install_hint})"
        note_missing_family(family.prefix, f"{family.name} is not installed: {family.install_hint}")
        return status
    status.version = version
    try:
        records = family_catalogue(family, version, build)
    except Exception as exc:  # a broken hub package must not take envhub down
        status.problem = f"cannot list its envs: {type(exc).__name__}: {exc}"
        note_missing_family(
            family.prefix, f"{family.name} {version} could not list its envs ({type(exc).__name__}: {exc})"
        )
        return status
    for record in records:
        try:
            kind = register_record(record)
        except EnvhubError as exc:  # one odd id must not cost the family its other envs
            kind = "skipped"
            status.problem_ids.append(f"{record}: {exc}")
        status.counts[kind] = status.counts.get(kind, 0) + 1
    status.ids = len(records) - status.counts.get("skipped", 0)
    return status


def family_lines() -> list[str]:
    """One line per adapted family for `envhub list`: ids registered, or why none."""
    lines = []
    for status in sorted(STATUS.values(), key=lambda s: s.family.name):
        fam = status.family
        if status.problem:
            lines.append(f"{fam.name:<14} {fam.prefix + '*':<10} 0 ids: {status.problem}")
            continue
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(status.counts.items()))
        lines.append(
            f"{fam.name:<14} {fam.prefix + '*':<10} {status.ids} ids ({kinds}) from {fam.distribution} "
            f"{status.version}, {fam.licence}"
        )
    return lines


# -- text commands: what the game suites (MiniGrid, TextWorld, ScienceWorld, Crafter) share ------------
@tool
def act(action: str) -> str:
    """Take one action in the game.

    Args:
        action: The action, written as the instructions list it (e.g. "go forward", "open door", "move north").
    """
    return action


def command_text(action: str | dict[str, Any]) -> str:
    """The command an agent sent: the argument of its first tool call, else its reply's text, stripped."""
    from envhub.toolcalls import parse_tool_calls

    parsed = parse_tool_calls(action)
    if parsed.calls:
        arguments = parsed.calls[0].arguments
        value = arguments.get("action", next(iter(arguments.values()), "")) if arguments else ""
        return " ".join(str(value).split())
    return parsed.text.strip()


def _normal(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


@dataclass(frozen=True)
class CommandMenu:
    """A short fixed list of actions read from free text: exact names, aliases, then the last one mentioned."""

    names: tuple[str, ...]
    aliases: dict[str, str] = field(default_factory=dict)

    def read(self, text: str) -> str | None:
        """The action `text` names, or None; a model that reasons first and answers last is read by its last
        line, then by the last action named anywhere in the reply."""
        known = {_normal(n): n for n in self.names} | {_normal(a): n for a, n in self.aliases.items()}
        lines = [line for line in text.strip().splitlines() if line.strip()]
        for candidate in (text, *lines[-1:]):
            if _normal(candidate) in known:
                return known[_normal(candidate)]
        normal = _normal(text[-2000:])
        pattern = r"\b(" + "|".join(re.escape(k) for k in sorted(known, key=len, reverse=True)) + r")\b"
        found = re.findall(pattern, normal)
        return known[found[-1]] if found else None

    def unknown(self, text: str) -> str:
        """The observation for a reply that names no action."""
        shown = " ".join(text.split())[:80] or "(empty)"
        return f"Unknown action {shown!r}. Legal actions: {', '.join(self.names)}."
