"""What an env accepts and pays: its constructor's kwargs (names, types, defaults) and its reward doc.

Read from the entry point's signature, so `envhub info`, the trainer's preflight check and error hints
always agree with the code.
"""

from __future__ import annotations

import difflib
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from envhub.errors import ConfigError

_NO_DEFAULT = inspect.Parameter.empty


@dataclass(frozen=True)
class KwargInfo:
    """One keyword an env's constructor takes."""

    name: str
    annotation: str  #: the type as written in the signature ("" when unannotated)
    default: Any  #: `inspect.Parameter.empty` when the kwarg is required
    required: bool

    def describe(self) -> str:
        """`name: type = default`, as a signature shows it."""
        typed = f"{self.name}: {self.annotation}" if self.annotation else self.name
        return typed if self.required else f"{typed} = {self.default!r}"


def constructor_kwargs(entry_point: Callable[..., Any]) -> tuple[list[KwargInfo], bool]:
    """The keyword parameters of an env's class or factory, and whether it also takes **kwargs."""
    try:
        params = list(inspect.signature(entry_point).parameters.values())
    except (TypeError, ValueError):  # no introspectable signature: accept anything
        return [], True
    kwargs = [
        KwargInfo(p.name, _annotation(p.annotation), p.default, p.default is _NO_DEFAULT)
        for p in params
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    return kwargs, any(p.kind is p.VAR_KEYWORD for p in params)


def check_kwargs(env_id: str, kwargs: dict[str, Any], *, where: str = "") -> None:
    """Raise ConfigError naming the first kwarg `env_id`'s constructor does not take, with the closest names.

    `where` starts the message (e.g. "task Letters-v0: "); by default it is the env id.
    """
    from envhub.registry import spec

    env_spec = spec(env_id)  # an unknown id fails here, with close ids suggested
    known, open_ended = constructor_kwargs(env_spec.load())
    names = [k.name for k in known]
    if open_ended:
        return
    for key in kwargs:
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=2, cutoff=0.6)
            suggestion = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            raise ConfigError(
                f"{where or env_spec.id + ': '}unknown kwarg {key!r}{suggestion}",
                hint=f"{env_spec.id} takes {', '.join(names) or 'no kwargs'} (`envhub info {env_spec.id}` lists them "
                f"with types and defaults)",
            )


def reward_doc(cls: Any) -> str:
    """How an env rewards: its `reward_doc`, else the "Reward:" sentence of its docstring, else ""."""
    doc = getattr(cls, "reward_doc", "") or ""
    if doc:
        return " ".join(str(doc).split())
    match = re.search(r"Reward:\s*(.+?)(?:\n\s*\n|$)", inspect.getdoc(cls) or "", re.DOTALL)
    return " ".join(match.group(1).split()) if match else ""


def _annotation(annotation: Any) -> str:
    if annotation is _NO_DEFAULT:
        return ""
    return annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
