"""Train on envhub envs with SkyRL: write the dataset, and with --train run SkyRL's trainer with the envs registered.

    python examples/skyrl_gym.py FrozenLake-v0 Letters-v0 --out data/skyrl       # the dataset + the command to run
    python examples/skyrl_gym.py FrozenLake-v0 --out data/skyrl --train trainer.epochs=1 ...

`--train` needs SkyRL's trainer (`pip install 'skyrl[skyrl-train]'`: vLLM, flash-attn, a GPU; Python 3.12). Custom
envs are registered inside SkyRL's entrypoint Ray task, as SkyRL's own examples do; that is what this script does.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("envs", nargs="+", metavar="ENV_ID", help="envhub env ids")
    p.add_argument("--out", default="data/skyrl", help="folder for train.parquet and val.parquet")
    p.add_argument("--model", default="Qwen/Qwen3-0.6B", help="the policy for SkyRL to load")
    p.add_argument("--seeds", type=int, default=512, help="training seeds per env (validation: 32 others)")
    p.add_argument("--group", type=int, default=4, help="samples per prompt: the GRPO group")
    p.add_argument("--max-turns", type=int, default=8, help="model turns per episode")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE_OR_FILE")
    p.add_argument("--train", nargs=argparse.REMAINDER, help="run SkyRL's trainer; more key=value overrides may follow")
    args = p.parse_args(argv)

    from envhub.integrations.skyrl import train_overrides, write_dataset
    from envhub.user_modules import load_user_modules, resolve_target

    load_user_modules(args.imports)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    train = write_dataset(out / "train.parquet", args.envs, range(args.seeds))
    val = write_dataset(out / "val.parquet", args.envs, range(10_000_000, 10_000_032))
    overrides = train_overrides(train, args.model, val_data=val, group_size=args.group, max_turns=args.max_turns)
    if args.train is None:
        command = ["python", "examples/skyrl_gym.py", *args.envs, "--out", str(out), "--train"]
        print(f"wrote {train} and {val}; with SkyRL's trainer installed, train with:\n\n    {shlex.join(command)}")
        return 0
    return train_with_skyrl(overrides + args.train, args.envs, [resolve_target(t) for t in args.imports])


def train_with_skyrl(overrides: list[str], env_ids: list[str], imports: list[str]) -> int:
    """SkyRL's own entrypoint (skyrl/train/entrypoints/main_base.py), with envhub's envs registered in its task."""
    import ray
    from skyrl.train.config import SkyRLTrainConfig
    from skyrl.train.entrypoints.main_base import BasePPOExp
    from skyrl.train.utils.utils import initialize_ray, validate_cfg

    @ray.remote(num_cpus=1)
    def entrypoint(cfg: SkyRLTrainConfig) -> None:
        from envhub.integrations.skyrl import register

        register(env_ids, imports=imports)
        BasePPOExp(cfg).run()

    cfg = SkyRLTrainConfig.from_cli_overrides(overrides)
    validate_cfg(cfg)
    initialize_ray(cfg)
    ray.get(entrypoint.remote(cfg))
    return 0


if __name__ == "__main__":
    from envhub.errors import EnvhubError

    try:
        sys.exit(main())
    except EnvhubError as exc:  # one line naming the problem and the fix
        sys.exit(f"error: {exc}")
