"""Prepare a verl GRPO run on envhub envs: the dataset, the agent-loop YAML and the `main_ppo` command.

    python examples/verl_agent_loop.py FrozenLake-v0 Wordle-v0 --out data/verl --model Qwen/Qwen3-0.6B
    python examples/verl_agent_loop.py MyEnv-v0 --import my_envs.py --out data/verl

Then run the printed command where verl (`pip install 'envhub[verl]'`) and its vLLM or SGLang rollout servers run
(a GPU). Each row's episode is played by `envhub.integrations.verl.EnvhubAgentLoop`; the env's return is the reward.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("envs", nargs="+", metavar="ENV_ID", help="envhub env ids (a mixture is fine)")
    p.add_argument("--out", default="data/verl", help="folder for train.parquet, val.parquet and agent_loops.yaml")
    p.add_argument("--model", default="Qwen/Qwen3-0.6B", help="the policy for verl to load")
    p.add_argument("--seeds", type=int, default=512, help="training seeds per env (validation: 32 others)")
    p.add_argument("--group", type=int, default=4, help="rollouts per seed: the GRPO group")
    p.add_argument("--max-turns", type=int, default=8, help="model turns per episode")
    p.add_argument("--kwargs", default="{}", help="env kwargs as JSON, for every env")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE_OR_FILE")
    args = p.parse_args(argv)

    from envhub.integrations.verl import main_ppo_overrides, write_agent_loop_config, write_dataset
    from envhub.user_modules import load_user_modules, resolve_target

    load_user_modules(args.imports)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    train = write_dataset(out / "train.parquet", args.envs, range(args.seeds))
    val = write_dataset(out / "val.parquet", args.envs, range(10_000_000, 10_000_032))
    loops = write_agent_loop_config(
        out / "agent_loops.yaml",
        max_turns=args.max_turns,
        env_kwargs=json.loads(args.kwargs),
        imports=[resolve_target(t) for t in args.imports],  # verl's workers import them too
    )
    overrides = main_ppo_overrides(train, loops, args.model, val_files=val, group_size=args.group)
    print(f"wrote {train}, {val} and {loops}; train with:\n")
    print(" \\\n    ".join(["python -m verl.trainer.main_ppo", *map(shlex.quote, overrides)]))
    return 0


if __name__ == "__main__":
    from envhub.errors import EnvhubError

    try:
        sys.exit(main())
    except EnvhubError as exc:  # one line naming the problem and the fix
        sys.exit(f"error: {exc}")
