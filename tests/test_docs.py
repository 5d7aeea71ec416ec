"""Every code block of docs/authoring.md (and the Python of README.md and docs/integrations.md) runs, top to bottom,
as a reader would run it.

Blocks run in a scratch directory, in order, sharing one namespace (like a notebook):
- a block whose first line is `# file: NAME` is written to NAME instead of run;
- ```python blocks are executed (top-level `await` allowed, except in README.md, whose snippets a reader pastes
  into a plain script: there it is a SyntaxError, as it would be for them);
- ```bash blocks run line by line: `pip install -e .` installs the scratch package into a private
  target directory (never into the test venv), `envhub serve ...` starts in the background until the
  file is done, any other `envhub ...` must exit 0.
A command this checkout does not have yet (`envhub serve --import`, `envhub eval`, written on other
branches) skips the rest of its section, and the test reports the skip with the reason at the end.
"""

from __future__ import annotations

import ast
import asyncio
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
_HEADING = re.compile(r"^#{1,3} ", re.MULTILINE)


@dataclass
class Block:
    language: str
    code: str
    section: int  # index of the heading the block sits under
    line: int


def code_blocks(markdown: str) -> list[Block]:
    """The fenced code blocks of a markdown text, with the section each belongs to."""
    blocks = []
    for match in _FENCE.finditer(markdown):
        before = markdown[: match.start()]
        blocks.append(Block(match.group(1), match.group(2), len(_HEADING.findall(before)), before.count("\n") + 1))
    return blocks


def envhub_has(*argv: str, needle: str) -> bool:
    """Whether `envhub ARGV --help` mentions `needle` (a command or flag of this checkout)."""
    done = subprocess.run(
        [sys.executable, "-m", "envhub.cli.main", *argv, "--help"], capture_output=True, text=True, timeout=120
    )
    return needle in done.stdout


class Runner:
    """Runs one markdown file's blocks in a scratch directory."""

    def __init__(self, workdir: Path, top_level_await: bool = True) -> None:
        self.workdir = workdir
        self.flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT if top_level_await else 0
        self.site = workdir / ".site"  # where `pip install` puts the scratch package
        self.namespace: dict[str, object] = {"__name__": "__doc__"}
        self.servers: list[subprocess.Popen] = []
        self.skipped: list[str] = []
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(self.site), str(workdir), os.environ.get("PYTHONPATH", "")]),
        }

    def run(self, blocks: list[Block], languages: tuple[str, ...]) -> None:
        skip_section = None
        for block in blocks:
            if block.section == skip_section:
                continue
            first = block.code.splitlines()[0] if block.code.strip() else ""
            if first.startswith("# file: "):
                (self.workdir / first[len("# file: ") :].strip()).write_text(block.code.split("\n", 1)[1])
            elif block.language not in languages:
                continue
            elif block.language == "python":
                self.python(block)
            elif block.language == "bash":
                reason = self.bash(block)
                if reason:
                    self.skipped.append(f"line {block.line}: {reason}")
                    skip_section = block.section

    def python(self, block: Block) -> None:
        code = compile(block.code, f"<doc block at line {block.line}>", "exec", flags=self.flags)
        result = eval(code, self.namespace)
        if asyncio.iscoroutine(result):
            asyncio.run(result)

    def bash(self, block: Block) -> str:
        """Run a bash block; returns why it was skipped, or ""."""
        for line in block.code.splitlines():
            line = line.split("  #")[0].strip()
            if not line or line.startswith("#"):
                continue
            argv = shlex.split(line)
            if argv[:2] == ["pip", "install"]:
                target = [a for a in argv[2:] if a != "-e"]
                self.call(
                    [
                        sys.executable,
                        "-m",
                        "pip",
                        "install",
                        "-q",
                        "--no-deps",
                        "--no-build-isolation",
                        "--target",
                        str(self.site),
                        *target,
                    ]
                )
            elif argv[:2] == ["envhub", "serve"]:
                if "--import" in argv and not envhub_has("serve", needle="--import"):
                    return (
                        "`envhub serve --import` is not in this checkout (it lands with the env-server security branch)"
                    )
                self.serve(argv)
            elif argv[:2] == ["envhub", "eval"]:
                if not envhub_has(needle="eval"):
                    return "`envhub eval` is not in this checkout (it lands with the evaluation branch)"
                self.call([sys.executable, "-m", "envhub.cli.main", *argv[1:]])
            elif argv[0] == "envhub":
                self.call([sys.executable, "-m", "envhub.cli.main", *argv[1:]])
            else:
                pytest.fail(f"the docs test does not know how to run {line!r} (line {block.line})")
        return ""

    def call(self, argv: list[str]) -> None:
        done = subprocess.run(argv, cwd=self.workdir, env=self.env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, (
            f"{shlex.join(argv)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )

    def serve(self, argv: list[str]) -> None:
        port = argv[argv.index("--port") + 1] if "--port" in argv else "8765"
        server = subprocess.Popen(
            [sys.executable, "-m", "envhub.cli.main", *argv[1:]],
            cwd=self.workdir,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.servers.append(server)
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, f"envhub serve exited: {server.stderr.read()}"
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
                return
            except OSError:
                assert time.monotonic() < deadline, "envhub serve did not answer /health within 120 s"
                time.sleep(0.2)

    def close(self) -> None:
        for server in self.servers:
            server.terminate()
            server.wait(timeout=30)


@pytest.mark.slow
def test_authoring_tutorial_runs_top_to_bottom(tmp_path, monkeypatch, base_rootfs):
    blocks = code_blocks((REPO / "docs" / "authoring.md").read_text())
    assert sum(b.language == "python" for b in blocks) >= 5 and any("envhub train" in b.code for b in blocks)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    runner = Runner(tmp_path)
    try:
        runner.run(blocks, ("python", "bash"))
    finally:
        runner.close()
    assert (
        len((tmp_path / "runs" / "findsecret" / "metrics.jsonl").read_text().splitlines()) == 2
    )  # `envhub train` ran its 2 steps
    # the plugin's module imported by hand (it imports envhub, which loads the plugin) registers without a warning
    script = "import findsecret, envhub; print(envhub.spec('FindSecret-v0').source)"
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", script],
        cwd=tmp_path,
        env=runner.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip() == "findsecret-env", done.stderr
    if runner.skipped:
        pytest.skip("every other block ran; skipped: " + "; ".join(runner.skipped))


@pytest.mark.slow
def test_integrations_guide_runs_top_to_bottom(tmp_path, monkeypatch):
    pytest.importorskip("trl")
    pytest.importorskip("skyrl_gym")
    blocks = code_blocks((REPO / "docs" / "integrations.md").read_text())
    python = "\n".join(b.code for b in blocks if b.language == "python")
    for call in ("environment_factory(", "rollout_func(", "write_agent_loop_config(", "skyrl_gym.make("):
        assert call in python, call  # a snippet per trainer
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    runner = Runner(tmp_path)
    runner.run(blocks, ("python",))
    assert "rewards/env_reward/mean" in runner.namespace["trainer"].state.log_history[0]  # the rollout_func run
    assert (tmp_path / "data" / "verl" / "agent_loops.yaml").exists()
    assert (tmp_path / "data" / "skyrl-train.parquet").exists()


def test_readme_python_examples_run(tmp_path, monkeypatch):
    blocks = code_blocks((REPO / "README.md").read_text())
    assert any("class Guess(envhub.AgentEnv)" in b.code for b in blocks)
    monkeypatch.chdir(tmp_path)
    # each snippet runs as written in a script of its own: a fresh namespace per block, so one that leans on an
    # import of an earlier block (`gym` in "Register your own environment") fails here as it does for a reader
    namespaces = {}
    for block in blocks:
        runner = Runner(tmp_path, top_level_await=False)
        runner.run([block], ("python",))
        namespaces[block.line] = runner.namespace
    guess = next(b for b in blocks if "class Guess(envhub.AgentEnv)" in b.code)
    # the README's own example env passes gymnasium's checker (render_mode included)
    from gymnasium.utils.env_checker import check_env

    check_env(namespaces[guess.line]["env"].unwrapped, skip_render_check=False)


def test_code_blocks_are_found_with_their_sections():
    text = "# A\n```python\nx = 1\n```\n## B\n```bash\nenvhub list\n```\n```toml\n# file: p.toml\n[a]\n```\n"
    blocks = code_blocks(text)
    assert [(b.language, b.section, b.code) for b in blocks] == [
        ("python", 1, "x = 1\n"),
        ("bash", 2, "envhub list\n"),
        ("toml", 2, "# file: p.toml\n[a]\n"),
    ]


def test_every_test_that_reliability_md_names_exists():
    """docs/reliability.md says which test holds each promise: each named test is there (renames update the page)."""
    text = (REPO / "docs" / "reliability.md").read_text()
    named = set(re.findall(r"`([\w/]+\.py)::(test_\w+)`", text))
    assert len(named) >= 15
    missing = []
    for path, test in sorted(named):
        source = REPO / "tests" / path
        if not source.exists() or not re.search(rf"^(async )?def {test}\(", source.read_text(), re.MULTILINE):
            missing.append(f"tests/{path}::{test}")
    assert not missing, missing
