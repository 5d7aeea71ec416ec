"""Small harness programs for the contract tests, standard library only (they run on the sandbox's own python3)."""

from __future__ import annotations

import shlex

_CALL = """
import json, os, sys, urllib.request
def ask(text):
    body = {"model": os.environ["OPENAI_MODEL"], "max_tokens": 4,
            "messages": [{"role": "user", "content": text}]}
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions", data=json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(request, timeout=30))["choices"][0]["message"]["content"]
"""

#: asks the model once about ENVHUB_TASK, then prints the right sum of the task's two numbers as its action
SOLVER = (
    _CALL
    + """
import re
ask(os.environ["ENVHUB_TASK"])
a, b = map(int, re.findall(r"(\\d+) \\+ (\\d+)", os.environ["ENVHUB_TASK"])[0])
print("the model was asked")
print(a + b)
"""
)

#: calls the model, then probes the host's ports given as arguments (they must be unreachable) and prints the results
PROBE = (
    _CALL
    + """
import socket
ask("hello")
reached = {}
for port in map(int, sys.argv[1:]):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        reached[port] = True
    except OSError:
        reached[port] = False
print(json.dumps({"reached": reached}))
"""
)

#: asks the model once, then answers through the env's `answer` tool over MCP (raw JSON-RPC at ENVHUB_MCP_URL),
#: twice: the second call comes after the env ended and is refused (its isError printed last)
TOOL_SOLVER = (
    _CALL
    + """
import re
def rpc(method, params):
    message = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    request = urllib.request.Request(
        os.environ["ENVHUB_MCP_URL"], data=json.dumps(message).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json",
                 "Accept": "application/json, text/event-stream"})
    return json.load(urllib.request.urlopen(request, timeout=30))["result"]
ask(os.environ["ENVHUB_TASK"])
rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}})
assert [tool["name"] for tool in rpc("tools/list", {})["tools"]] == ["answer"]
a, b = map(int, re.findall(r"(\\d+) \\+ (\\d+)", os.environ["ENVHUB_TASK"])[0])
print(rpc("tools/call", {"name": "answer", "arguments": {"value": a + b}})["content"][0]["text"])
print(rpc("tools/call", {"name": "answer", "arguments": {"value": a + b}})["isError"])
"""
)

CRASH = (
    _CALL
    + """
ask("hello")
sys.stderr.write("Traceback: something broke in the harness\\n")
sys.exit(3)
"""
)

HANG = (
    _CALL
    + """
import time
ask("hello")
sys.stderr.write("waiting forever\\n"); sys.stderr.flush()
time.sleep(600)
"""
)

NO_CALL = """
import sys
sys.stderr.write("I forgot the model\\n")
print("42")
"""


def command(source: str, *args: object) -> str:
    """A shell line running `source` with the sandbox's python3."""
    return " ".join(["python3", "-c", shlex.quote(source), *map(str, args)])


#: a harness written with the real `openai` client (from the built-ins' packages): two chat calls on ENVHUB_TASK.
#: With HISTORY=keep the second call echoes the first answer (the calls merge); with HISTORY=rewrite it replaces
#: the history by a summary, as a summarising harness does (the calls split). It prints the second answer's last line.
OPENAI_CLIENT = """
import os
from openai import OpenAI
client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
model, task = os.environ["OPENAI_MODEL"], os.environ["ENVHUB_TASK"]
messages = [{"role": "user", "content": task}]
draft = client.chat.completions.create(model=model, messages=messages).choices[0].message.content or ""
if os.environ["HISTORY"] == "keep":
    messages += [{"role": "assistant", "content": draft}, {"role": "user", "content": "Again, shorter."}]
else:
    messages = [{"role": "user", "content": task + "\\nA draft: " + draft[:40]}]
reply = client.chat.completions.create(model=model, messages=messages).choices[0].message.content or ""
lines = [line.strip() for line in reply.splitlines() if line.strip()]
print(lines[-1] if lines else "-")
"""
