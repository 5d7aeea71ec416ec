"""Wordle: real-game feedback with repeated letters, the word list, invalid guesses, and the solvers."""

import pytest

import envhub
from envhub.envs.wordle import WordleEnv, candidates, feedback, solve_step, word_list


@pytest.mark.parametrize(
    "guess, answer, marks",
    [
        ("crane", "crane", "GGGGG"),
        ("speed", "abide", "--Y-Y"),  # only one E is yellow: the answer has one E
        ("eerie", "there", "Y-Y-G"),  # the green E uses up one of the two E's
        ("llama", "hello", "YY---"),
        ("geese", "eagle", "YY--G"),
        ("abbey", "babes", "YYGG-"),
        ("mamma", "maxim", "GGY--"),  # the leftmost extra M takes the one unmatched M
    ],
)
def test_feedback_handles_repeated_letters_like_real_wordle(guess, answer, marks):
    assert feedback(guess, answer) == marks


def test_word_list_ships_with_the_package():
    words = word_list()
    assert 1000 <= len(words) <= 2000 and len(set(words)) == len(words)
    assert all(len(w) == 5 and w.isalpha() and w.islower() for w in words)
    assert {"crane", "house", "water"} <= set(words)


def test_candidate_solver_wins_at_least_95_of_100_games_in_six():
    env = envhub.make("Wordle-v0")
    wins = 0
    for seed in range(100):
        env.reset(seed=seed)
        total, terminated = 0.0, False
        while not terminated:
            _, reward, terminated, truncated, info = env.step(env.unwrapped.oracle_action())
            total += reward
            assert not truncated
        wins += total == 1.0 and info["guesses_used"] <= 6
    assert wins >= 95


def test_oracle_answer_wins_in_one_guess():
    env = WordleEnv()
    for seed in range(10):
        env.reset(seed=seed)
        obs, reward, terminated, _, info = env.step(
            f'<tool_call>{{"name": "guess", "arguments": {{"word": "{env.answer}"}}}}</tool_call>'
        )
        assert reward == 1.0 and terminated and info["success"] and "in 1 guess!" in obs


def test_solver_guesses_stay_consistent_with_the_feedback():
    words = word_list()
    history = [("crane", feedback("crane", "ghost"))]
    assert "ghost" in candidates(history, words)
    assert all(feedback("crane", w) == history[0][1] for w in candidates(history, words))
    history.append((solve_step(history), ""))
    history[-1] = (history[-1][0], feedback(history[-1][0], "ghost"))
    assert "ghost" in candidates(history, words)


def test_invalid_guesses_do_not_use_up_a_guess():
    env = WordleEnv(max_guesses=3)
    env.reset(seed=0)
    for action, expected in [
        ("[abcde]", "ABCDE is not in the word list"),
        ("[toolong]", "TOOLONG has 7 letters"),
        ("[c4ane]", "is not a word"),
        ("I am thinking hard", "Put your guess in square brackets"),
    ]:
        obs, reward, terminated, _, info = env.step(action)
        assert expected in obs and "did not use up a guess" in obs
        assert reward == 0.0 and not terminated and info["guesses_left"] == 3 and info["invalid_action"]


def test_brackets_last_wins_and_a_lone_word_counts_and_running_out_ends_the_game():
    env = WordleEnv(max_guesses=2)
    env.reset(seed=1)
    wrong = [w for w in ("crane", "moist") if w != env.answer]
    obs, *_, info = env.step(f"Maybe [house]... no, [{wrong[0]}]")
    assert info["history"][0][0] == wrong[0] and obs.startswith(wrong[0].upper())
    obs, reward, terminated, _, info = env.step(f"  {wrong[-1].upper()}. ")
    assert terminated and reward == 0.0 and f"The word was {env.answer.upper()}" in obs
    assert "Letters not in the word" in env.render_text() or "Letters in the word" in env.render_text()


def test_anchor_is_the_set_of_guesses_and_feedback_in_any_order():
    env = WordleEnv()
    _, info = env.reset(seed=4)
    assert info["anchor"] == "guesses="
    first, second = [w for w in ("crane", "moist", "plumb") if w != env.answer][:2]
    env.step(f"[{first}]")
    one_way = env.step(f"[{second}]")[4]["anchor"]
    env.reset(seed=4)
    env.step(f"[{second}]")
    other_way = env.step(f"[{first}]")[4]["anchor"]
    assert one_way == other_way
    assert one_way == "guesses=" + ";".join(sorted(f"{w}:{feedback(w, env.answer)}" for w in (first, second)))


def test_anchor_changes_with_each_guess_and_not_with_an_invalid_one():
    env = WordleEnv()
    start = env.reset(seed=4)[1]["anchor"]
    *_, info = env.step("[abcde]")
    assert info["invalid_action"] and info["anchor"] == start
    word = next(w for w in ("crane", "moist") if w != env.answer)
    once = env.step(f"[{word}]")[4]["anchor"]
    twice = env.step(f"[{word}]")[4]["anchor"]  # a repeated guess still uses one up: not the same state
    assert len({start, once, twice}) == 3
    other = WordleEnv()
    other.reset(seed=4)
    assert other.step("[plumb]")[4]["anchor"] != once
