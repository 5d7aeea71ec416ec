"""MiniGrid and BabyAI as text envs: `minigrid-<id>` for every id the installed minigrid registers.

`minigrid-BabyAI-GoToLocal-v0` and `minigrid-MiniGrid-DoorKey-8x8-v0` keep the original name whole
(`BabyAI-KeyCorridorS3R1-v0` and `MiniGrid-KeyCorridorS3R1-v0` both exist).
- Observation: the mission, the way the agent faces, what it carries, and what its 7x7 egocentric view
  shows, described from the view's encoding ("a closed red door 2 steps forward and 1 step left",
  "a wall 3 steps right"); MiniGrid itself has no text.
- Actions: "turn left", "turn right", "go forward", "pick up", "drop", "toggle", "done" (the
  Dynamic-Obstacles ids take only the first three), as text or an `act` tool call; aliases such as
  "left" or "forward" work. An unreadable reply changes nothing and uses up one step.
- Reward: MiniGrid's own (`1 - 0.9 * steps / max_steps` on success, else 0); `info["success"]`,
  and `info["progress"]` (BALROG's: 100 on success, else 0).
- Seeds: `reset(seed=s)` passes `s` to MiniGrid, which rebuilds the same grid and mission.
- Expert (`oracle_action()`, used by `ExpertAgent`): the BabyAI bot on BabyAI levels (fed every step's
  action, so it also advises after a detour), a breadth-first planner over MiniGrid's own state on
  the other ids; None when neither finds a way (`minigrid_expert`).
- Anchor (`info["anchor"]`): MiniGrid's own state: the agent's square, direction and what it carries, and a digest
  of the grid's encoding (every object with its colour and door state), the mission and, on BabyAI levels, what
  the instruction's verifier remembers (subgoals done, what was carried before the last step), e.g.
  `pos=3,5|dir=0|carrying=key:red|world=4b1d9e0f3a6c2d87`. MiniGrid's step count stays out: the success reward
  shrinks with it, but a counter in the anchor would make every turn's state unique.
- The six `MiniGrid-WFC-*` ids are refused with one line: minigrid 3.2.0's wheel lacks their pattern files.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import warnings
from typing import Any, ClassVar

from envhub.core import AgentEnv, UnicodeText, state_digest
from envhub.envs.adapters.family import (
    AdapterUnavailable,
    CommandMenu,
    Family,
    act,
    command_text,
    installed_version,
    register_family,
    require,
    upstream,
)
from envhub.errors import ResetNeeded

FAMILY = Family(
    name="minigrid", distribution="minigrid", module="minigrid", extra="minigrid", prefix="minigrid-", licence="MIT"
)
ACTIONS = ("turn left", "turn right", "go forward", "pick up", "drop", "toggle", "done")
ALIASES = {
    "left": "turn left",
    "right": "turn right",
    "forward": "go forward",
    "move forward": "go forward",
    "go straight": "go forward",
    "pickup": "pick up",
    "pick": "pick up",
    "take": "pick up",
    "put down": "drop",
    "open": "toggle",
    "open door": "toggle",
}
FACING = ("east", "south", "west", "north")  # MiniGrid's agent_dir 0..3
DOOR_STATES = ("open", "closed", "locked")
TEXT_LENGTH = 1 << 14


def describe(image: Any, facing: int, carrying: Any = None) -> str:
    """What the agent sees, from MiniGrid's egocentric 7x7 encoding (agent at the bottom middle, looking up)."""
    from minigrid.core.constants import IDX_TO_COLOR, IDX_TO_OBJECT

    width, height = image.shape[0], image.shape[1]
    ax, ay = width // 2, height - 1
    lines = [f"You face {FACING[facing % 4]}."]
    if carrying is not None:
        lines.append(f"You carry a {carrying.color} {carrying.type}.")
    for dx, dy, word in ((0, -1, "forward"), (-1, 0, "left"), (1, 0, "right")):  # nearest wall, if nothing is between
        x, y, k = ax + dx, ay + dy, 1
        while 0 <= x < width and 0 <= y < height:
            kind = IDX_TO_OBJECT[int(image[x, y, 0])]
            if kind == "wall":
                lines.append(f"a wall {_steps(k, word)}")
            if kind not in ("empty", "floor"):
                break
            x, y, k = x + dx, y + dy, k + 1
    things = []
    for y in range(height):
        for x in range(width):
            kind = IDX_TO_OBJECT[int(image[x, y, 0])]
            if (x, y) == (ax, ay) or kind in ("unseen", "empty", "wall", "floor", "agent"):
                continue
            color = IDX_TO_COLOR[int(image[x, y, 1])]
            if kind == "door":
                name = f"{DOOR_STATES[int(image[x, y, 2])]} {color} door"
            else:
                name = kind if kind in ("goal", "lava") else f"{color} {kind}"
            forward, side = ay - y, x - ax
            where = [_steps(forward, "forward")] if forward else []
            where += [_steps(abs(side), "left" if side < 0 else "right")] if side else []
            things.append((abs(forward) + abs(side), f"a {name} " + " and ".join(where)))
    lines += [text for _, text in sorted(things)]
    return "\n".join(lines)


def _steps(n: int, word: str) -> str:
    return f"{n} step{'s' if n != 1 else ''} {word}"


def _object(obj: Any) -> str:
    """An object as type:colour (with what a box holds), "" for none."""
    if obj is None:
        return ""
    inside = getattr(obj, "contains", None)
    return f"{obj.type}:{obj.color}" + (f"({_object(inside)})" if inside is not None else "")


def instruction_progress(instr: Any) -> list[list[Any]]:
    """What a BabyAI instruction's verifier remembers between steps, node by node (depth first); [] for none.

    Sequences keep which part is done (`a_done`, `b_done`), pick-up and put-next clauses what was carried before the
    last step, clauses of levels with a `done` action whether the last step met them.
    """
    if instr is None:
        return []
    node = [
        str(getattr(instr, "a_done", "")),
        str(getattr(instr, "b_done", "")),
        bool(getattr(instr, "lastStepMatch", False)),
        _object(getattr(instr, "preCarrying", None)),
    ]
    return [
        node,
        *instruction_progress(getattr(instr, "instr_a", None)),
        *instruction_progress(getattr(instr, "instr_b", None)),
    ]


def system_prompt(actions: tuple[str, ...]) -> str:
    """The instructions for an env whose legal actions are `actions`."""
    return (
        "You are an agent in a grid world, seeing a 7x7 area in front of you. Complete the mission. "
        f"Each turn reply with exactly one action: {', '.join(actions)}. "
        "'toggle' opens or closes the door (or box) right in front of you; 'pick up' takes the object right in "
        "front of you (you can carry one); 'drop' puts it in front of you; 'done' says the mission is complete. "
        'You may also call the tool: <tool_call>{"name": "act", "arguments": {"action": "go forward"}}</tool_call>.'
    )


class MiniGridEnv(AgentEnv):
    """A MiniGrid or BabyAI level as text: the mission and a description of the view, one action per step."""

    tools = (act,)
    reward_doc: ClassVar[str] = "MiniGrid's own: 1 - 0.9 * steps / max_steps on success, else 0"

    def __init__(
        self, gym_id: str, max_steps: int | None = None, render_mode: str | None = None, **kwargs: Any
    ) -> None:
        require(FAMILY, f"minigrid-{gym_id}")
        import gymnasium
        import minigrid  # noqa: F401  (registers MiniGrid's ids with gymnasium)

        if "-WFC-" in gym_id:  # also when made directly, not through envhub.make (which checks `requires`)
            raise AdapterUnavailable(
                f"minigrid {installed_version('minigrid')} cannot run {gym_id}: its wheel lacks the WFC pattern files",
                hint="pick another minigrid- id",
            )
        options = {**kwargs, **({"max_steps": max_steps} if max_steps is not None else {})}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # gymnasium's notes on old versions and its passive checker
                self.env = gymnasium.make(gym_id, disable_env_checker=True, **options)
        except TypeError as exc:
            raise upstream(f"minigrid's {gym_id}", FAMILY.distribution, exc) from None
        self.gym_id = gym_id
        self.render_mode = render_mode
        self.actions = ACTIONS[: int(self.env.action_space.n)]
        self.menu = CommandMenu(self.actions, {k: v for k, v in ALIASES.items() if v in self.actions})
        self.system_prompt = system_prompt(self.actions)
        self.observation_space = UnicodeText(TEXT_LENGTH)
        self.expert: Any = None
        self._done = True
        self._wasted = 0  # unreadable replies: each uses up a step without moving MiniGrid
        self._last = ""

    @property
    def game(self) -> Any:
        """MiniGrid's own env object (grid, agent position, mission)."""
        return self.env.unwrapped

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        level_seed = seed if seed is not None else int(self.np_random.integers(2**31))
        with contextlib.redirect_stdout(io.StringIO()):  # BabyAI's "Sampling rejected" lines
            observation, _ = self.env.reset(seed=level_seed)
        from envhub.envs.adapters.minigrid_expert import expert_for

        self.expert = expert_for(self.gym_id, self.env)
        self._done, self._wasted = False, 0
        self._last = self._text(observation)
        return self._last, self.base_info(
            mission=str(observation["mission"]),
            legal_actions=list(self.actions),
            level_seed=level_seed,
            anchor=self.anchor(),
        )

    def step(self, action: str | dict[str, Any]) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._done:
            raise ResetNeeded(f"the {self.gym_id} episode is over", hint="call reset() to start a new one")
        text = command_text(action)
        chosen = self.menu.read(text)
        if chosen is None:
            self._wasted += 1
            truncated = self.game.step_count + self._wasted >= self.game.max_steps
            self._done = truncated
            return self.menu.unknown(text), 0.0, False, truncated, self._info(0.0, invalid=True)
        index = self.actions.index(chosen)
        self.expert.observe(index)
        observation, reward, terminated, truncated, _ = self.env.step(index)
        truncated = bool(truncated) or self.game.step_count + self._wasted >= self.game.max_steps
        self._done = bool(terminated or truncated)
        self._last = self._text(observation)
        return self._last, float(reward), bool(terminated), truncated and not terminated, self._info(float(reward))

    def _info(self, reward: float, invalid: bool = False) -> dict[str, Any]:
        success = reward > 0
        return {
            "success": success,
            "progress": 100.0 if success else 0.0,
            "invalid_action": invalid,
            "legal_actions": [] if self._done else list(self.actions),
            "anchor": self.anchor(),
        }

    def anchor(self) -> str | None:
        """The agent's square, direction and load, and a digest of the grid, the mission and the verifier's memory."""
        game = self.game
        if game.agent_pos is None:
            return None
        grid = game.grid.encode()
        world = [
            list(grid.shape),
            state_digest(grid.tobytes()),
            str(game.mission),
            instruction_progress(getattr(game, "instrs", None)),
        ]
        x, y = (int(v) for v in game.agent_pos)
        return f"pos={x},{y}|dir={int(game.agent_dir)}|carrying={_object(game.carrying)}|world={state_digest(world)}"

    def _text(self, observation: dict[str, Any]) -> str:
        view = describe(observation["image"], int(observation["direction"]), self.game.carrying)
        return f"Mission: {observation['mission']}\n{view}"

    def oracle_action(self) -> str | None:
        """The expert's next action (BabyAI bot or planner), or None when it has none from here."""
        if self._done or self.expert is None:
            return None
        index = self.expert.suggest()
        return None if index is None or index >= len(self.actions) else self.actions[index]

    def render_text(self) -> str:
        return self._last

    def close(self) -> None:
        self.env.close()


# -- the catalogue: every id minigrid registers with gymnasium --------------------------------------------
_VERSION = re.compile(r"^(?P<name>.+)-v(?P<version>\d+)$")


def _catalogue() -> list[dict[str, Any]]:
    """Every minigrid id in gymnasium's registry: its action count, and whether it runs and is current."""
    require(FAMILY)
    import gymnasium
    import minigrid  # noqa: F401

    ids = sorted(
        k for k, s in gymnasium.registry.items() if isinstance(s.entry_point, str) and "minigrid." in s.entry_point
    )
    newest: dict[str, int] = {}
    for gym_id in ids:
        match = _VERSION.match(gym_id)
        if match:
            newest[match["name"]] = max(newest.get(match["name"], 0), int(match["version"]))
    return [_record(gymnasium, gym_id, newest) for gym_id in ids]


def _record(gymnasium: Any, gym_id: str, newest: dict[str, int]) -> dict[str, Any]:
    match = _VERSION.match(gym_id)
    record: dict[str, Any] = {
        "gym_id": gym_id,
        "suite": "babyai" if gym_id.startswith("BabyAI-") else "minigrid",
        "deprecated": bool(match) and int(match["version"]) < newest[match["name"]],
        "actions": 7,
        "requires": [],
    }
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            env = gymnasium.make(gym_id, disable_env_checker=True)
            record["actions"] = int(env.action_space.n)
            env.reset(seed=0)
            record["mission"] = str(env.unwrapped.mission)[:120]
    except Exception as exc:  # WFC ids: pattern files missing from the 3.2.0 wheel
        version = installed_version("minigrid")
        if isinstance(exc, FileNotFoundError) and exc.filename:
            why = f"minigrid {version}'s wheel lacks {os.path.basename(exc.filename)}, which it needs"
        else:
            why = f"minigrid {version} cannot build it ({type(exc).__name__}: {' '.join(str(exc).split())[:120]})"
        record["requires"] = [f"broken:{why}"]
    return record


def _register(record: dict[str, Any]) -> str:
    from envhub.registry import register

    tags = ("minigrid", record["suite"], "text-game", "single-agent") + (
        ("deprecated",) if record["deprecated"] else ()
    )
    example = f", e.g. {record['mission']!r}" if record.get("mission") else ""
    register(
        f"{FAMILY.prefix}{record['gym_id']}",
        "envhub.envs.adapters.minigrid:MiniGridEnv",
        kwargs={"gym_id": record["gym_id"]},
        tags=tags,
        description=f"{record['gym_id']} as text ({record['actions']} actions{example})",
        source=FAMILY.distribution,
        requires=tuple(record["requires"]),
    )
    return record["suite"]


def register_envs() -> None:
    """Entry point: register `minigrid-<id>` for every installed MiniGrid and BabyAI id."""
    register_family(FAMILY, _catalogue, _register)
