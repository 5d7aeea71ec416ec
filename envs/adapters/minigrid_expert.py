"""Experts for the minigrid- envs: the BabyAI bot on BabyAI levels, a breadth-first planner on the others.

Each expert is told every action the agent actually takes (`observe`, before MiniGrid steps) and asked
for advice only when wanted (`suggest`), so a DAgger-style agent that ignores it gets advice from
wherever it went. `suggest()` returns a MiniGrid action index, or None when the expert has no way
from here (then it stays silent for the rest of the episode).
- The BabyAI bot (`minigrid.utils.baby_ai_bot`) can plan forever on some seeds of UnlockToUnlock and
  GoToImpUnlock, pushing subgoals without end: its plan stack is capped at 500 entries, and reaching
  the cap means no expert. Its AssertionError / DisappearedBoxError (a box opened by the agent) mean
  the same. The four levels its docstring calls unsolvable have no expert.
- The planner searches MiniGrid's own state (copies, deduplicated by `hash()`) up to `MAX_NODES`
  nodes for the shortest action sequence that earns a reward; it replans when the agent leaves the plan.
"""

from __future__ import annotations

import copy
from collections import deque
from typing import Any

STACK_LIMIT = 500
MAX_NODES = 20_000
UNSOLVABLE = ("BabyAI-KeyInBox-", "BabyAI-PutNextS5N2Carrying-", "BabyAI-PutNextS6N3Carrying-")
UNSOLVABLE += ("BabyAI-PutNextS7N4Carrying-",)


class _PlanTooLong(Exception):
    pass


class _GuardedStack(list):
    """The bot's subgoal stack, refusing to grow past STACK_LIMIT (the bot's endless replanning)."""

    def append(self, item: Any) -> None:
        if len(self) >= STACK_LIMIT:
            raise _PlanTooLong(f"the BabyAI bot's plan passed {STACK_LIMIT} subgoals")
        super().append(item)


class NoExpert:
    """A level without an expert."""

    def observe(self, action: int) -> None:
        """The agent takes `action`."""

    def suggest(self) -> int | None:
        """No advice."""
        return None


class BotExpert(NoExpert):
    """The BabyAI bot, made on first use and then fed every action taken."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.bot: Any = None
        self.failed = False
        self.taken: int | None = None
        self.advice: int | None = None
        self.consulted = False

    def _consult(self) -> None:
        self.consulted = True
        if self.failed:
            self.advice = None
            return
        try:
            if self.bot is None:
                from minigrid.utils.baby_ai_bot import BabyAIBot

                self.bot = BabyAIBot(self.env)
                self.bot.stack = _GuardedStack(self.bot.stack)
                self.taken = None
            self.advice = int(self.bot.replan(self.taken))
        except (_PlanTooLong, AssertionError, RecursionError, Exception):  # DisappearedBoxError and other dead ends
            self.failed, self.advice = True, None

    def observe(self, action: int) -> None:
        if self.bot is not None and not self.consulted:  # the bot must see every state it has not advised on
            self._consult()
        self.taken, self.consulted = action, False

    def suggest(self) -> int | None:
        if not self.consulted:
            self._consult()
        return self.advice


class PlannerExpert(NoExpert):
    """Breadth-first search over MiniGrid's state for the shortest rewarded action sequence."""

    def __init__(self, env: Any, actions: int, max_nodes: int = MAX_NODES) -> None:
        self.env = env
        self.actions = actions
        self.max_nodes = max_nodes
        self.plan: list[tuple[int, str]] = []  # (action, hash of the state it leads to)
        self.at = ""  # hash of the state the plan starts from
        self.failed = False

    def observe(self, action: int) -> None:
        if self.plan and self.plan[0][0] == action:
            self.at = self.plan.pop(0)[1]
        else:
            self.plan = []

    def suggest(self) -> int | None:
        if self.failed:
            return None
        state = self.env.unwrapped
        if not self.plan or self.at != state.hash():
            found = plan_from(state, self.actions, self.max_nodes)
            if found is None:
                self.failed = True
                return None
            self.plan, self.at = found, state.hash()
        return self.plan[0][0] if self.plan else None


def plan_from(state: Any, actions: int, max_nodes: int) -> list[tuple[int, str]] | None:
    """The shortest list of (action, next state's hash) from `state` that ends in a reward, or None."""
    start = _copy(state)
    start.gen_obs = _no_observation  # the planner reads states, not observations (half the cost of a step)
    seen = {start.hash()}
    queue: deque[tuple[Any, list[tuple[int, str]]]] = deque([(start, [])])
    nodes = 0
    while queue:
        node, path = queue.popleft()
        for action in range(actions):
            if _does_nothing(node, action):
                continue
            child = _copy(node)
            _, reward, terminated, truncated, _ = child.step(action)
            nodes += 1
            key = child.hash()
            if reward > 0:
                return [*path, (action, key)]
            if nodes >= max_nodes:
                return None
            if terminated or truncated or key in seen:
                continue
            seen.add(key)
            queue.append((child, [*path, (action, key)]))
    return None


def _no_observation() -> None:
    return None


_FIXED = ("observation_space", "action_space", "spec", "actions", "window", "clock")


def _copy(state: Any) -> Any:
    """A deep copy of MiniGrid's state that shares what never changes (spaces; walls, goals, lava and floor
    tiles, which hold no state): six times cheaper than a plain deep copy on an 8x8 grid."""
    memo = {id(v): v for k, v in vars(state).items() if k in _FIXED}
    memo.update({id(c): c for c in state.grid.grid if c is not None and c.type in ("wall", "goal", "lava", "floor")})
    return copy.deepcopy(state, memo)


def _does_nothing(state: Any, action: int) -> bool:
    """Pick up / toggle facing an empty cell, or drop with empty hands or onto something: MiniGrid leaves the
    state as it was, so the planner need not copy it to find out."""
    if action not in (3, 4, 5):
        return False
    front = state.grid.get(*state.front_pos)
    if action == 4:
        return state.carrying is None or front is not None
    return front is None


def expert_for(gym_id: str, env: Any) -> NoExpert:
    """The expert for a freshly reset level."""
    if gym_id.startswith(UNSOLVABLE):
        return NoExpert()
    if gym_id.startswith("BabyAI-"):
        return BotExpert(env)
    return PlannerExpert(env, int(env.action_space.n))
