"""rg-<task>-v0: seeds are dataset indices, config kwargs pass through, reward is the task's own score_answer."""

import pytest
from gymnasium.utils.env_checker import check_env

import envhub

rg = pytest.importorskip("reasoning_gym", reason="needs reasoning-gym (pip install 'envhub[rg]')")

TASKS = ["basic_arithmetic", "word_sorting", "countdown", "letter_counting", "spell_backward"]


@pytest.mark.parametrize("task", TASKS)
def test_check_env_and_the_tasks_own_scorer_is_the_reward(task):
    env = envhub.make(f"rg-{task}-v0")
    check_env(env.unwrapped, skip_render_check=True)
    reference = rg.create_dataset(task, seed=0, size=10_000)
    for seed in (0, 7, 12_345):
        entry = reference[seed % 10_000]
        question, info = env.reset(seed=seed)
        assert question == entry["question"] and info["index"] == seed % 10_000
        _, reward, terminated, _, step_info = env.step(f"Let me think.\n<answer>{entry['answer']}</answer>")
        assert terminated and reward == reference.score_answer(entry["answer"], entry) == 1.0
        env.reset(seed=seed)
        _, wrong, _, _, _ = env.step("<answer>definitely not it</answer>")
        assert wrong == reference.score_answer("definitely not it", entry) < 1.0


def test_config_kwargs_pass_through_and_bad_ones_are_one_clear_error():
    small = envhub.make("rg-basic_arithmetic-v0", min_terms=2, max_terms=2, min_digits=1, max_digits=1)
    big = envhub.make("rg-basic_arithmetic-v0", min_terms=5, max_terms=5, min_digits=3, max_digits=3)
    assert len(small.reset(seed=1)[0]) < len(big.reset(seed=1)[0])
    assert envhub.make("rg-basic_arithmetic-v0", seed=5).reset(seed=1)[0] != small.reset(seed=1)[0]
    with pytest.raises(envhub.ConfigError, match="no_such_field"):
        envhub.make("rg-basic_arithmetic-v0", no_such_field=1)
    with pytest.raises(envhub.ConfigError, match="min_terms"):
        envhub.make("rg-basic_arithmetic-v0", min_terms=0)


def test_answer_extraction_last_tag_else_whole_reply():
    env = envhub.make("rg-basic_arithmetic-v0")
    env.reset(seed=3)
    expected = env.unwrapped.entry["answer"]
    _, reward, _, _, info = env.step(f"<answer>1</answer> no wait <answer> {expected} </answer>")
    assert reward == 1.0 and info["extracted_from_tags"] and info["answer"] == expected
    env.reset(seed=3)
    _, reward, _, _, info = env.step(f"  {expected}\n")
    assert reward == 1.0 and not info["extracted_from_tags"]


def test_a_scorer_that_crashes_on_junk_scores_zero():
    env = envhub.make("rg-prime_factorization-v0")
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("<answer>[c]</answer>")
    assert reward == 0.0 and terminated and "ValueError" in info["score_error"]


def test_composite_takes_datasets_as_dicts():
    env = envhub.make(
        "rg-composite-v0", datasets=[{"name": "basic_arithmetic", "weight": 1, "config": {"max_terms": 2}}]
    )
    question, info = env.reset(seed=2)
    assert question and info["task"] == "composite"
    with pytest.raises(envhub.ConfigError, match="needs datasets"):
        envhub.make("rg-composite-v0")


def test_step_before_reset_and_after_the_answer():
    env = envhub.make("rg-basic_arithmetic-v0")
    with pytest.raises(envhub.ResetNeeded):
        env.unwrapped.step("1")


def test_anchor_names_the_question_by_task_config_and_index():
    env = envhub.make("rg-basic_arithmetic-v0")
    _, info = env.reset(seed=7)
    assert info["anchor"].startswith("task=basic_arithmetic|config=") and info["anchor"].endswith("|index=7")
    assert envhub.make("rg-basic_arithmetic-v0").reset(seed=7)[1]["anchor"] == info["anchor"]  # another env, same
    assert env.reset(seed=8)[1]["anchor"] != info["anchor"]
    other_config = envhub.make("rg-basic_arithmetic-v0", max_terms=3)
    assert other_config.reset(seed=7)[1]["anchor"] != info["anchor"]  # index 7 of another dataset
    *_, step_info = env.step("<answer>0</answer>")
    assert step_info["anchor"] == env.reset(seed=8)[1]["anchor"] + "|answered"
