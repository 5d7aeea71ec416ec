"""The `openai-agents` built-in harness: the OpenAI Agents SDK, unmodified, with its defaults (the Responses API,
the client from OPENAI_BASE_URL and OPENAI_API_KEY); it answers ENVHUB_TASK and prints its final output last."""

import os

from agents import Agent, ModelSettings, Runner

agent = Agent(
    name="envhub",
    instructions=os.environ["ENVHUB_INSTRUCTIONS"],
    model=os.environ["OPENAI_MODEL"],
    # the gateway's own per-request limit applies unless ENVHUB_MAX_TOKENS asks for fewer
    model_settings=ModelSettings(
        max_tokens=int(os.environ["ENVHUB_MAX_TOKENS"]) if "ENVHUB_MAX_TOKENS" in os.environ else None
    ),
)
result = Runner.run_sync(agent, os.environ["ENVHUB_TASK"], max_turns=int(os.environ.get("ENVHUB_MAX_TURNS", "4")))
print(result.final_output)
