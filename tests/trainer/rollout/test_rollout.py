"""Rollouts against a real tiny model: exact ids, masks, logprobs and versions on multi-turn episodes."""

import asyncio

import pytest

import envhub
from envhub.chat_tokens import ChatTokens
from envhub.trainer.config import RolloutConfig, TaskConfig
from envhub.trainer.rollout.sources import LocalRollouts
from envhub.trainer.rollout.worker import RolloutWorker
from envhub.trainer.trajectory import anchor_key


def recording(engine_cls, model, tokenizer):
    """A EmbeddedEngine that keeps what each generate call returned."""

    class Recording(engine_cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.calls = []

        async def generate(self, input_ids, sampling, **kwargs):
            result = await super().generate(input_ids, sampling, **kwargs)
            self.calls.append((list(input_ids), result))
            return result

    return Recording(model, tokenizer)


async def test_multi_turn_ids_and_masks_are_exact(engine_cls, tiny_model, tokenizer):
    engine = recording(engine_cls, tiny_model, tokenizer)
    worker = RolloutWorker(engine, tokenizer, RolloutConfig(max_turns=3, max_new_tokens=5, temperature=1.0))
    traj = await worker.run_episode(lambda: envhub.make("GuessNumberTest-v0", turns=10), "GuessNumberTest-v0", seed=3)
    await engine.close()
    assert traj.turns == len(engine.calls) and traj.turns >= 1

    enc = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]
    system = "Guess the secret digit. Answer with one digit."
    expected = enc(
        f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nI am thinking of a digit from 0 to "
        f"9.<|im_end|>\n<|im_start|>assistant\n"
    )
    mask = [0] * len(expected)
    env = envhub.make("GuessNumberTest-v0", turns=10)
    env.reset(seed=3)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for turn, (prompt, result) in enumerate(engine.calls):
        assert prompt == expected  # the engine always saw exactly the ids built so far
        out = result.output_ids
        expected += out
        mask += [1] * len(out)
        closing = "\n" if out[-1] == im_end else "<|im_end|>\n"
        body = out[:-1] if out[-1] == im_end else out
        obs, _, terminated, truncated, _ = env.step(tokenizer.decode(body, skip_special_tokens=True))
        if terminated or truncated or turn == 2:
            expected += enc(closing)
            mask += [0] * len(enc(closing))
            break
        delta = enc(f"{closing}<|im_start|>user\n{obs}<|im_end|>\n<|im_start|>assistant\n")
        expected += delta
        mask += [0] * len(delta)
    assert traj.input_ids == expected
    assert traj.loss_mask == mask
    model_lps = [lp for lp, m in zip(traj.behavior_logprobs, mask) if m]
    assert model_lps == [lp for _, r in engine.calls for lp in r.logprobs]
    assert all(v == 0 for v, m in zip(traj.versions, mask) if m) and all(
        v == -1 for v, m in zip(traj.versions, mask) if not m
    )
    assert traj.finish_reason in ("max_turns", "terminated") and traj.env_info["secret"] == env.unwrapped.secret


async def test_each_model_turn_keeps_its_span_reward_and_anchor(engine_cls, tiny_model, tokenizer):
    """Step-level credit's input: per model turn, the span of exactly the ids the engine sampled, the env's reward
    for that turn and the anchor of the state it acted in (Corridor-v0 gives its square; with no info["anchor"] the
    key is a digest of the observation the turn saw)."""
    engine = recording(engine_cls, tiny_model, tokenizer)
    worker = RolloutWorker(engine, tokenizer, RolloutConfig(max_turns=6, max_new_tokens=3, temperature=1.0))
    traj = await worker.run_episode(lambda: envhub.make("Corridor-v0", length=2, max_turns=6), "Corridor-v0", seed=1)
    plain = await worker.run_episode(lambda: envhub.make("GuessNumberTest-v0", turns=10), "GuessNumberTest-v0", seed=3)
    await engine.close()
    assert len(traj.turn_spans) == traj.turns == len(engine.calls) - plain.turns >= 2
    env = envhub.make("Corridor-v0", length=2, max_turns=6)
    _, info = env.reset(seed=1)
    for span, (_, result) in zip(traj.turn_spans, engine.calls):
        assert traj.input_ids[span.start : span.end] == list(result.output_ids)
        assert all(traj.loss_mask[span.start : span.end])
        assert span.anchor == "env:" + info["anchor"]
        body = result.output_ids[:-1] if result.finish_reason == "stop" else result.output_ids
        _, reward, *_, info = env.step(tokenizer.decode(body, skip_special_tokens=True))
        assert span.reward == reward
    assert sum(traj.loss_mask) == sum(s.end - s.start for s in traj.turn_spans)
    assert sum(s.reward for s in traj.turn_spans) == traj.reward
    turns = [t for t in traj.turn_log if t["kind"] == "turn"]
    assert [(t["span"], t["anchor"]) for t in turns] == [([s.start, s.end], s.anchor) for s in traj.turn_spans]
    first = plain.turn_spans[0].anchor
    assert first.startswith("obs:") and first == anchor_key({}, "I am thinking of a digit from 0 to 9.")


def test_assistant_turn_that_stopped_keeps_the_model_ids(tokenizer):
    chat = ChatTokens(tokenizer)
    prompt = chat.add_messages([{"role": "user", "content": "hi"}])
    said = tokenizer("hello there", add_special_tokens=False)["input_ids"]
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    text, closing = chat.add_assistant(said + [im_end], {im_end})
    assert text == "hello there" and tokenizer.decode(closing) == "\n"
    follow = chat.add_messages([{"role": "user", "content": "again"}])
    full = tokenizer.apply_chat_template(chat.messages, tokenize=False, add_generation_prompt=True)
    assert tokenizer.decode(prompt + said + [im_end] + closing + follow) == full


def test_template_that_rerenders_earlier_turns_falls_back_to_anchored_deltas(tokenizer):
    class Rerendering:
        """Wraps the real tokenizer with a template that rewrites old assistant turns (like reasoning stripping)."""

        def __init__(self, tok):
            self.tok = tok

        def apply_chat_template(self, messages, tools=None, tokenize=False, add_generation_prompt=False):
            last = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
            shown = [
                dict(m, content="(old)") if m["role"] == "assistant" and i < last else m for i, m in enumerate(messages)
            ]
            return self.tok.apply_chat_template(shown, tokenize=False, add_generation_prompt=add_generation_prompt)

        def __call__(self, *a, **k):
            return self.tok(*a, **k)

    chat = ChatTokens(Rerendering(tokenizer))
    chat.add_messages([{"role": "system", "content": "s"}, {"role": "user", "content": "q"}])
    chat.messages.append({"role": "assistant", "content": "a"})
    ids = chat.add_messages([{"role": "user", "content": "next"}])
    assert chat.template_fallbacks == 1
    assert tokenizer.decode(ids) == "<|im_start|>user\nnext<|im_end|>\n<|im_start|>assistant\n"


async def test_group_overprovisioning_keeps_first_finishers_and_cancels_the_rest(engine_cls, tiny_model, tokenizer):
    class SlowOnSomeSeeds(envhub.AgentEnv):
        instances = []

        def __init__(self):
            self.closed = False
            self.delay = [0.0, 0.0, 5.0][len(SlowOnSomeSeeds.instances) % 3]
            SlowOnSomeSeeds.instances.append(self)

        async def areset(self, *, seed=None, options=None):
            return "go", self.base_info()

        async def astep(self, action):
            await asyncio.sleep(self.delay)
            return "done", float(len(action) % 2), True, False, {}

        async def aclose(self):
            self.closed = True

    engine = engine_cls(tiny_model, tokenizer)
    worker = RolloutWorker(engine, tokenizer, RolloutConfig(group_size=2, redundancy=1, max_new_tokens=3))
    source = LocalRollouts(worker, {"slow": SlowOnSomeSeeds})
    group = await asyncio.wait_for(source.play_group(TaskConfig(env="slow"), seed=0, group_id="g0"), 4)
    await engine.close()
    assert len(group) == 2 and worker.episodes_cancelled == 1
    assert all(env.closed for env in SlowOnSomeSeeds.instances)


async def test_watchdog_times_out_a_hung_episode_and_closes_its_env(engine_cls, tiny_model, tokenizer):
    class Hangs(envhub.AgentEnv):
        closed = False

        async def areset(self, *, seed=None, options=None):
            return "go", self.base_info()

        async def astep(self, action):
            await asyncio.Event().wait()

        async def aclose(self):
            Hangs.closed = True

    engine = engine_cls(tiny_model, tokenizer)
    worker = RolloutWorker(engine, tokenizer, RolloutConfig(max_new_tokens=3, episode_timeout_s=3.0))
    traj = await worker.run_episode(Hangs, "hang", seed=0)
    await engine.close()
    assert traj.finish_reason == "timeout" and traj.num_model_tokens > 0 and Hangs.closed


async def test_an_env_whose_construction_fails_is_an_env_error_in_the_run_metrics(engine_cls, tiny_model, tokenizer):
    from envhub.trainer.run.errors import TaskErrors, TaskFailing

    def broken_env():
        raise FileNotFoundError("no such level file: levels/7.txt")

    engine = engine_cls(tiny_model, tokenizer)
    worker = RolloutWorker(engine, tokenizer, RolloutConfig(max_new_tokens=3))
    errors = TaskErrors(max_in_a_row=2)
    worker.on_episode = errors.observe  # as every rollout source reports its episodes
    first = await worker.run_episode(broken_env, "Broken-v0", seed=0)
    assert first.finish_reason == "error" and first.env_info["error_stage"] == "build"
    errors.raise_if_failing()
    await worker.run_episode(broken_env, "Broken-v0", seed=1)
    await engine.close()
    # an env error (counted per task, not as the engine's), and repeated ones stop the run naming task and error
    assert errors.metrics() == {
        "episode_errors": {"Broken-v0": 2},
        "episode_error": {"Broken-v0": "FileNotFoundError: no such level file: levels/7.txt"},
    }
    with pytest.raises(TaskFailing, match=r"task Broken-v0: 2 episodes in a row failed \(at build\).*levels/7.txt"):
        errors.raise_if_failing()


async def test_an_swe_episode_whose_tests_never_run_is_an_env_error_not_reward_zero(
    engine_cls, tiny_model, tokenizer, docker_pool, tmp_path
):
    from envhub.envs.swe.env import SWEEnv
    from envhub.envs.swe.tasks import write_instances
    from envhub.trainer.run.errors import TaskErrors
    from tests.swe_tiny import BROKEN_SETUP, tiny_instance

    repos_dir = tmp_path / "repos"
    repos_dir.mkdir()
    write_instances([tiny_instance(repos_dir, "broken", BROKEN_SETUP)], tmp_path / "tasks.jsonl")
    engine = engine_cls(tiny_model, tokenizer)
    worker = RolloutWorker(engine, tokenizer, RolloutConfig(max_new_tokens=3))
    errors = TaskErrors(max_in_a_row=4)
    worker.on_episode = errors.observe
    # one step: whatever the model writes, the step limit grades the (empty) diff, and grading cannot run
    make_env = lambda: SWEEnv(tmp_path / "tasks.jsonl", repos_dir, pool=docker_pool, max_steps=1, test_timeout=60)
    traj = await worker.run_episode(make_env, "TinyBroken", seed=0)
    await engine.close()
    assert traj.finish_reason == "error" and traj.env_info["error_stage"] == "step"
    assert errors.metrics()["episode_errors"] == {"TinyBroken": 1}
    assert "could not be graded (no_test_run)" in errors.metrics()["episode_error"]["TinyBroken"]
    assert "exit code 4" in errors.metrics()["episode_error"]["TinyBroken"]


async def test_a_seeded_group_samples_the_same_whatever_the_engine_batches(engine_cls, tiny_model, tokenizer):
    """`rollout.seeded`: each request samples from its own generator, seeded by its episode and turn, so a group
    played one request at a time and the same group played in full batches beside another group are the same."""
    config = RolloutConfig(group_size=4, max_turns=4, max_new_tokens=3, temperature=1.0, seeded=True)
    task = TaskConfig(env="Corridor-v0", kwargs={"length": 3, "max_turns": 4})
    factories = {task.env: lambda: envhub.make("Corridor-v0", length=3, max_turns=4)}

    async def played(max_batch_size: int, beside: bool) -> list[list[int]]:
        engine = engine_cls(tiny_model, tokenizer, max_batch_size=max_batch_size)
        source = LocalRollouts(RolloutWorker(engine, tokenizer, config), factories)
        groups = [source.play_group(task, 5, "1-0")] + ([source.play_group(task, 6, "1-1")] if beside else [])
        group, *_ = await asyncio.gather(*groups)
        await engine.close()
        return sorted(t.input_ids for t in group)

    alone = await played(1, beside=False)
    assert alone == await played(8, beside=True)
    assert len({tuple(ids) for ids in alone}) > 1  # each episode of the group has its own seed
