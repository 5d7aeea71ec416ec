"""Operator policy for `envhub serve`: which envs are served, and what a client may set on them.

The operator decides, the client asks. A client's `kwargs` and reset `options` reach an env only
through a `Rule` the operator (or envhub's built-in table for the bundled envs) wrote for that
exact name; everything else is refused with 403 naming the kwarg and the flag that would allow it.
Isolation (`backend`), host paths, pools, limits and timeouts have no built-in rule, so they stay
the operator's; the operator can fix them server-side (`kwargs:` in the policy file). An env that
would run with `backend: local` is refused unless the server was started with `LOCAL_OPT_IN_FLAG`.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import math
import os
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envhub.errors import ConfigError, EnvhubError

LOCAL_OPT_IN_FLAG = "--unsafe-allow-local-backend"
ALLOW_KWARG_FLAG = "--allow-kwarg"
ALLOW_OPTION_FLAG = "--allow-option"
TYPE_NAMES = ("int", "float", "bool", "str", "null", "list", "dict", "path", "any")


class PolicyRefused(EnvhubError):
    """A client request the policy refuses: 400 for a malformed value, 403 for one it may not set."""

    def __init__(self, status: int, message: str, hint: str = "") -> None:
        super().__init__(message, hint)
        self.status = status


@dataclass(frozen=True)
class Rule:
    """What a client may send for one kwarg or option: JSON types, a numeric range, choices, lengths, path roots."""

    types: tuple[str, ...] = ("any",)  #: allowed kinds, from TYPE_NAMES ("float" also accepts integers)
    min: float | None = None  #: lowest number (numbers inside lists too)
    max: float | None = None  #: highest number (numbers inside lists too)
    choices: tuple[Any, ...] | None = None  #: the only values allowed (an enum)
    max_length: int | None = None  #: characters of a string, items of a list or dict
    items: Rule | None = None  #: rule for each item of a list
    under: tuple[str, ...] = ()  #: a "path" must resolve inside one of these directories

    @classmethod
    def from_yaml(cls, where: str, data: Any) -> Rule:
        """A rule from its policy-file form, e.g. {type: int, min: 1, max: 9} or {choices: [a, b]}."""
        if not isinstance(data, dict):
            raise ConfigError(
                f"{where}: a rule must be a mapping, got {data!r}",
                hint="e.g. {type: int, min: 1, max: 9} or {choices: [a, b]}",
            )
        unknown = set(data) - {"type", "min", "max", "choices", "max_length", "items", "under"}
        if unknown:
            raise ConfigError(
                f"{where}: unknown rule field(s) {sorted(unknown)}",
                hint="rule fields: type, min, max, choices, max_length, items, under",
            )
        raw = data.get("type", "any")
        types = tuple(raw if isinstance(raw, list) else [raw])
        bad = [t for t in types if t not in TYPE_NAMES]
        if bad:
            raise ConfigError(f"{where}: unknown type(s) {bad}", hint=f"types: {', '.join(TYPE_NAMES)}")
        choices = data.get("choices")
        items = cls.from_yaml(f"{where}.items", data["items"]) if "items" in data else None
        under = tuple(str(Path(p).expanduser().resolve()) for p in data.get("under", ()))
        if "path" in types and not under:
            raise ConfigError(
                f"{where}: a path rule needs `under: [DIR, ...]`", hint="name the directories clients may point into"
            )
        return cls(
            types,
            data.get("min"),
            data.get("max"),
            tuple(choices) if choices is not None else None,
            data.get("max_length"),
            items,
            under,
        )

    def describe(self) -> str:
        """The rule in a few words, for hints."""
        if self.choices is not None:
            return "one of " + ", ".join(map(repr, self.choices))
        text = " or ".join(self.types)
        if self.min is not None or self.max is not None:
            text += f" in [{'-inf' if self.min is None else self.min}, {'inf' if self.max is None else self.max}]"
        if self.max_length is not None:
            text += f", at most {self.max_length} long"
        if self.items is not None:
            text += f", items: {self.items.describe()}"
        if self.under:
            text += f", under {', '.join(self.under)}"
        return text

    def check(self, what: str, value: Any, bound_hint: str) -> None:
        """Raise PolicyRefused (400 wrong type, 403 out of bounds) unless `value` obeys the rule."""
        if self.choices is not None:
            if not any(type(value) is type(c) for c in self.choices):
                kinds = sorted({type(c).__name__ for c in self.choices})
                raise PolicyRefused(
                    400,
                    f"{what} must be {' or '.join(kinds)}, got {type(value).__name__} {_short(value)}",
                    f"this server allows {self.describe()}",
                )
            if not any(type(value) is type(c) and value == c for c in self.choices):
                raise PolicyRefused(
                    403,
                    f"{what} = {_short(value)} is not allowed by this server; allowed: {self.describe()}",
                    bound_hint,
                )
            return
        kind = next((t for t in self.types if _is_kind(value, t)), None)
        if kind is None:
            raise PolicyRefused(
                400,
                f"{what} must be {' or '.join(self.types)}, got {type(value).__name__} {_short(value)}",
                f"this server allows {self.describe()}",
            )
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            low = -math.inf if self.min is None else self.min
            high = math.inf if self.max is None else self.max
            if not low <= value <= high:  # also refuses NaN
                raise PolicyRefused(
                    403, f"{what} = {_short(value)} is outside what this server allows ({self.describe()})", bound_hint
                )
        if isinstance(value, (str, list, dict)) and self.max_length is not None and len(value) > self.max_length:
            raise PolicyRefused(
                403, f"{what} is {len(value)} long, over this server's limit of {self.max_length}", bound_hint
            )
        if isinstance(value, list) and self.items is not None:
            for i, item in enumerate(value):
                self.items.check(f"{what}, item {i},", item, bound_hint)
        if kind == "path" and self.under:
            resolved = Path(value).expanduser().resolve()
            if not any(resolved == Path(root) or Path(root) in resolved.parents for root in self.under):
                raise PolicyRefused(
                    403, f"{what} = {_short(value)} resolves outside the directories this server allows", bound_hint
                )


def _is_kind(value: Any, kind: str) -> bool:
    if kind == "any":
        return True
    if kind == "null":
        return value is None
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind in ("str", "path"):
        return isinstance(value, str) and "\x00" not in value
    return isinstance(value, {"list": list, "dict": dict}[kind])


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass
class EnvPolicy:
    """One served env: the operator's fixed kwargs and the rules for what clients may set."""

    kwargs: dict[str, Any] = field(default_factory=dict)  #: set server-side; clients cannot change them
    client_kwargs: dict[str, Rule] = field(default_factory=dict)  #: kwargs a client may set, each within its rule
    options: dict[str, Rule] = field(default_factory=dict)  #: reset options a client may send


def _int(low: int, high: int) -> Rule:
    return Rule(("int",), low, high)


_RENDER = Rule(choices=(None, "ansi"))
_SELF_PLAY = {
    "opponent": Rule(choices=("random", "scripted", "perfect")),
    "seat": Rule(choices=(0, 1, "random")),
    "illegal_penalty": Rule(("float",), 0.0, 1.0),
    "max_illegal": _int(1, 10),
    "render_mode": _RENDER,
}


@functools.cache
def builtin_policies() -> dict[str, EnvPolicy]:
    """Safe client kwargs of the bundled envs (seeds, sizes and counts within bounds that reset in well under a
    second)."""
    from envhub.envs.math.env import KINDS

    side = _int(6, 10)
    table = {
        "Sokoban-v0": {
            "dim": Rule(("int", "list"), 6, 10, max_length=2, items=side),
            "num_boxes": _int(1, 4),
            "scramble_steps": _int(20, 200),
            "min_solution_length": _int(0, 12),
            "shaped": Rule(("bool",)),
            "render_mode": _RENDER,
        },
        "FrozenLake-v0": {
            "size": _int(2, 12),
            "hole_fraction": Rule(("float",), 0.0, 0.5),
            "slippery": Rule(("bool",)),
            "spaced": Rule(("bool",)),
            "neighbours": Rule(("bool",)),
            "random_ends": Rule(("bool",)),
            "render_mode": _RENDER,
        },
        "Wordle-v0": {"max_guesses": _int(1, 20), "render_mode": _RENDER},
        "Math-v0": {
            "kind": Rule(choices=KINDS),
            "difficulty": Rule(choices=(1, 2, 3)),
            "attempts": _int(1, 10),
            "render_mode": _RENDER,
        },
        "Letters-v0": {"letters": Rule(("str",), max_length=64), "turns": _int(1, 20), "render_mode": _RENDER},
        "TicTacToe-SelfPlay-v0": dict(_SELF_PLAY),
        "ConnectFour-SelfPlay-v0": dict(_SELF_PLAY),
        "KuhnPoker-SelfPlay-v0": dict(_SELF_PLAY),
        "SWE-v0": {
            "max_steps": _int(1, 40),
            "instance_ids": Rule(("list", "null"), max_length=64, items=Rule(("str",), max_length=200)),
            "render_mode": _RENDER,
        },
        "WebShop-v0": {
            "catalog_seed": _int(0, 3),
            "max_steps": _int(1, 20),
            "render": Rule(choices=("text",)),
            "render_mode": _RENDER,
        },
    }
    options = {
        "SWE-v0": {"instance_id": Rule(("str",), max_length=200), "index": _int(0, 100_000)},
        "WebShop-v0": {"goal_seed": _int(0, 2**31 - 1)},
    }
    return {env_id: EnvPolicy(client_kwargs=rules, options=options.get(env_id, {})) for env_id, rules in table.items()}


def constructor_parameters(entry: Any) -> dict[str, inspect.Parameter] | None:
    """Keyword parameters of an env's constructor, or None when it takes **kwargs or has no signature."""
    try:
        params = inspect.signature(entry).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return {
        n: p
        for n, p in params.items()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }


def rule_from_signature(entry: Any, name: str) -> Rule:
    """An unbounded rule for kwarg `name` typed from the constructor's annotation (any JSON value when unknown)."""
    target = entry.__init__ if inspect.isclass(entry) else entry
    try:
        hint = typing.get_type_hints(target).get(name, Any)
    except Exception:  # unresolvable annotations: the constructor itself still checks
        hint = Any
    kinds = _kinds_of(hint)
    return Rule(tuple(dict.fromkeys(kinds)) if kinds else ("any",))


def _kinds_of(hint: Any) -> list[str]:
    simple = {
        int: "int",
        float: "float",
        bool: "bool",
        str: "str",
        type(None): "null",
        Path: "str",
        list: "list",
        tuple: "list",
        dict: "dict",
    }
    if hint in simple:
        return [simple[hint]]
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        kinds = [k for arg in typing.get_args(hint) for k in _kinds_of(arg)]
        return [] if "any" in kinds else kinds
    if origin in simple:
        return [simple[origin]]
    return ["any"]  # Literal, Any, custom classes: the constructor itself checks


@dataclass
class ServePolicy:
    """What `envhub serve` serves and what clients may set; built-in rules apply where the operator wrote none."""

    envs: dict[str, EnvPolicy] = field(default_factory=dict)  #: operator's entries (fixed kwargs, rules)
    served: frozenset[str] | None = None  #: served ids; None serves every registered single-agent env
    allow_local_backend: bool = False  #: LOCAL_OPT_IN_FLAG: envs may run with backend "local" (no isolation)
    source: str = "built-in defaults"  #: where it came from, for the startup line

    def serves(self, env_id: str) -> bool:
        """Whether clients may open sessions of `env_id`."""
        return self.served is None or env_id in self.served

    def env_policy(self, env_id: str) -> EnvPolicy:
        """The operator's entry for `env_id`, else the built-in one, else nothing client-settable."""
        if env_id in self.envs:
            return self.envs[env_id]
        return builtin_policies().get(env_id) or EnvPolicy()

    def kwargs_for(self, spec: Any, client: dict[str, Any]) -> dict[str, Any]:
        """The kwargs to build `spec`'s env with for this client request, or PolicyRefused."""
        if not self.serves(spec.id):
            raise PolicyRefused(
                403,
                f"{spec.id} is not served by this server",
                f"the operator serves it with `envhub serve --env {spec.id}` or in the --policy file",
            )
        policy = self.env_policy(spec.id)
        entry = spec.load()
        params = constructor_parameters(entry)
        for name, value in client.items():
            if params is not None and name not in params:
                close = difflib.get_close_matches(name, list(params), n=3)
                hint = (
                    f"did you mean {', '.join(close)}? " if close else ""
                ) + f"`envhub info {spec.id}` lists its kwargs"
                raise PolicyRefused(400, f"unknown kwarg {name!r} for {spec.id}", hint)
            rule = policy.client_kwargs.get(name)
            if rule is None:
                raise PolicyRefused(
                    403,
                    f"kwarg {name!r} of {spec.id} is not client-settable on this server",
                    _allow_hint(spec.id, name),
                )
            rule.check(
                f"kwarg {name!r} of {spec.id}",
                value,
                f"the operator sets its bounds in the --policy file (envs: {spec.id}: client_kwargs: {name})",
            )
        merged = {**policy.kwargs, **client}
        backend = merged.get("backend", spec.kwargs.get("backend", _default(params, "backend")))
        if backend == "local" and not self.allow_local_backend:
            raise PolicyRefused(
                403,
                f"kwarg 'backend' of {spec.id} is 'local': model-written code would run on the server's host, outside "
                f"any sandbox",
                f"this server refuses it; an operator who accepts that starts `envhub serve {LOCAL_OPT_IN_FLAG}`",
            )
        return merged

    def options_for(self, env_id: str, options: Any) -> dict[str, Any] | None:
        """Reset options allowed by the policy, or PolicyRefused."""
        if options is None:
            return None
        if not isinstance(options, dict):
            raise PolicyRefused(400, "'options' must be a JSON object or null")
        rules = self.env_policy(env_id).options
        for name, value in options.items():
            rule = rules.get(name)
            if rule is None:
                raise PolicyRefused(
                    403,
                    f"reset option {name!r} of {env_id} is not client-settable on this server",
                    f"the operator allows it with `envhub serve {ALLOW_OPTION_FLAG} {env_id}:{name}` or in the "
                    f"--policy file (options:)",
                )
            rule.check(
                f"reset option {name!r} of {env_id}",
                value,
                f"the operator sets its bounds in the --policy file (envs: {env_id}: options: {name})",
            )
        return options


def _default(params: dict[str, inspect.Parameter] | None, name: str) -> Any:
    if params is None or name not in params or params[name].default is inspect.Parameter.empty:
        return None
    return params[name].default


def _allow_hint(env_id: str, name: str) -> str:
    extra = f" (and {LOCAL_OPT_IN_FLAG} for 'local')" if name == "backend" else ""
    return (
        f"isolation, host paths, limits and timeouts are the operator's: allow it with `envhub serve "
        f"{ALLOW_KWARG_FLAG} {env_id}:{name}`{extra}, "
        f"bound it in the --policy file (client_kwargs:), or set it server-side there (kwargs:)"
    )


def load_policy(
    path: str | os.PathLike[str] | None,
    *,
    envs: Sequence[str] = (),
    allow_kwargs: Sequence[str] = (),
    allow_options: Sequence[str] = (),
    allow_local_backend: bool = False,
) -> ServePolicy:
    """The policy from a YAML file (if any) plus the command line's --env / --allow-kwarg / --allow-option."""
    from envhub.registry import spec as lookup

    policy = ServePolicy(allow_local_backend=allow_local_backend)
    served: set[str] = set(envs)
    if path is not None:
        policy.source = str(path)
        for env_id, entry in _read_yaml(path).items():
            served.add(env_id)
            policy.envs[env_id] = _env_entry(f"{path}: envs.{env_id}", env_id, entry)
    for env_id in served:
        lookup(env_id)  # an unknown id fails now, with suggestions
    policy.served = frozenset(served) if served else None
    for flag, items in ((ALLOW_KWARG_FLAG, allow_kwargs), (ALLOW_OPTION_FLAG, allow_options)):
        for item in items:
            env_id, _, name = item.partition(":")
            if not name:
                raise ConfigError(f"{flag} {item!r}: expected ENV_ID:NAME", hint=f"e.g. {flag} SWE-v0:max_steps")
            entry = lookup(env_id).load()
            if not policy.serves(env_id):
                raise ConfigError(f"{flag} {item}: {env_id} is not served", hint=f"add --env {env_id}")
            own = policy.envs.setdefault(env_id, _copy(policy.env_policy(env_id)))
            if flag == ALLOW_KWARG_FLAG:
                params = constructor_parameters(entry)
                if params is not None and name not in params:
                    raise ConfigError(
                        f"{flag} {item}: {env_id} has no kwarg {name!r}", hint=f"its kwargs: {', '.join(params)}"
                    )
                own.client_kwargs[name] = rule_from_signature(entry, name)
            else:
                own.options[name] = Rule()
    for env_id, entry in policy.envs.items():
        if entry.kwargs.get("backend") == "local" and not allow_local_backend:
            raise ConfigError(
                f"the policy sets backend: local for {env_id}: model-written code would run on this host outside any "
                f"sandbox",
                hint=f"use docker or bwrap, or start with {LOCAL_OPT_IN_FLAG} if you accept that",
            )
    return policy


def _copy(entry: EnvPolicy) -> EnvPolicy:
    return EnvPolicy(dict(entry.kwargs), dict(entry.client_kwargs), dict(entry.options))


def _read_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(
            f"cannot read policy file {path}: {exc.strerror or exc}", hint="check the --policy path"
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"policy file {path} is not valid YAML: {exc}", hint="see docs/security.md for the format"
        ) from None
    if not isinstance(data, dict) or set(data) - {"envs"} or not isinstance(data.get("envs"), dict):
        raise ConfigError(
            f"policy file {path} must be a mapping with one key, envs: {{ENV_ID: {{...}}}}",
            hint="see docs/security.md for the format",
        )
    return data["envs"]


def _env_entry(where: str, env_id: str, entry: Any) -> EnvPolicy:
    entry = entry or {}
    if not isinstance(entry, dict) or set(entry) - {"kwargs", "client_kwargs", "options"}:
        raise ConfigError(
            f"{where}: expected a mapping with kwargs, client_kwargs and/or options",
            hint="see docs/security.md for the format",
        )
    builtin = builtin_policies().get(env_id) or EnvPolicy()
    fixed = entry.get("kwargs") or {}
    if not isinstance(fixed, dict):
        raise ConfigError(f"{where}.kwargs must be a mapping", hint="e.g. kwargs: {backend: bwrap}")

    def rules(key: str, default: dict[str, Rule]) -> dict[str, Rule]:
        if key not in entry:
            return dict(default)
        raw = entry[key] or {}
        if not isinstance(raw, dict):
            raise ConfigError(
                f"{where}.{key} must be a mapping of name to rule", hint="e.g. max_steps: {type: int, min: 1, max: 20}"
            )
        return {name: Rule.from_yaml(f"{where}.{key}.{name}", rule) for name, rule in raw.items()}

    return EnvPolicy(dict(fixed), rules("client_kwargs", builtin.client_kwargs), rules("options", builtin.options))
