"""The gateway treats its clients as hostile: per-episode keys, body limits, bad JSON, unknown models, token limits
per request and per episode, request rates; every refusal in OpenAI's error shape, so clients raise their usual
exceptions."""

from __future__ import annotations

import aiohttp
import pytest

from envhub.server.guard import ServerLimits
from tests.trainer.gateway.conftest import FIRST_MESSAGES

openai = pytest.importorskip("openai")


async def test_models_and_per_episode_keys(gateway, client_for):
    handle = gateway.open_episode()
    assert handle.env() == {
        "OPENAI_BASE_URL": gateway.url,
        "OPENAI_API_KEY": handle.api_key,
        "OPENAI_MODEL": "policy",
    }
    assert [m.id for m in (await client_for(handle).models.list()).data] == ["policy"]
    other = gateway.open_episode()
    await client_for(other).completions.create(model="policy", prompt="Hello", max_tokens=2)
    assert gateway.close_episode(handle) == []  # the other episode's call is not this one's
    [call] = gateway.close_episode(other)
    assert call.route == "completions" and len(call.output_ids) <= 2
    for key in (handle.api_key, "envhub-ep-guessed", ""):  # closed, unknown, missing
        stranger = openai.AsyncOpenAI(base_url=gateway.url, api_key=key or "x", max_retries=0)
        headers = {"Authorization": ""} if not key else {}
        with pytest.raises(openai.AuthenticationError) as caught:
            await stranger.models.list(extra_headers=headers)
        assert caught.value.body["code"] == "invalid_api_key"
        await stranger.close()


async def test_request_refusals_name_the_limit(gateway, client_for):
    handle = gateway.open_episode()
    client = client_for(handle)
    with pytest.raises(openai.NotFoundError, match="this gateway serves 'policy'"):
        await client.chat.completions.create(model="gpt-4o", messages=FIRST_MESSAGES, max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="per-request limit of 1024"):
        await client.chat.completions.create(model="policy", messages=FIRST_MESSAGES, max_tokens=5000)
    with pytest.raises(openai.BadRequestError, match="n must be 1"):
        await client.chat.completions.create(model="policy", messages=FIRST_MESSAGES, max_tokens=2, n=2)
    with pytest.raises(openai.BadRequestError, match="maximum context length is 4096") as caught:
        await client.completions.create(model="policy", prompt=[7] * 4000, max_tokens=200)
    assert caught.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError, match="messages must be a non-empty list"):
        await client.chat.completions.create(model="policy", messages=[], max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="5000 messages is over this gateway's limit of 4096"):
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}] * 5000)
    with pytest.raises(openai.BadRequestError, match="only text content parts"):
        image = [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": image}])
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {handle.api_key}"}) as http:
        async with http.post(gateway.url + "/chat/completions", data=b'{"model": "policy", "messages": [') as reply:
            body = await reply.json()
            assert reply.status == 400 and "not valid JSON" in body["error"]["message"]
        deep = b'{"model": "policy", "messages": ' + b"[" * 40 + b"]" * 40 + b"}"
        async with http.post(gateway.url + "/chat/completions", data=deep) as reply:
            assert reply.status == 400 and "nests deeper" in (await reply.json())["error"]["message"]
    assert gateway.close_episode(handle) == []  # refused requests leave no record


@pytest.mark.gateway_config(max_tokens_per_request=8, episode_token_budget=10)
async def test_episode_token_budget(gateway, client_for):
    handle = gateway.open_episode()
    client = client_for(handle)
    extra = {"ignore_eos": True}
    first = await client.completions.create(model="policy", prompt="Hi", max_tokens=8, extra_body=extra)
    second = await client.completions.create(model="policy", prompt="Hi", max_tokens=8, extra_body=extra)
    assert (first.usage.completion_tokens, second.usage.completion_tokens) == (8, 2)  # the rest of the budget
    with pytest.raises(openai.BadRequestError, match="spent its token budget of 10") as caught:
        await client.completions.create(model="policy", prompt="Hi", max_tokens=1)
    assert caught.value.code == "token_budget_exhausted"
    assert len(gateway.close_episode(handle)) == 2


@pytest.mark.gateway_config(limits=ServerLimits(max_body=2048))
async def test_oversized_body_is_refused(gateway, client_for):
    client = client_for(gateway.open_episode())
    with pytest.raises(openai.APIStatusError, match="over this server's limit of 2048 bytes") as caught:
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x" * 4096}])
    assert caught.value.status_code == 413


@pytest.mark.gateway_config(limits=ServerLimits(rate_limit=1.0))
async def test_request_rate_is_limited_per_episode(gateway, client_for):
    busy, calm = client_for(gateway.open_episode()), client_for(gateway.open_episode())
    await busy.models.list()
    await busy.models.list()  # a burst of two
    with pytest.raises(openai.RateLimitError) as caught:
        await busy.models.list()
    assert int(caught.value.response.headers["Retry-After"]) >= 1
    await calm.models.list()  # another episode has its own bucket


@pytest.mark.parametrize("forced", [None, 0.0])
async def test_configured_temperature_overrides_the_clients(tiny_model, tokenizer, client_for, forced):
    from envhub.trainer.engines.embedded.engine import EmbeddedEngine
    from envhub.trainer.gateway import Gateway, GatewayConfig

    engine = EmbeddedEngine(tiny_model, tokenizer)  # the untaught model: its samples spread
    gateway = Gateway(engine, tokenizer, GatewayConfig(temperature=forced))
    await gateway.start()
    handle = gateway.open_episode()
    client = client_for(handle)
    hot = {"model": "policy", "prompt": "Once upon a time", "max_tokens": 16, "temperature": 1.5}
    hot["extra_body"] = {"ignore_eos": True}
    first = await client.completions.create(**hot)
    second = await client.completions.create(**hot, stream=True)  # the streamed form of the same call
    same = [chunk async for chunk in second][-1].choices[0].text == first.choices[0].text
    calls = gateway.close_episode(handle)
    await gateway.stop()
    await engine.close()
    assert same == (calls[0].output_ids == calls[1].output_ids) == (forced == 0.0)
