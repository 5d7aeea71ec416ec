"""Shared fixtures: a tiny Llama taught to answer two prompts with a tool call, served through a real gateway."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

SYSTEM = "You add numbers with the add tool."
TASK = "What is 2 + 3?"
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
ADD = {
    "name": "add",
    "description": "Add two integers.",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
}
CHAT_TOOLS = [{"type": "function", "function": ADD}]
RESPONSE_TOOLS = [{"type": "function", **ADD}]
FIRST_MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]


def teach(model, prompts: list[list[int]], answer: list[int], margin: float = 50.0) -> None:
    """Set the random model's output rows of the answer's tokens so that greedy decoding of each prompt yields
    `answer` (a real tool call to echo). The layers stay as they are: the hidden states at the answer's positions
    (teacher-forced) are fixed, and a least-squares fit gives each position's target a logit of +margin and the
    answer's other tokens -margin, far above the random logits of the rest of the vocabulary."""
    with torch.no_grad():
        hidden = torch.cat(
            [model.model(torch.tensor([p + answer])).last_hidden_state[0, len(p) - 1 : -1] for p in prompts]
        ).double()
        targets = answer * len(prompts)
        tokens = sorted(set(targets))
        wanted = torch.full((len(targets), len(tokens)), -margin, dtype=torch.float64)
        for row, token in enumerate(targets):
            wanted[row, tokens.index(token)] = margin
        rows = torch.linalg.lstsq(hidden, wanted).solution.T  # [tokens, hidden]: hidden @ rows.T == wanted
        model.lm_head.weight[tokens] = rows.to(model.lm_head.weight.dtype)


def teach_either(model, taught: list[tuple[list[int], list[list[int]]]], margin: float = 50.0) -> None:
    """As `teach`, for (prompt, answers) pairs fitted together: where a prompt's answers agree so far, each
    position's tokens are tied at +margin, so sampling at temperature 1 picks each answer with its share of the ties'
    chances (two answers parting at one token: one half each). An env whose reward tells the answers apart then gives
    a GRPO group reward variance; a prompt with one answer is taught that answer, as `teach` does."""
    with torch.no_grad():
        hidden = torch.cat(
            [
                model.model(torch.tensor([prompt + answer])).last_hidden_state[0, len(prompt) - 1 : -1]
                for prompt, answers in taught
                for answer in answers
            ]
        ).double()
        tokens = sorted({token for _, answers in taught for answer in answers for token in answer})
        wanted = torch.full((len(hidden), len(tokens)), -margin, dtype=torch.float64)
        row = 0
        for _, answers in taught:
            for answer in answers:
                for j in range(len(answer)):
                    for other in answers:  # every answer agreeing with this one before j ties at j
                        if len(other) > j and other[:j] == answer[:j]:
                            wanted[row, tokens.index(other[j])] = margin
                    row += 1
        rows = torch.linalg.lstsq(hidden, wanted).solution.T
        model.lm_head.weight[tokens] = rows.to(model.lm_head.weight.dtype)


@pytest.fixture(scope="session")
def taught_model(tokenizer):
    """The tiny Llama, answering the chat and responses tests' first prompts with CALL."""
    from envhub.trainer.gateway.render import ChatRenderer
    from envhub.trainer.models import tiny_llama

    model = tiny_llama(tokenizer, seed=0)
    renderer = ChatRenderer(tokenizer)
    chat_prompt = renderer.prompt(FIRST_MESSAGES, CHAT_TOOLS, None).ids
    answer = renderer.encode(CALL) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    teach(model, [chat_prompt], answer)
    return model


@pytest.fixture
async def gateway(taught_model, tokenizer, request):
    """A started gateway over the embedded engine; `@pytest.mark.gateway_config(...)` sets its GatewayConfig."""
    from envhub.trainer.engines.embedded.engine import EmbeddedEngine
    from envhub.trainer.gateway import Gateway, GatewayConfig

    marker = request.node.get_closest_marker("gateway_config")
    engine = EmbeddedEngine(taught_model, tokenizer)
    gw = Gateway(engine, tokenizer, GatewayConfig(**(marker.kwargs if marker else {})))
    await gw.start()
    yield gw
    await gw.stop()
    await engine.close()


@pytest.fixture
def client_for():
    """An `openai.AsyncOpenAI` client for an episode handle (no retries: every refusal is seen as it is)."""
    openai = pytest.importorskip("openai")
    clients = []

    def make(handle):
        client = openai.AsyncOpenAI(base_url=handle.base_url, api_key=handle.api_key, max_retries=0)
        clients.append(client)
        return client

    yield make
