"""Bundled environments (installed as `envhub.envs` from the top-level `envs/` folder); `register_builtin_envs()` adds
them to the registry (classes load lazily)."""

from __future__ import annotations

from envhub.registry import register


def register_builtin_envs() -> None:
    """Register every bundled env under its id; entry points are strings, so nothing heavy is imported."""
    register(
        "ShellQuiz-v0",
        "envhub.envs.shell_quiz:ShellQuizEnv",
        max_episode_steps=8,
        tags=("sandbox", "tool", "single-agent"),
        description="Answer a question about a generated file with bash in a pooled sandbox, then submit the number.",
        source="envhub",
    )
    register(
        "Sokoban-v0",
        "envhub.envs.sokoban:SokobanEnv",
        max_episode_steps=120,
        tags=("game", "puzzle", "single-agent"),
        description="Push every box onto a target; levels generated from the seed and proven solvable.",
        source="envhub",
    )
    register(
        "FrozenLake-v0",
        "envhub.envs.frozen_lake:FrozenLakeEnv",
        max_episode_steps=100,
        tags=("game", "single-agent"),
        description="Walk across a frozen lake to the goal without falling into a hole; optional slippery ice.",
        source="envhub",
    )
    register(
        "Wordle-v0",
        "envhub.envs.wordle:WordleEnv",
        max_episode_steps=20,
        tags=("game", "word", "single-agent"),
        description="Guess the hidden five-letter word in six tries from colour feedback.",
        source="envhub",
    )
    register(
        "Math-v0",
        "envhub.envs.math.env:MathEnv",
        max_episode_steps=4,
        tags=("math", "rlvr", "single-agent"),
        description="Arithmetic and algebra word problems generated from the seed, graded by exact answer checking.",
        source="envhub",
    )
    register(
        "Letters-v0",
        "envhub.envs.letters:LettersEnv",
        max_episode_steps=8,
        tags=("toy", "single-agent"),
        description="Reply using only the given letters; dense reward. A warm-up task for trainer tests and CI.",
        source="envhub",
    )
    register(
        "Corridor-v0",
        "envhub.envs.corridor:CorridorEnv",
        max_episode_steps=64,
        tags=("toy", "credit", "single-agent"),
        description="Walk down a corridor; only arrival is rewarded. The positive control of step-level credit.",
        source="envhub",
    )
    register(
        "WebShop-v0",
        "envhub.envs.web.env:WebShopEnv",
        max_episode_steps=20,
        tags=("web", "single-agent"),
        description="Find and buy the product an instruction describes in a local web shop (search, click, options).",
        source="envhub",
    )
    register(
        "RockPaperScissors-v0",
        "envhub.envs.games.rock_paper_scissors:RockPaperScissorsEnv",
        multiagent=True,
        tags=("game", "parallel"),
        description="Rock-paper-scissors over several rounds, both players moving at once (PettingZoo ParallelEnv).",
        source="envhub",
    )
    for game, module, about in (
        ("TicTacToe", "tictactoe:TicTacToeEnv", "Three in a row on a 3x3 board, with a perfect minimax player."),
        ("ConnectFour", "connect_four:ConnectFourEnv", "Four in a row on a 6x7 grid, with an alpha-beta player."),
        (
            "KuhnPoker",
            "kuhn_poker:KuhnPokerEnv",
            "One hand of three-card poker (hidden information), with a Nash player.",
        ),
    ):
        register(
            f"{game}-v0",
            f"envhub.envs.games.{module}",
            multiagent=True,
            tags=("game",),
            description=about,
            source="envhub",
        )
        register(
            f"{game}-SelfPlay-v0",
            "envhub.selfplay:SelfPlay",
            kwargs={"game": f"{game}-v0", "opponent": "random"},
            max_episode_steps=100,
            tags=("game", "single-agent", "self-play"),
            description=f"{game} for one seat against an opponent (random by default).",
            source="envhub",
        )
    register(
        "SWE-v0",
        "envhub.envs.swe:SWEEnv",
        tags=("swe", "sandbox", "single-agent"),
        description="Fix a real bug in a Python repository (SWE-bench format); graded by hidden tests in a fresh "
        "sandbox.",
        source="envhub",
    )
