"""Letters-v0: every turn acts in the same state, and its anchor says so."""

from envhub.envs.letters import LettersEnv


def test_anchor_is_the_letters_on_reset_and_every_step_whatever_was_written():
    env = LettersEnv(letters="eaiou", turns=3)
    _, info = env.reset(seed=0)
    assert info["anchor"] == "letters=aeiou"
    for reply in ("aeiou", "xyz", ""):  # a good reply, a bad one, an empty one: the state stays
        *_, info = env.step(reply)
        assert info["anchor"] == "letters=aeiou"
    assert LettersEnv(letters="xyz").reset(seed=0)[1]["anchor"] == "letters=xyz"
