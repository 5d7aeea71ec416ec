"""The environment registry: specs in a dict, mirrored into gymnasium's `envhub/` namespace.

`register()` adds a spec; `make()` builds an env through gymnasium so the usual wrappers apply;
third-party packages add envs through the `envhub.envs` entry-point group.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import re
import sys
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from envhub.errors import EnvNotFound, EnvUnavailable, RegistrationError
from envhub.wrappers import Wrapper, apply_wrappers, check_async_stack

NAMESPACE = "envhub"
ENTRY_POINT_GROUP = "envhub.envs"
_ID_PATTERN = re.compile(r"^[A-Za-z][\w.\-]*-v\d+$")


@dataclass(frozen=True)
class EnvSpec:
    """Everything envhub knows about one registered environment."""

    id: str
    entry_point: str | Callable[..., Any]
    kwargs: dict[str, Any] = field(default_factory=dict)
    max_episode_steps: int | None = None
    tags: tuple[str, ...] = ()
    description: str = ""
    multiagent: bool = False
    source: str = "envhub"
    #: what the env needs from this machine (`envhub.availability`), e.g. ("java",)
    requires: tuple[str, ...] = ()
    #: callables env -> wrapped env applied (innermost first) to every env made from this spec, on both paths
    wrappers: tuple[Callable[[Any], Any], ...] = ()

    @property
    def gym_id(self) -> str:
        """The id under which gymnasium knows this env (`envhub/Name-v0`)."""
        return f"{NAMESPACE}/{self.id}"

    def load(self) -> Callable[..., Any]:
        """Import and return the entry point (class or factory)."""
        if callable(self.entry_point):
            return self.entry_point
        module_name, _, attr = self.entry_point.partition(":")
        try:
            module = importlib.import_module(module_name)
            return getattr(module, attr)
        except (ImportError, AttributeError) as exc:
            raise RegistrationError(
                f"cannot load entry point {self.entry_point!r} of {self.id}: {exc}",
                hint=f"registered by {self.source}; check that the module and attribute exist",
            ) from exc


_registry: dict[str, EnvSpec] = {}
_plugins_loaded = False
_deferred: list[Any] = []  # entry points whose module was mid-import when plugins were loaded
_current_source = "user"  # the package whose entry point is running, recorded in its specs
_missing_families: dict[str, str] = {}  # id prefix -> why that adapted family registered nothing


def _normalize(env_id: str) -> str:
    prefix = NAMESPACE + "/"
    return env_id[len(prefix) :] if env_id.startswith(prefix) else env_id


def register(
    id: str,
    entry_point: str | Callable[..., Any],
    *,
    kwargs: dict[str, Any] | None = None,
    max_episode_steps: int | None = None,
    tags: tuple[str, ...] | list[str] = (),
    description: str = "",
    multiagent: bool = False,
    source: str | None = None,
    requires: tuple[str, ...] | list[str] = (),
    wrappers: tuple[Callable[[Any], Any], ...] | list[Callable[[Any], Any]] = (),
) -> EnvSpec:
    """Register an environment under `id` (e.g. "MyEnv-v0") in envhub and in gymnasium.

    `wrappers` (each a callable env -> wrapped env, such as a gymnasium wrapper class or a `functools.partial` of
    one) wrap every env made from the spec, inside gymnasium's own (`TimeLimit`), and run on the async path too.
    """
    env_id = _normalize(id)
    if not _ID_PATTERN.match(env_id):
        raise RegistrationError(
            f"invalid environment id {id!r}",
            hint="use the form Name-v0: a letter first, then letters, digits, '_', '.', '-', and a version",
        )
    if not (callable(entry_point) or (isinstance(entry_point, str) and ":" in entry_point)):
        raise RegistrationError(
            f"invalid entry point {entry_point!r} for {env_id}",
            hint="pass a class, a factory function, or a 'package.module:Name' string",
        )
    if max_episode_steps is not None and max_episode_steps <= 0:
        raise RegistrationError(f"max_episode_steps must be positive for {env_id}, got {max_episode_steps}")
    not_callable = [w for w in wrappers if not callable(w)]
    if not_callable:
        raise RegistrationError(
            f"wrappers of {env_id} must be callables env -> wrapped env, got {not_callable[0]!r}",
            hint="pass a gymnasium wrapper class, or functools.partial(WrapperClass, **its_arguments)",
        )
    tag_tuple = tuple(tags) + (("multi-agent",) if multiagent and "multi-agent" not in tags else ())
    spec = EnvSpec(
        id=env_id,
        entry_point=entry_point,
        kwargs=dict(kwargs or {}),
        max_episode_steps=max_episode_steps,
        tags=tag_tuple,
        description=description,
        multiagent=multiagent,
        source=source or _current_source,
        requires=tuple(requires),
        wrappers=tuple(wrappers),
    )
    _registry[env_id] = spec
    if not multiagent:
        gym_registry = gym.envs.registration.registry
        gym_registry.pop(spec.gym_id, None)  # re-registering replaces, without gymnasium's warning
        gym.register(
            id=spec.gym_id,
            entry_point=_wrapped_entry_point(spec) if spec.wrappers else entry_point,
            kwargs=dict(spec.kwargs),
            max_episode_steps=max_episode_steps,
        )
    return spec


def _wrapped_entry_point(env_spec: EnvSpec) -> Callable[..., Any]:
    """The entry point gymnasium calls for a spec with wrappers: the env, wrapped (so `gym.make` applies them too)."""

    def make_wrapped(**kwargs: Any) -> Any:
        return apply_wrappers(env_spec.load()(**kwargs), env_spec.wrappers)

    return make_wrapped


def spec(env_id: str) -> EnvSpec:
    """Return the spec of `env_id`, or raise EnvNotFound with the closest ids suggested."""
    load_plugins()
    key = _normalize(env_id)
    if key in _registry:
        return _registry[key]
    for prefix, why in _missing_families.items():
        if key.startswith(prefix):
            raise EnvNotFound(f"unknown environment {env_id!r}: {why}", hint="`envhub list` shows the adapted families")
    raise EnvNotFound(f"unknown environment {env_id!r}", hint=_suggestion(key))


def _suggestion(key: str) -> str:
    ids = sorted(_registry)
    lowered = {i.lower(): i for i in ids}
    close = difflib.get_close_matches(key.lower(), list(lowered), n=3, cutoff=0.5)
    same_name = [i for i in ids if i.rsplit("-v", 1)[0].lower() == key.rsplit("-v", 1)[0].lower()]
    candidates = list(dict.fromkeys(same_name + [lowered[c] for c in close]))
    listing = ("did you mean " + ", ".join(candidates) + "? " if candidates else "") + "`envhub list` shows every id"
    return listing + _OWN_ENVS_HINT


_OWN_ENVS_HINT = (
    "; an env of your own is found once its module is imported (`--import MODULE_OR_FILE` on the command line, "
    "`import` in Python) or its plugin package is pip installed (docs/authoring.md)"
)


def note_missing_family(prefix: str, why: str) -> None:
    """Remember that an adapter registered no ids under `prefix` (e.g. its package is missing), so a
    lookup of such an id says why instead of only suggesting near names."""
    _missing_families[prefix] = why


def list_envs(tag: str | None = None) -> list[EnvSpec]:
    """All registered specs, sorted by id; only those carrying `tag` when given."""
    load_plugins()
    specs = sorted(_registry.values(), key=lambda s: s.id)
    return [s for s in specs if tag is None or tag in s.tags]


def _being_imported(module_name: str) -> bool:
    """Whether `module_name` is in the middle of its own import (it imported envhub, which loads plugins)."""
    module = sys.modules.get(module_name)
    return module is not None and bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def load_plugins() -> None:
    """Call every `envhub.envs` entry point once; a broken plugin warns with its package name.

    A plugin whose module is itself being imported (a user's `import mypkg` that imports envhub) is
    called at the next registry lookup instead, once its module has finished loading.
    """
    global _plugins_loaded, _current_source, _deferred
    if _plugins_loaded and not _deferred:
        return
    entries = _deferred if _plugins_loaded else list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
    _plugins_loaded, _deferred = True, []
    for entry in entries:
        if _being_imported(entry.value.split(":")[0]):
            _deferred.append(entry)
            continue
        package = entry.dist.name if entry.dist is not None else entry.value.split(":")[0]
        _current_source = package
        try:
            register_envs = entry.load()
            register_envs()
        except Exception as exc:  # a plugin must never take the built-in envs down with it
            warnings.warn(
                f"envhub: plugin {entry.name!r} from package {package!r} failed to register its "
                f"environments: {type(exc).__name__}: {exc}. Built-in envs are unaffected; "
                f"fix or uninstall {package!r}.",
                RuntimeWarning,
                stacklevel=2,
            )
        finally:
            _current_source = "user"


class AsyncEnvWrapper(Wrapper):
    """Outermost wrapper of `envhub.make`: `reset`/`step` run gymnasium's wrapper stack, and `areset`/`astep`/
    `aclose` run the same stack on the async path (`envhub.wrappers`); a stack the async path cannot run is refused."""

    def __init__(self, env: gym.Env) -> None:
        check_async_stack(env)
        super().__init__(env)


def as_async(env: Any) -> AsyncEnvWrapper:
    """`env` with `areset`/`astep`/`aclose` that run its whole wrapper stack; an env `envhub.make` returned is
    returned as is. Refuses (RegistrationError) a stack holding a wrapper the async path cannot run."""
    return env if isinstance(env, AsyncEnvWrapper) else AsyncEnvWrapper(env)


def check_available(env_spec: EnvSpec) -> None:
    """Raise EnvUnavailable when this machine cannot run the env (its `requires`), in one line."""
    from envhub.availability import unmet

    found = unmet(env_spec.requires)
    if found is not None:
        raise EnvUnavailable(f"{env_spec.id} cannot run here: {found[0]}", hint=found[1])


def make(env_id: str, *, wrappers: Iterable[Callable[[Any], Any]] = (), **kwargs: Any) -> AsyncEnvWrapper:
    """Build a single-agent env by id (with or without the `envhub/` prefix); kwargs override the spec's.

    `wrappers` (callables env -> wrapped env, innermost first) go around gymnasium's stack; like the spec's own,
    they run on the sync and the async path alike, or are refused here when the async path cannot run them.
    """
    env_spec = spec(env_id)
    check_available(env_spec)
    if env_spec.multiagent:
        raise RegistrationError(
            f"{env_spec.id} is a multi-agent environment",
            hint=f"use envhub.make_multiagent({env_spec.id!r}), or envhub.SelfPlay({env_spec.id!r}) for one seat",
        )
    return AsyncEnvWrapper(apply_wrappers(gym.make(env_spec.gym_id, **kwargs), wrappers))


def make_multiagent(env_id: str, **kwargs: Any) -> Any:
    """Build a multi-agent (PettingZoo) env by id."""
    env_spec = spec(env_id)
    if not env_spec.multiagent:
        raise RegistrationError(
            f"{env_spec.id} is a single-agent environment", hint=f"use envhub.make({env_spec.id!r})"
        )
    check_available(env_spec)
    return env_spec.load()(**{**env_spec.kwargs, **kwargs})
