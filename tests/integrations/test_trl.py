"""envhub envs in TRL (trl 1.16): the environment class TRL sees, the dataset, and real GRPOTrainer runs on the CPU."""

import inspect
import os

import pytest

import envhub
from envhub.integrations.trl import EPISODE_OVER, dataset, environment_factory, tool_method, use_tool_template
from tests.integrations.conftest import runs
from tests.integrations.lake import lake_move, move_call

trl = pytest.importorskip("trl")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16


def tools_as_trl_sees_them(instance):
    """What GRPOTrainer collects from an environment instance (trl/trainer/grpo_trainer.py)."""
    names = [n for n, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)]
    return sorted(n for n in names if n not in ("reset", "get_reward") and not n.startswith("_"))


@pytest.mark.parametrize("env_id", ["FrozenLake-v0", "Sokoban-v0", "Wordle-v0", "Math-v0", "TicTacToe-SelfPlay-v0"])
def test_tool_methods_give_back_the_envs_schemas(env_id):
    from transformers.utils import get_json_schema

    instance = environment_factory(env_id)()
    _, info = envhub.make(env_id).reset(seed=0)
    for schema in info["tools"]:
        got = get_json_schema(getattr(instance, schema["function"]["name"]))["function"]
        want = schema["function"]
        assert got["name"] == want["name"] and got["description"] == " ".join(want["description"].split())
        assert set(got["parameters"].get("required", [])) == set(want["parameters"].get("required", []))
        for name, prop in want["parameters"]["properties"].items():
            assert got["parameters"]["properties"][name]["type"] == prop["type"]
            assert got["parameters"]["properties"][name].get("enum") == prop.get("enum")
    assert tools_as_trl_sees_them(instance) == sorted(t["function"]["name"] for t in info["tools"])


def test_the_environment_class_plays_an_episode_as_trl_drives_it():
    instance = environment_factory("FrozenLake-v0")()
    env = envhub.make("FrozenLake-v0")
    obs, _ = env.reset(seed=4)
    row = dataset("FrozenLake-v0", [4])[0]
    assert instance.reset(**row) == obs  # every column of the row arrives; the seed picks the lake
    for direction in env.unwrapped.solve():
        reply = instance.move(direction=direction)
    assert reply.endswith(EPISODE_OVER) and "You reached the goal!" in reply and instance.get_reward() == 1.0
    assert instance.move(direction="up") == EPISODE_OVER  # TRL's model may go on calling tools
    filled = {**row, "prompt": [{"role": "user", "content": "Play well."}]}
    assert instance.reset(**filled).startswith("\n\n")  # TRL glues it to the last message: keep a gap
    assert instance.get_reward() == 0.0
    with pytest.raises(envhub.ConfigError, match="a row for Wordle-v0 reached the FrozenLake-v0"):
        instance.reset(**{**row, "env_id": "Wordle-v0"})


def test_the_dataset_has_one_row_per_seed_and_names_the_env_for_mixtures():
    one = dataset("Wordle-v0", [3, 5])
    assert one["seed"] == [3, 5] and one["env_id"] == ["Wordle-v0"] * 2 and "environment" not in one.column_names
    system, user = one[0]["prompt"]
    assert system["role"] == "system" and "Wordle" in system["content"]
    assert (user["role"], user["content"], user["envhub_env"], user["envhub_seed"]) == ("user", "", "Wordle-v0", 3)
    mixed = dataset(["Wordle-v0", "FrozenLake-v0"], [0])
    assert mixed["environment"] == ["Wordle-v0", "FrozenLake-v0"]
    factories = environment_factory(["Wordle-v0", "FrozenLake-v0"])
    assert sorted(factories) == ["FrozenLake-v0", "Wordle-v0"]


def test_what_cannot_become_a_trl_environment_is_refused():
    with pytest.raises(envhub.ConfigError, match="Letters-v0 offers no tools") as err:
        environment_factory("Letters-v0")
    assert "rollout_func" in err.value.hint
    with pytest.raises(envhub.ConfigError, match="cannot be a Python method"):
        tool_method({"type": "function", "function": {"name": "look-around", "parameters": {}}})
    with pytest.raises(envhub.EnvNotFound):
        environment_factory("NoSuchEnv-v0")


def test_use_tool_template_gives_smollm2_tool_calling(tokenizer):
    from trl.chat_template_utils import supports_tool_calling

    assert not supports_tool_calling(tokenizer)
    fixed = use_tool_template(tokenizer.__class__.from_pretrained(tokenizer.name_or_path))
    assert supports_tool_calling(fixed) and fixed.eos_token == "<|im_end|>"
    plain = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    plain.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    with pytest.raises(envhub.ConfigError, match="not ChatML"):
        use_tool_template(plain)


# -- real GRPOTrainer runs ---------------------------------------------------------------------------------------


def grpo_args(tmp_path, **overrides):
    import torch

    torch.set_num_threads(1)  # on a shared 2-core box one thread is much faster than two contending
    settings = dict(
        output_dir=str(tmp_path),
        use_cpu=True,  # GRPOConfig defaults to bf16 on a GPU
        per_device_train_batch_size=2,
        num_generations=2,
        max_steps=2,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=0,
    )
    return trl.GRPOConfig(**{**settings, **overrides})


def solver_llama(tokenizer):
    """The tiny random Llama with sampling replaced by a FrozenLake solver that reads the conversation: TRL trains
    its weights on the solver's tool calls (a random model almost never writes one, leaving the tool loop idle)."""
    import torch
    from transformers import LlamaForCausalLM

    from envhub.trainer.models import tiny_llama

    class SolverLlama(LlamaForCausalLM):
        def generate(self, input_ids=None, attention_mask=None, **kwargs):
            rows = []
            for ids, mask in zip(input_ids, attention_mask):
                text = tokenizer.decode(ids[mask.bool()])
                move = None if EPISODE_OVER in text else lake_move(text)
                reply = move_call(move) if move else "Done."
                rows.append(tokenizer(reply, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
            width = max(map(len, rows))
            rows = [r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows]
            return torch.cat([input_ids, torch.tensor(rows, dtype=input_ids.dtype, device=input_ids.device)], 1)

    base = tiny_llama(tokenizer)
    model = SolverLlama(base.config)
    model.load_state_dict(base.state_dict())
    return model


@pytest.mark.slow
def test_grpo_trainer_trains_on_a_tool_env_through_environment_factory(tool_tokenizer, tmp_path):
    train = dataset("FrozenLake-v0", [11, 12], size=3)
    seeds = []

    class Recorded(environment_factory("FrozenLake-v0", size=3)):
        def reset(self, **row):
            seeds.append(row["seed"])
            return super().reset(**row)

    trainer = trl.GRPOTrainer(
        model=solver_llama(tool_tokenizer),
        args=grpo_args(tmp_path, max_completion_length=512, max_tool_calling_iterations=8),
        train_dataset=train,
        processing_class=tool_tokenizer,
        environment_factory=Recorded,
    )
    trainer.train()
    logs = [h for h in trainer.state.log_history if "reward" in h]
    assert len(logs) == 2
    for log in logs:  # every rollout reached the goal through its move() calls, and TRL scored it by get_reward()
        assert log["rewards/Recorded/mean"] == 1.0 and log["tools/call_frequency"] >= 2
        assert log["tools/failure_frequency"] == 0
    assert sorted(seeds) == [11, 11, 12, 12] and seeds[0] == seeds[1]  # one seed per GRPO group
    assert all(env.get_reward() == 1.0 for env in trainer.environments)


def test_grpo_trainer_trains_on_a_text_env_through_rollout_func(tokenizer, tmp_path):
    from envhub.integrations.trl import env_reward, rollout_func
    from envhub.trainer.models import tiny_llama

    letters = set("aeiou")
    outputs, group_seeds = [], []

    def recorded(prompts, trainer):
        outputs.append(rollout(prompts, trainer))
        return outputs[-1]

    def seeds_of_group(prompts, **kwargs):
        group_seeds.append([p[-1]["envhub_seed"] for p in prompts])
        return [0.0] * len(prompts)

    rollout = rollout_func(max_turns=2, max_new_tokens=12, turns=2)
    trainer = trl.GRPOTrainer(
        model=tiny_llama(tokenizer),
        args=grpo_args(tmp_path, per_device_train_batch_size=4, max_completion_length=64),
        train_dataset=dataset("Letters-v0", range(8), turns=2),
        processing_class=tokenizer,
        reward_funcs=[env_reward, seeds_of_group],
        rollout_func=recorded,
    )
    trainer.train()
    assert [s[0] == s[1] and s[2] == s[3] for s in group_seeds] == [True, True]
    for out in outputs:
        rows = zip(out["completion_ids"], out["env_mask"], out["env_reward"], out["env_turns"])
        for ids, mask, reward, turns in rows:
            assert turns == 2 and len(ids) == len(mask) <= 64
            # the env's reward is Letters' score of the model's own tokens, turn by turn
            texts = [tokenizer.decode(run, skip_special_tokens=True) for run in runs(mask, ids, 1)]
            chars = [[c for c in text.lower() if not c.isspace()] for text in texts]
            scores = [sum(c in letters for c in cs) / len(cs) if cs else 0.0 for cs in chars]
            assert len(texts) == 2 and reward == pytest.approx(sum(scores))
    logged = [h["rewards/env_reward/mean"] for h in trainer.state.log_history if "reward" in h]
    assert logged == [pytest.approx(sum(o["env_reward"]) / 4) for o in outputs]
    with pytest.raises(envhub.ConfigError, match="a prompt names no env"):  # a dataset not made by dataset()
        rollout([[{"role": "user", "content": "hello"}]], trainer)
