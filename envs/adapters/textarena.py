"""TextArena games as envhub envs: `ta-<Game>[-variant]-v<N>` for every id TextArena registers.

TextArena id `Name-vN[-variant]` becomes `ta-Name[-variant]-vN` (`Sokoban-v0-medium` ->
`ta-Sokoban-medium-v0`); variants keep TextArena's wrappers (`-raw`: only the new messages of each
turn, best for chat rollouts; default: TextArena's own full-history prompt; `-train`: its training
wrappers).
- One-player games are `AgentEnv`s: observation = the text TextArena gives the player, action = the
  model's text (TextArena's `[move]` format), reward = TextArena's reward at the end (0 before),
  terminated when TextArena says done.
- Games of two or more players are PettingZoo AEC envs (`envhub.make_multiagent`), observations
  `{"text": ...}`, actions text, rewards TextArena's per player at the end (+1/-1/0 in most games).
  `envhub.SelfPlay("ta-...-v0")` plays one seat; its random opponent picks one of the bracketed
  moves its observation lists.
- Games that download NLTK data at import, or call a hosted LLM (OpenRouter) as judge or game
  master, are registered but fail at `make` with one line saying what they need: envhub makes no
  download or network call at run time.
- No anchor (`info["anchor"]`, docs/authoring.md): TextArena's state is a per-game `game_state` dict next to its
  turn counter, and many games keep their move history or logs in it, so no game-independent read of it is an
  exact state without the turn count or the order of moves; the trainer hashes the observation instead.
"""

from __future__ import annotations

import contextlib
import copy
import io
import random
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv

from envhub.core import AgentEnv, TextRender, UnicodeText
from envhub.envs.adapters.family import (
    AdapterUnavailable,
    Family,
    UpstreamError,
    installed_version,
    no_downloads,
    register_family,
    require,
    upstream,
)
from envhub.envs.adapters.textarena_moves import legal_moves, listed_moves, variants
from envhub.errors import ConfigError, ResetNeeded

FAMILY = Family(
    name="textarena", distribution="textarena", module="textarena", extra="textarena", prefix="ta-", licence="MIT"
)
TEXT_LENGTH = 1 << 16
_TA_ID = re.compile(r"^(?P<name>.+?)-v(?P<version>\d+)(?P<variant>(-.+)?)$")
_NLTK_DOWNLOAD = re.compile(r"nltk\.download\(\s*(\[[^\]]*\]|['\"][^'\"]+['\"])")
_NLTK_PATHS = {"words": "corpora/words", "averaged_perceptron_tagger_eng": "taggers/averaged_perceptron_tagger_eng"}


def envhub_id(ta_id: str) -> str:
    """The envhub id of a TextArena id: `Name-vN[-variant]` -> `ta-Name[-variant]-vN`."""
    match = _TA_ID.match(ta_id)
    name = ta_id if match is None else match["name"] + match["variant"]
    version = "0" if match is None else match["version"]
    safe = re.sub(r"[^\w.-]", "_", name)  # e.g. Taboo-city/country
    return f"{FAMILY.prefix}{safe}-v{version}"


def _needs(module: str) -> list[str]:
    """What a game's package needs from outside at import or reset (NLTK data, a hosted LLM), read from its source."""
    root = Path(require(FAMILY).__file__).parent
    folder = root.joinpath(*module.split(".")[1:]).parent
    needs: set[str] = set()
    for source in folder.rglob("*.py") if folder.name != "envs" else ():
        text = source.read_text(errors="replace")
        for found in _NLTK_DOWNLOAD.findall(text):
            needs.update(f"nltk:{name}" for name in re.findall(r"['\"]([^'\"]+)['\"]", found))
        if "word_lists" in text or "EnglishDictionary" in text:  # TextArena's word list downloads NLTK words when built
            needs.add("nltk:words")
        if "OpenRouter" in text:
            needs.add("openrouter")
    return sorted(needs)


def _missing(needs: list[str]) -> list[str]:
    """The needs of `needs` this machine cannot meet now."""
    missing = []
    for need in needs:
        if need == "openrouter":
            missing.append(need)
        elif need.startswith("nltk:"):
            import nltk

            try:
                nltk.data.find(_NLTK_PATHS.get(need[5:], need[5:]))
            except LookupError:
                missing.append(need)
    return missing


def _check_offline(ta_id: str, needs: list[str]) -> None:
    missing = _missing(needs)
    if not missing:
        return
    if "openrouter" in missing:
        raise AdapterUnavailable(
            f"TextArena's {ta_id} calls a hosted LLM through OpenRouter (judge or game master)",
            hint="envhub makes no network calls at run time; pick another ta- game",
        )
    data = " ".join(m[5:] for m in missing)
    raise AdapterUnavailable(
        f"TextArena's {ta_id} downloads NLTK data ({data}) at import, which envhub does not do at run time",
        hint=f"install the data once where the internet is reachable: python -m nltk.downloader {data}",
    )


def _make_ta(ta_id: str, needs: list[str], kwargs: dict[str, Any]) -> Any:
    ta = require(FAMILY, f"TextArena game {ta_id}")
    _check_offline(ta_id, needs)
    try:
        with no_downloads(f"TextArena's {ta_id}"):
            return ta.make(ta_id, **kwargs)
    except TypeError as exc:
        if "unexpected keyword" in str(exc):
            raise ConfigError(f"bad kwargs for TextArena's {ta_id}: {exc}") from None
        raise upstream(f"TextArena's {ta_id}", FAMILY.distribution, exc) from None
    except Exception as exc:
        raise upstream(f"TextArena's {ta_id}", FAMILY.distribution, exc) from None


@contextlib.contextmanager
def _in_textarena(ta_id: str) -> Iterator[None]:
    """Run TextArena code: no downloads, its prints silenced, its own exceptions as one clear line."""
    try:
        with no_downloads(f"TextArena's {ta_id}"):
            yield
    except Exception as exc:
        raise upstream(f"TextArena's {ta_id}", FAMILY.distribution, exc) from None


def message_text(observation: Any) -> str:
    """TextArena's observation as text: wrapped envs give a string, raw ones a list of (from, message, type)."""
    if isinstance(observation, str):
        text = observation
    elif isinstance(observation, (list, tuple)):
        text = "\n".join(str(m[1]) if isinstance(m, (list, tuple)) and len(m) >= 2 else str(m) for m in observation)
    else:
        text = str(observation)
    return text[-TEXT_LENGTH:]


def _reward(ta_id: str, value: Any) -> float:
    """TextArena's reward as a float; a game that hands back something else has a bug, said in one line."""
    try:
        return float(value)
    except (TypeError, ValueError):
        raise UpstreamError(
            f"TextArena's {ta_id} ended with a non-numeric reward {str(value)[:120]!r}",
            hint=f"a bug in textarena {installed_version(FAMILY.distribution)} (arguments swapped in "
            f"set_invalid_move), not in envhub",
        ) from None


def _action_text(action: str | dict[str, Any]) -> str:
    if isinstance(action, str):
        return action
    arguments = action.get("arguments", action) if isinstance(action, dict) else action
    if isinstance(arguments, dict) and len(arguments) == 1:
        return str(next(iter(arguments.values())))
    return str(arguments)


class TextArenaEnv(AgentEnv):
    """A one-player TextArena game; the agent's text is its move."""

    system_prompt: ClassVar[str] = (
        "You are playing a text game. Follow the game's instructions; write moves in the format it asks for (usually "
        "[move])."
    )
    reward_doc: ClassVar[str] = "TextArena's reward for the player when the game ends (0 before)"

    def __init__(
        self, ta_id: str, needs: list[str] | tuple[str, ...] = (), render_mode: str | None = None, **kwargs: Any
    ) -> None:
        self.ta_id = ta_id
        self._spec = (list(needs), kwargs)
        self.game = _make_ta(ta_id, *self._spec)
        self.render_mode = render_mode
        self.observation_space = UnicodeText(TEXT_LENGTH)
        self._done = True
        self._last = ""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        game_seed = seed if seed is not None else int(self.np_random.integers(2**31))
        self.game = _make_ta(self.ta_id, *self._spec)  # TextArena's wrappers keep history across resets
        with _in_textarena(self.ta_id):
            self.game.reset(num_players=1, seed=game_seed)
            _, observation = self.game.get_observation()
        self._done = False
        self._last = message_text(observation)
        return self._last, self.base_info(game=self.ta_id, legal_actions=legal_moves(self._last))

    def step(self, action: str | dict[str, Any]) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._done:
            raise ResetNeeded(f"the {self.ta_id} game is over", hint="call reset() to start a new one")
        with _in_textarena(self.ta_id):
            done, step_info = self.game.step(_action_text(action))
            if not done:
                _, observation = self.game.get_observation()
                self._last = message_text(observation)
                return self._last, 0.0, False, False, {"step_info": step_info, "legal_actions": legal_moves(self._last)}
            rewards, game_info = self.game.close()
        self._done = True
        reward = _reward(self.ta_id, (rewards or {}).get(0, 0.0))
        reason = (game_info or {}).get(0, {}).get("reason", "")
        self._last = f"Game over ({reward:+g}). {reason}".strip()
        return self._last, reward, True, False, {"step_info": step_info, "game_info": game_info, "legal_actions": []}

    def render_text(self) -> str:
        return self._last


class TextArenaGame(TextRender, AECEnv):
    """A TextArena game of two or more players as a PettingZoo AEC env with text observations and actions."""

    metadata: ClassVar[dict[str, Any]] = {
        "render_modes": ["ansi", "human"],
        "name": "textarena",
        "is_parallelizable": False,
    }
    #: envhub.SelfPlay reads moves as free text (no fixed action ids) for this game.
    free_text_moves: ClassVar[bool] = True
    move_help: ClassVar[str] = "the move in the format the game asks for, usually in [brackets]"

    def __init__(
        self,
        ta_id: str,
        num_players: int = 2,
        needs: list[str] | tuple[str, ...] = (),
        render_mode: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        self.ta_id = ta_id
        self._spec = (list(needs), kwargs)
        self.game = _make_ta(ta_id, *self._spec)
        self.num_players = num_players
        self.render_mode = render_mode
        self.possible_agents = [f"player_{i}" for i in range(num_players)]
        obs_space = spaces.Dict({"text": UnicodeText(TEXT_LENGTH)})
        self.observation_spaces = {a: obs_space for a in self.possible_agents}
        self.action_spaces = {a: UnicodeText(4096) for a in self.possible_agents}
        self._texts: dict[str, str] = {}
        self._result: tuple[float, ...] | None = None

    def observation_space(self, agent: str) -> spaces.Space:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space:
        return self.action_spaces[agent]

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        if seed is not None:
            for i, agent in enumerate(self.possible_agents):
                self.action_spaces[agent].seed(seed + i)
        self.agents = list(self.possible_agents)
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos = {a: {} for a in self.agents}
        self._texts = {a: "" for a in self.agents}
        self._result = None
        self.game = _make_ta(self.ta_id, *self._spec)  # TextArena's wrappers keep history across resets
        with _in_textarena(self.ta_id):
            self.game.reset(num_players=self.num_players, seed=seed)
        self._advance()

    def _advance(self) -> None:
        """Point `agent_selection` at the player TextArena asks next and hand it its observation."""
        with _in_textarena(self.ta_id):
            player, observation = self.game.get_observation()
        self.agent_selection = self.possible_agents[player]
        self._texts[self.agent_selection] = message_text(observation)

    def step(self, action: Any) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0.0
        with _in_textarena(self.ta_id):
            done, step_info = self.game.step(_action_text(action) if action is not None else "")
            rewards, game_info = self.game.close() if done else (None, None)
        self.rewards = {a: 0.0 for a in self.agents}
        if done:
            self._result = tuple(_reward(self.ta_id, (rewards or {}).get(i, 0.0)) for i in range(self.num_players))
            for i, name in enumerate(self.possible_agents):
                self.rewards[name] = self._result[i]
                self.terminations[name] = True
                reason = (game_info or {}).get(i, {}).get("reason", "")
                self._texts[name] = f"Game over ({self._result[i]:+g}). {reason}".strip()
                self.infos[name] = {"game_info": (game_info or {}).get(i, {})}
        else:
            self.infos[agent] = {"step_info": step_info}
            self._advance()
        self._accumulate_rewards()
        if self.render_mode == "human":
            print(self.render_text())

    def observe(self, agent: str) -> dict[str, Any]:
        return {"text": self._texts.get(agent, "")}

    def render_text(self) -> str:
        return self._texts.get(self.agent_selection, "") if self.agents else ""

    def close(self) -> None:
        pass

    # -- what envhub.SelfPlay needs of a free-text game --------------------------------------
    def current_seat(self) -> int:
        """The seat TextArena asks next."""
        return self.possible_agents.index(self.agent_selection)

    def game_over(self) -> bool:
        """True once TextArena said done."""
        return self._result is not None

    def outcome(self) -> tuple[float, ...] | None:
        """TextArena's final reward of every seat, or None while the game goes on."""
        return self._result

    def observe_text(self, seat: int) -> str:
        """The latest text seat `seat` was given."""
        return self._texts.get(self.possible_agents[seat], "")

    def legal_moves(self, tries: int = 40) -> list[str]:
        """Moves the current player can make, as the game wants them written: the list of open moves its observation
        gives, else the moves it shows by example and more of the same form (`textarena_moves`), each tried on a
        copy of the game and kept if the game accepts it. [] when the observation shows no move at all."""
        text = self._texts.get(self.agent_selection, "")
        offered = legal_moves(text)
        if not offered or self._result is not None or listed_moves(text):
            return offered  # a game listing its open moves is taken at its word (no trials: SelfPlay stays cheap)
        rng = random.Random(zlib.crc32(text.encode()))  # the same position gives the same list
        accepted: list[str] = []
        tried: set[str] = set()
        for round_ in range(4):  # more draws while none is accepted (an example move that is no longer open)
            candidates = (offered if round_ == 0 else []) + variants(offered, text, rng, tries << round_)
            for move in dict.fromkeys(candidates):
                if move not in tried:
                    tried.add(move)
                    if self._accepts(move):
                        accepted.append(move)
            if accepted:
                return accepted
        return offered

    def _accepts(self, move: str) -> bool:
        """Whether TextArena takes `move` from the current player without calling it invalid (tried on a copy)."""
        try:
            trial = copy.deepcopy(self.game)
            state = trial.state
            calls: list[Any] = []
            original = state.set_invalid_move

            def record(*args: Any, **kwargs: Any) -> Any:  # the state forgets the flag by the end of its step
                calls.append(args)
                return original(*args, **kwargs)

            state.set_invalid_move = record
            with _in_textarena(self.ta_id), contextlib.redirect_stderr(io.StringIO()):
                trial.step(move)
        except Exception:
            return False
        return not calls

    def random_move(self, rng: np.random.Generator) -> str:
        """A random player: one of the moves the current observation offers, else a random bracketed word."""
        moves = self.legal_moves()
        if moves:
            return moves[int(rng.integers(len(moves)))]
        return "[" + "".join(chr(int(c)) for c in rng.integers(97, 123, size=4)) + "]"


# -- the catalogue: every id of TextArena's registry ------------------------------------------
def _players(ta: Any, spec: Any, needs: list[str]) -> int:
    """How many players the game takes: tried with TextArena itself, read from the source when it cannot load
    offline."""
    if not _missing(needs):
        for n in (1, 2, 3, 4, 5, 6):
            try:
                with no_downloads(spec.id), contextlib.redirect_stderr(io.StringIO()):
                    game = ta.make(spec.id)
                    game.reset(num_players=n, seed=0)
                return n
            except (SyntaxError, ImportError, FileNotFoundError) as exc:  # no player count loads it: say why
                needs.append(_broken(exc))
                break
            except Exception:
                continue
    module = spec.entry_point.split(":")[0] if isinstance(spec.entry_point, str) else spec.entry_point.__module__
    path = Path(require(FAMILY).__file__).parent.joinpath(*module.split(".")[1:]).with_suffix(".py")
    source = path.read_text(errors="replace") if path.is_file() else ""
    if "SinglePlayerState" in source:
        return 1
    bounds = re.search(r"(\d+)\s*<=\s*num_players", source) or re.search(r"num_players\s*==\s*(\d+)", source)
    return int(bounds.group(1)) if bounds else 2


def _broken(exc: Exception) -> str:
    """The requirement an id whose code cannot load on this Python/package gets (`envhub.availability`)."""
    if isinstance(exc, SyntaxError):
        return "python>=3.12"  # TextArena uses 3.12 f-strings in some games
    return f"broken:textarena {installed_version(FAMILY.distribution)} lacks a file ({type(exc).__name__})"


def _catalogue() -> list[dict[str, Any]]:
    """Every id TextArena registers, with its player count and what it needs from outside."""
    ta = require(FAMILY)
    from textarena.envs.registration import ENV_REGISTRY

    players_of: dict[str, tuple[int, list[str]]] = {}
    records = []
    for ta_id, spec in ENV_REGISTRY.items():
        module = spec.entry_point.split(":")[0] if isinstance(spec.entry_point, str) else spec.entry_point.__module__
        key = f"{spec.entry_point}"
        if key not in players_of:
            needs = _needs(module)
            players_of[key] = (_players(ta, spec, needs), needs)
        players, needs = players_of[key]
        game = module.split(".")[-2] if module.count(".") >= 2 else ta_id
        records.append({"ta_id": ta_id, "id": envhub_id(ta_id), "players": players, "needs": list(needs), "game": game})
    return records


def requirements(needs: list[str]) -> tuple[str, ...]:
    """A game's needs as `envhub.availability` requirements (`envhub list` marks the ids this machine cannot run)."""
    return tuple("network:OpenRouter" if need == "openrouter" else need for need in needs)


def _register(record: dict[str, Any]) -> str:
    from envhub.registry import register

    players = record["players"]
    needs = " (needs " + ", ".join(record["needs"]) + ")" if record["needs"] else ""
    common = {
        "tags": ("textarena", "game", "text-game", record["game"]),
        "source": FAMILY.distribution,
        "requires": requirements(record["needs"]),
    }
    if players == 1:
        register(
            record["id"],
            "envhub.envs.adapters.textarena:TextArenaEnv",
            kwargs={"ta_id": record["ta_id"], "needs": record["needs"]},
            max_episode_steps=200,
            description=f"TextArena {record['ta_id']} (one player){needs}",
            **{**common, "tags": common["tags"] + ("single-agent",)},
        )
        return "one-player"
    register(
        record["id"],
        "envhub.envs.adapters.textarena:TextArenaGame",
        kwargs={"ta_id": record["ta_id"], "num_players": players, "needs": record["needs"]},
        multiagent=True,
        description=f"TextArena {record['ta_id']} ({players} players){needs}",
        **common,
    )
    return "multi-player"


def register_envs() -> None:
    """Entry point: register every TextArena id under `ta-`."""
    register_family(FAMILY, _catalogue, _register)
