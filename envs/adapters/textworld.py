"""TextWorld as text envs: `textworld-<challenge>-v0` for each challenge the installed textworld defines.

TextWorld 1.7.0 defines `simple`, `coin_collector`, `treasure_hunter` and `cooking`; their settings
(read from each challenge's own argument parser) are the env's kwargs, e.g.
`envhub.make("textworld-cooking-v0", recipe=3, take=3, go=6, cook=True, cut=True)`. Settings a
challenge requires get envhub defaults (`DEFAULTS`).
- Episodes: `reset(seed=s)` plays the game TextWorld generates for (challenge, settings, s). Games
  are deterministic, so each is generated once (0.5-10 s: TextWorld writes Inform 7 and compiles
  it with its bundled x86-64 compilers) and kept under `$ENVHUB_CACHE/textworld/<challenge>/<settings
  hash>/seed-<s>.{z8,json}`, written to a temporary name and moved into place, so concurrent workers
  never read half a game. Games are played through jericho (Frotz).
- Observation: the objective, then the game's text (TextWorld's ASCII banner removed); then the
  game's answer to each command.
- Actions: free-text commands ("open fridge", "take knife from table", "go east"), or an `act` tool
  call. `info["legal_actions"]` holds TextWorld's admissible commands; other commands are allowed
  (the parser answers "That's not a verb I recognise.").
- Reward: the change in score / max score, so an episode's rewards sum to its final progress (0 to 1).
  `info["progress"]` (0-100) is BALROG's: 100 when won, else score / max score.
  `info["success"]` is TextWorld's `won`. Episodes end when the game is won or lost (terminated) or
  after `max_steps` commands (truncated; default 100).
- Expert (`oracle_action()`): the game's walkthrough while the agent follows it (it wins every
  generated game tried); with `online_expert=True`, TextWorld's `policy_commands` from any state
  (costly on big maps: up to 0.1 s a step).
- Anchor (`info["anchor"]`): a digest of the game (challenge, settings, seed), TextWorld's world state (its set of
  logical facts, `at(P, kitchen: r)`, `open(fridge: c)`, ...) and the score, won and lost flags, e.g.
  `world=1f0c3b9a7e5d2468`. These are the state the game's rules, rewards and admissible commands come from; the
  interpreter's own memory (its move counter, which rooms it described before) is not, and stays out.
- Licences: textworld is MIT; jericho, which it loads to play games, is GPLv2+ (installed from PyPI,
  never vendored).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import tempfile
import warnings
from pathlib import Path
from typing import Any, ClassVar

from envhub.core import AgentEnv, UnicodeText, state_digest
from envhub.envs.adapters.family import (
    Family,
    act,
    cache_root,
    command_text,
    installed_version,
    register_family,
    require,
    upstream,
)
from envhub.errors import ConfigError, ResetNeeded

FAMILY = Family(
    name="textworld",
    distribution="textworld",
    module="textworld",
    extra="textworld",
    prefix="textworld-",
    licence="MIT (its dependency jericho: GPLv2+)",
)
DEFAULTS = {  # settings a challenge requires, with no default of its own
    "tw-simple": {"rewards": "dense", "goal": "detailed"},
    "tw-coin_collector": {"level": 5},
    "tw-treasure_hunter": {"level": 5},
}
# textworld 1.7.0 refuses games of more than 100 rooms (it dropped Glulx): these coin collector levels still work
COIN_COLLECTOR_LEVELS = (*range(1, 151), *range(201, 234))
TEXT_LENGTH = 1 << 15
SYSTEM_PROMPT = (
    "You are playing a text adventure. Reach the objective by typing commands, one per turn. Useful commands: "
    "look, inventory, go north/south/east/west, examine X, open X, close X, take X, take X from Y, drop X, "
    "put X on Y, insert X into Y, unlock X with Y, eat X; in the cooking games also read cookbook, "
    "slice/dice/chop X with knife, cook X with stove/oven/BBQ, prepare meal, eat meal. Reply with just the command, "
    'or call the tool: <tool_call>{"name": "act", "arguments": {"action": "open fridge"}}</tool_call>.'
)


def settings_for(record: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """The complete settings dict of a challenge: `given`, then envhub's defaults, then the challenge's; checked."""
    schema = {s["name"]: s for s in record["settings"]}
    unknown = sorted(set(given) - set(schema))
    if unknown:
        raise ConfigError(
            f"{record['id']} has no setting {', '.join(map(repr, unknown))}",
            hint=f"its settings: {', '.join(schema)}",
        )
    settings = {}
    for name, spec in schema.items():
        value = given.get(name, DEFAULTS.get(record["challenge"], {}).get(name, spec["default"]))
        if value is None and spec["required"]:
            raise ConfigError(f"{record['id']} needs the setting {name!r}")
        if spec["type"] == "int" and value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"{record['id']}: {name} must be an integer, got {value!r}")
        if spec["type"] == "bool" and not isinstance(value, bool):
            raise ConfigError(f"{record['id']}: {name} must be true or false, got {value!r}")
        if value is not None and spec["choices"] and value not in spec["choices"]:
            raise ConfigError(f"{record['id']}: {name} must be one of {spec['choices']}, got {value!r}")
        settings[name] = value
    if record["challenge"] == "tw-coin_collector" and settings["level"] not in COIN_COLLECTOR_LEVELS:
        raise ConfigError(
            f"coin collector level {settings['level']} makes a game of over 100 rooms, which textworld "
            f"{installed_version('textworld')} cannot compile",
            hint="use a level from 1 to 150 or from 201 to 233",
        )
    return settings


def game_path(challenge: str, settings: dict[str, Any], seed: int) -> Path:
    """Where the game of (challenge, settings, seed) is cached; generated (atomically) when missing."""
    key = json.dumps({"settings": settings, "textworld": installed_version("textworld")}, sort_keys=True)
    folder = cache_root() / "textworld" / challenge.removeprefix("tw-") / hashlib.sha256(key.encode()).hexdigest()[:16]
    path = folder / f"seed-{seed}.z8"
    if path.is_file() and path.with_suffix(".json").is_file():
        return path
    import textworld
    from textworld.challenges import CHALLENGES

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "settings.json").write_text(key)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".generating-") as scratch:
        options = textworld.GameOptions()
        options.seeds = seed
        options.path = scratch + "/"  # TextWorld's default is ./tw_games/ in the working directory
        options.file_ext = ".z8"
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # jericho, replaying the walkthrough while compiling: "not fully supported"
            game = CHALLENGES[challenge][1](dict(settings), options)
            made = Path(textworld.generator.compile_game(game, options))
        os.replace(made.with_suffix(".json"), path.with_suffix(".json"))  # the .z8 last: its presence means done
        os.replace(made, path)
    return path


_PROMPT_LINE = re.compile(r"\n*>[^\n]*$")  # Frotz's prompt and status line ("> ... -= Studio =-0/2")
_UNTYPABLE = re.compile(r"[^ -\[\]-~]")  # Frotz reads printable ASCII, and takes a backslash as an escape
_BLANK_LINES = re.compile(r"\n{3,}")


def clean(feedback: str) -> str:
    """The game's text without the interpreter's prompt and status line, blank runs squeezed."""
    return _BLANK_LINES.sub("\n\n", _PROMPT_LINE.sub("", feedback)).strip()


def _strip_banner(feedback: str, objective: str) -> str:
    """The first feedback without TextWorld's ASCII-art banner (and the objective, shown separately)."""
    if objective and objective in feedback:
        return clean(feedback.split(objective, 1)[1])
    room = feedback.find("-= ")
    return clean(feedback[room:] if room >= 0 else feedback)


class TextWorldEnv(AgentEnv):
    """A TextWorld challenge: each seed is one generated game, played by typing commands."""

    tools = (act,)
    system_prompt: ClassVar[str] = SYSTEM_PROMPT
    reward_doc: ClassVar[str] = "the change in score / max score: an episode's rewards sum to its final progress (0-1)"

    def __init__(
        self,
        challenge: str,
        max_steps: int = 100,
        online_expert: bool = False,
        render_mode: str | None = None,
        **settings: Any,
    ) -> None:
        require(FAMILY, f"TextWorld's {challenge}")
        record = _challenge(challenge)
        if not (isinstance(max_steps, int) and max_steps > 0):
            raise ConfigError(f"max_steps must be a positive integer, got {max_steps!r}")
        self.record = record
        self.challenge = record["challenge"]
        self.settings = settings_for(record, settings)
        self.max_steps, self.online_expert = max_steps, online_expert
        self.render_mode = render_mode
        self.observation_space = UnicodeText(TEXT_LENGTH)
        self.game: Any = None
        self.state: Any = None
        self.steps, self.taken = 0, []
        self.game_seed = 0
        self._done, self._last = True, ""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        import textworld

        game_seed = seed if seed is not None else int(self.np_random.integers(2**31))
        try:
            path = game_path(self.challenge, self.settings, game_seed)
            infos = textworld.EnvInfos(
                objective=True,
                score=True,
                max_score=True,
                won=True,
                lost=True,
                admissible_commands=True,
                facts=True,
                moves=True,
                policy_commands=self.online_expert,
                extras=["walkthrough"],
            )
            self.close()
            with warnings.catch_warnings():  # jericho: "not fully supported" (TextWorld keeps the score itself)
                warnings.simplefilter("ignore")
                self.game = textworld.start(str(path), request_infos=infos)
                self.state = self.game.reset()
        except Exception as exc:
            raise upstream(f"TextWorld's {self.challenge}", FAMILY.distribution, exc) from None
        self.steps, self.taken, self._done, self.game_seed = 0, [], False, game_seed
        objective = str(self.state.objective or "").strip()
        text = _strip_banner(str(self.state.feedback), objective)
        self._last = (f"Objective: {objective}\n\n" if objective else "") + text
        return self._last, self.base_info(game_seed=game_seed, settings=dict(self.settings), **self._info())

    def step(self, action: str | dict[str, Any]) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._done:
            raise ResetNeeded(f"the {self.record['id']} episode is over", hint="call reset() to start a new one")
        command = _UNTYPABLE.sub(" ", command_text(action))[:500].strip()
        before = self._score()
        try:
            self.state, _, _ = self.game.step(command)
        except Exception as exc:
            raise upstream(f"TextWorld's {self.challenge}", FAMILY.distribution, exc) from None
        self.steps += 1
        self.taken.append(command)
        terminated = bool(self.state.won or self.state.lost)
        truncated = not terminated and self.steps >= self.max_steps
        self._done = terminated or truncated
        self._last = clean(str(self.state.feedback))[-TEXT_LENGTH:] or "(nothing happens)"
        reward = (self._score() - before) / max(float(self.state.max_score or 1), 1.0)
        return self._last, reward, terminated, truncated, self._info()

    def _score(self) -> float:
        return float(self.state.score or 0)

    def _info(self) -> dict[str, Any]:
        state = self.state
        max_score = float(state.max_score or 1) or 1.0
        won = bool(state.won)
        return {
            "score": self._score(),
            "max_score": max_score,
            "progress": 100.0 if won else round(100.0 * max(self._score(), 0.0) / max_score, 2),
            "success": won,
            "lost": bool(state.lost),
            "legal_actions": [] if self._done else sorted(str(c) for c in state.admissible_commands or []),
            "anchor": self.anchor(),
        }

    def anchor(self) -> str | None:
        """A digest of the game, TextWorld's facts about its world, the score and whether it is won or lost."""
        if self.state is None:
            return None
        facts = sorted(str(fact) for fact in self.state.facts or [])
        game = [self.challenge, self.settings, self.game_seed]
        return f"world={state_digest([game, facts, self._score(), bool(self.state.won), bool(self.state.lost)])}"

    def oracle_action(self) -> str | None:
        """The walkthrough's next command while the agent follows it (with online_expert: TextWorld's policy)."""
        if self._done:
            return None
        if self.online_expert:
            policy = self.state.policy_commands or []
            return str(policy[0]) if policy else None
        walkthrough = [str(c) for c in self.state["extra.walkthrough"] or []]
        if self.taken != walkthrough[: len(self.taken)] or len(self.taken) >= len(walkthrough):
            return None
        return walkthrough[len(self.taken)]

    def render_text(self) -> str:
        return self._last

    def close(self) -> None:
        if self.game is not None:
            self.game.close()
            self.game = None


def _challenge(challenge: str) -> dict[str, Any]:
    """The catalogue record of `challenge` (from the id cache of this textworld version)."""
    from envhub.envs.adapters.family import family_catalogue

    records = {r["challenge"]: r for r in family_catalogue(FAMILY, installed_version("textworld") or "?", _catalogue)}
    if challenge not in records:
        raise ConfigError(f"TextWorld has no challenge {challenge!r}", hint=f"challenges: {', '.join(records)}")
    return records[challenge]


def _catalogue() -> list[dict[str, Any]]:
    """Every challenge the installed textworld defines, with its settings read from its argument parser."""
    require(FAMILY)
    from textworld.challenges import CHALLENGES

    records = []
    for challenge, (description, _make, build_parser) in sorted(CHALLENGES.items()):
        settings = []
        for argument in build_parser()._actions:
            if argument.dest == "help":
                continue
            flag = argument.nargs == 0  # store_true
            kind = "bool" if flag else ("int" if argument.type is int else "str")
            settings.append(
                {
                    "name": argument.dest,
                    "type": kind,
                    "default": argument.default,
                    "choices": list(argument.choices) if argument.choices else None,
                    "required": bool(argument.required),
                }
            )
        name = challenge.removeprefix("tw-")
        records.append(
            {"challenge": challenge, "id": f"{FAMILY.prefix}{name}-v0", "about": description, "settings": settings}
        )
    return records


def _register(record: dict[str, Any]) -> str:
    from envhub.registry import register

    register(
        record["id"],
        "envhub.envs.adapters.textworld:TextWorldEnv",
        kwargs={"challenge": record["challenge"]},
        tags=("textworld", "text-game", "single-agent"),
        description=f"TextWorld: {record['about'].rstrip('.')}",
        source=FAMILY.distribution,
        requires=("platform:x86_64",),
    )
    return "challenges"


def register_envs() -> None:
    """Entry point: register `textworld-<challenge>-v0` for every installed TextWorld challenge."""
    register_family(FAMILY, _catalogue, _register)
