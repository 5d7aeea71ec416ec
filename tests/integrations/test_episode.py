"""`play_episode`: one envhub episode as prompt/response token ids with a loss mask, as verl and TRL consume it."""

import asyncio

import pytest

import envhub
from envhub.integrations.episode import play_episode
from tests.integrations.conftest import runs
from tests.integrations.lake import solver_reply


def solver_policy(env, tokenizer, replies):
    """A generate function that answers with FrozenLake's solver (tokenized, ending with the end-of-turn token)."""

    async def generate(ids, max_new_tokens):
        text = solver_reply(env)
        replies.append(text)
        out = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        return out[:max_new_tokens], [-0.5] * min(len(out), max_new_tokens)

    return generate


@pytest.mark.parametrize("template", ["smollm2", "qwen2.5 with tools"])
def test_the_token_layout_is_the_chat_template_of_the_conversation(template, request):
    tokenizer = request.getfixturevalue("tokenizer" if template == "smollm2" else "tool_tokenizer")
    env = envhub.make("FrozenLake-v0")
    replies = []
    episode = asyncio.run(play_episode(env, tokenizer, solver_policy(env, tokenizer, replies), seed=5))
    assert episode.finish_reason == "terminated" and episode.reward == 1.0 and episode.turns == len(replies) >= 2
    # the model's tokens are exactly its replies, each closed by its end-of-turn token
    model_turns = [tokenizer.decode(run) for run in runs(episode.response_mask, episode.response_ids, 1)]
    assert model_turns == [reply + "<|im_end|>" for reply in replies]
    assert episode.logprobs == [-0.5 if m else 0.0 for m in episode.response_mask]
    # prompt + response is the template's own rendering of the whole conversation (the last turn left open)
    obs, info = env.reset(seed=5)
    messages = [{"role": "system", "content": info["system_prompt"]}, {"role": "user", "content": obs}]
    for reply in replies:
        messages.append({"role": "assistant", "content": reply})
        obs, *_ = env.step(reply)
        messages.append({"role": "user", "content": obs})
    rendered = tokenizer.apply_chat_template(messages[:-1], tools=info["tools"], tokenize=False)
    assert tokenizer.decode(episode.prompt_ids + episode.response_ids) + "\n" == rendered
    assert ("<tools>" in tokenizer.decode(episode.prompt_ids)) == (template != "smollm2")  # the schema
    env.close()


def test_turn_and_token_limits_stop_the_episode(tokenizer):
    env = envhub.make("FrozenLake-v0")

    async def wander(ids, max_new_tokens):  # bumps into the top edge forever
        out = tokenizer('<tool_call>{"name": "move", "arguments": {"direction": "up"}}</tool_call>')["input_ids"]
        return out[:max_new_tokens], None

    by_turns = asyncio.run(play_episode(env, tokenizer, wander, seed=1, max_turns=3))
    assert (by_turns.finish_reason, by_turns.turns, by_turns.reward, by_turns.logprobs) == ("max_turns", 3, 0.0, None)
    by_tokens = asyncio.run(play_episode(env, tokenizer, wander, seed=1, max_turns=50, max_response_tokens=100))
    assert by_tokens.finish_reason == "max_tokens" and len(by_tokens.response_ids) == 100
    assert len(by_tokens.response_mask) == 100 and by_tokens.turns < 50
    env.close()
