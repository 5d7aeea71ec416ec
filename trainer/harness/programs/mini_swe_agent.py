"""The `mini-swe-agent` built-in harness: mini-swe-agent's own agent, model class and default config, unmodified.

Its model is its LiteLLM model pointed at OPENAI_BASE_URL (`openai/<OPENAI_MODEL>`, its bash tool called as a tool
call); its task is ENVHUB_TASK. Where its commands run is mini-swe-agent's documented extension point, the
environment class: with ENVHUB_MCP_URL (an env with tools, such as SWE-v0) each command is the env's `bash` tool,
called over MCP, so it runs in the episode's own sandbox; otherwise mini-swe-agent's LocalEnvironment runs it here,
in the harness's sandbox, and the submission (else its last reply with text) is printed last as the env's action.

Nothing is fetched: LiteLLM reads its bundled cost map (LITELLM_LOCAL_MODEL_COST_MAP) and cost tracking ignores the
unknown model.
"""

import asyncio
import concurrent.futures
import contextlib
import os
import re
import sys
import threading

import yaml
from minisweagent.agents.default import DefaultAgent
from minisweagent.config import builtin_config_dir
from minisweagent.environments.local import LocalEnvironment
from minisweagent.models.litellm_model import LitellmModel

EXIT_CODE = re.compile(r"\n?\[exit code (-?\d+)\]\s*$")


class McpBashEnvironment(LocalEnvironment):
    """Runs each command through the env's `bash` tool at ENVHUB_MCP_URL (one MCP session for the episode, on its own
    event loop thread); output and return code as LocalEnvironment gives them, so its submit check is unchanged."""

    def __init__(self, url: str, token: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, daemon=True).start()
        ready = concurrent.futures.Future()
        self._held = asyncio.run_coroutine_threadsafe(self._hold(url, token, ready), self._loop)
        ready.result()  # raises what opening the session raised

    def _wait(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    async def _hold(self, url: str, token: str, ready: concurrent.futures.Future) -> None:
        """Open the session and keep it open in this one task (the MCP client's cancel scopes must be left in the
        task that entered them) until `close`."""
        from mcp import ClientSession
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        try:
            self._closing = asyncio.Event()
            async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as client:
                async with streamable_http_client(url, http_client=client) as (read, write):
                    async with ClientSession(read, write) as session:
                        await session.initialize()
                        self._session = session
                        ready.set_result(None)
                        await self._closing.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict:
        result = self._wait(self._session.call_tool("bash", {"command": action.get("command", "")}))
        text = "".join(getattr(part, "text", "") for part in result.content)
        match = EXIT_CODE.search(text)
        code = int(match.group(1)) if match else (1 if result.isError else 0)
        output = {"output": text[: match.start()] + "\n" if match else text, "returncode": code, "exception_info": ""}
        self._check_finished(output)
        return output

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._closing.set)
        self._held.result()
        self._loop.call_soon_threadsafe(self._loop.stop)


def main() -> None:
    config = yaml.safe_load((builtin_config_dir / "mini.yaml").read_text())  # its tool-calling default
    model_config = dict(config.get("model", {}))
    model_kwargs = {
        **model_config.pop("model_kwargs", {}),
        "api_base": os.environ["OPENAI_BASE_URL"],
        "api_key": os.environ["OPENAI_API_KEY"],
    }
    if "ENVHUB_MAX_TOKENS" in os.environ:
        model_kwargs["max_tokens"] = int(os.environ["ENVHUB_MAX_TOKENS"])
    model = LitellmModel(
        model_name=f"openai/{os.environ['OPENAI_MODEL']}",
        model_kwargs=model_kwargs,
        cost_tracking="ignore_errors",
        **model_config,
    )
    url = os.environ.get("ENVHUB_MCP_URL")
    local = {"env": config.get("environment", {}).get("env", {}), "timeout": 60}
    env = McpBashEnvironment(url, os.environ["OPENAI_API_KEY"]) if url else LocalEnvironment(**local)
    agent_config = {**config.get("agent", {}), "step_limit": int(os.environ.get("ENVHUB_MAX_TURNS", "8"))}
    agent = DefaultAgent(model, env, **agent_config)
    try:  # stdout carries the action alone: what LiteLLM or the agent print goes to stderr
        with contextlib.redirect_stdout(sys.stderr):
            result = agent.run(os.environ["ENVHUB_TASK"])
    finally:
        if url:
            env.close()
    print(f"mini-swe-agent: {result.get('exit_status')} after {agent.n_calls} model calls", file=sys.stderr)
    replies = [m for m in agent.messages if m.get("role") == "assistant" and (m.get("content") or "").strip()]
    answer = (result.get("submission") or "").strip() or (replies[-1]["content"].strip() if replies else "")
    if answer:  # the action of an env without tools; with none, the episode is an error ("printed nothing")
        print(answer)


if __name__ == "__main__":
    main()
