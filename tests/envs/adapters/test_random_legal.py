"""Random means random legal: envs list their legal actions in `info["legal_actions"]` and `RandomAgent` picks among
them, so random baselines on adapted games are not forfeits for writing moves in the wrong format."""

import asyncio
import warnings

import numpy as np
import pytest

import envhub
from envhub.agents import RandomAgent
from envhub.envs.adapters.textarena_moves import legal_moves
from envhub.eval import evaluate

ta = pytest.importorskip("textarena", reason="needs textarena (pip install 'envhub[textarena]')")
from envhub.availability import unavailable  # noqa: E402

# Games whose text shows no well-formed move to copy (only prose: "[Propose] followed by 8 letters", "A:5, B:10, C:5",
# Tak's stack notation), so a random player cannot be sure of the format; docs/adapters.md lists them.
UNREADABLE_FORMAT = {"Chopsticks", "ColonelBlotto", "NewRecruit", "Tak", "MemoryGame", "Golf", "GameOfPureStrategy"}
_FORMAT_COMPLAINT = ("format", "did not respond with", "use exactly", "please use", "must contain", "use “[")


def _one_per_game():
    chosen, seen = [], set()
    for spec in sorted(envhub.list_envs(tag="textarena"), key=lambda s: (s.id.count("-"), s.id)):
        game = spec.tags[3]
        if spec.multiagent and game not in seen and not unavailable(spec):
            seen.add(game)
            chosen.append(spec)
    return chosen


MULTIPLAYER = _one_per_game()


def test_random_agent_picks_among_the_legal_actions():
    agent = RandomAgent(seed=1)
    agent.reset({"tools": []})
    picks = {asyncio.run(agent.act("", {"legal_actions": ["[up]", "[down]"]})) for _ in range(20)}
    assert picks == {"[up]", "[down]"}


def test_moves_are_read_from_the_games_own_words():
    assert legal_moves("Current Board: ...\nAvailable Moves: '[0]', '[1]', '[8]'") == ["[0]", "[1]", "[8]"]
    assert legal_moves("Available Moves: up, down, left, right") == ["[up]", "[down]", "[left]", "[right]"]
    assert legal_moves("Your possible actions: '[check]', '[bet X]'") == ["[check]", "[bet 1]"]
    assert legal_moves("[GAME] For example: '[col 4]' or '[col 1]'.") == ["[col 4]", "[col 1]"]
    assert legal_moves("Player 0 says hello") == []


def test_a_one_player_game_lists_its_moves_in_the_format_it_wants():
    env = envhub.make("ta-Sokoban-raw-v0")
    _, info = env.reset(seed=0)
    assert set(info["legal_actions"]) <= {"[up]", "[down]", "[left]", "[right]"} and info["legal_actions"]
    _, _, _, _, info = env.step(info["legal_actions"][0])
    assert "invalid" not in str(info.get("step_info", "")).lower() or info["legal_actions"]


def test_random_tictactoe_is_played_not_forfeited():
    """Seen before: `envhub eval ta-TicTacToe-v0 --agent random` scored -1.0 on both seats (moves like "house")."""
    summary = asyncio.run(evaluate(["ta-TicTacToe-v0"], RandomAgent, episodes=6))
    for seat in ("ta-TicTacToe-v0#seat0", "ta-TicTacToe-v0#seat1"):
        assert summary[seat]["mean_reward"] > -0.9 and not summary[seat]["errors"]


def test_gem_games_list_actions_in_their_boxed_format():
    pytest.importorskip("gem", reason="needs gem-llm")
    env = envhub.make("gem-game-Sokoban-easy-v0")
    _, info = env.reset(seed=0)
    assert info["legal_actions"] == ["\\boxed{up}", "\\boxed{down}", "\\boxed{left}", "\\boxed{right}"]
    env = envhub.make("gem-game-Minesweeper-easy-v0")
    _, first = env.reset(seed=3)
    _, again = env.reset(seed=3)
    assert first["legal_actions"] == again["legal_actions"] and all(
        a.startswith("\\boxed{") for a in first["legal_actions"]
    )


@pytest.mark.slow
@pytest.mark.parametrize("spec", MULTIPLAYER, ids=[s.id for s in MULTIPLAYER])
def test_no_random_player_forfeits_for_format(spec):
    game = envhub.make_multiagent(spec.id)
    rng = np.random.default_rng(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            game.reset(seed=0)
            for _ in range(12):
                if game.game_over():
                    break
                game.step(game.random_move(rng))
        except envhub.EnvhubError as exc:  # an upstream bug (e.g. CharacterConclave), said in one line
            assert "\n" not in str(exc)
            return
    if not game.game_over():
        return
    info = game.game.state.game_info
    reasons = [str(v.get("reason", "")) for v in info.values() if v.get("invalid_move")]
    about_format = [r for r in reasons if any(k in r.lower() for k in _FORMAT_COMPLAINT)]
    if spec.tags[3] in UNREADABLE_FORMAT:
        return
    assert not about_format, f"{spec.id}: a random player forfeited for format: {about_format}"
