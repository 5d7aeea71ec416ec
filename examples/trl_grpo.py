"""Train a model on any envhub env with TRL's GRPOTrainer (`pip install 'envhub[trl]'`).

    python examples/trl_grpo.py Letters-v0 --max-steps 2                     # the tiny random model, on the CPU
    python examples/trl_grpo.py Letters-v0 --max-steps 50 --model smollm2    # SmolLM2-135M from its PyPI package
    python examples/trl_grpo.py FrozenLake-v0 --max-steps 2                  # a tool env: the plumbing only
    python examples/trl_grpo.py MyEnv-v0 --import my_envs.py --model ./hf-model-dir

Tool envs go through TRL's `environment_factory` (TRL's tool loop calls the env's tools), text envs through envhub's
`rollout_func`; each dataset row is one episode seed, played by a whole GRPO group. docs/integrations.md explains.

The default model, `tiny`, has random weights: it shows that the plumbing works, not learning. On Letters-v0 its
noise still earns part of the dense reward (measured: 0.36 and 0.37 at steps 1 and 2, 79 s on 2 CPU cores). On a
tool env such as FrozenLake-v0 it never writes a tool call: every completion runs to --max-completion-length and the
reward stays 0. A reward there needs a model that writes tool calls (not measured here with --model smollm2).
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("env", metavar="ENV_ID", help="an envhub env id, e.g. FrozenLake-v0 or Letters-v0")
    p.add_argument("--max-steps", type=int, default=2, help="optimizer steps (default 2)")
    p.add_argument("--model", default="tiny", help="tiny (random, for a smoke run), smollm2, or a HF model directory")
    p.add_argument("--seeds", type=int, default=64, help="episode seeds in the dataset (default 64)")
    p.add_argument("--group", type=int, default=4, help="rollouts per seed: the GRPO group (default 4)")
    p.add_argument("--batch", type=int, default=4, help="rollouts per device and step, a multiple of --group")
    p.add_argument("--max-turns", type=int, default=8, help="model turns per episode (default 8)")
    p.add_argument("--max-completion-length", type=int, default=512, help="tokens after the prompt, env's included")
    p.add_argument("--kwargs", default="{}", help="env kwargs as JSON, e.g. '{\"size\": 3}'")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE_OR_FILE")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--out", default="runs/trl-grpo", help="TRL's output directory")
    p.add_argument("--save", action="store_true", help="save the trained model into --out")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental in TRL 1.16
    import torch
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from envhub.integrations import trl as envhub_trl
    from envhub.trainer.models import load_tokenizer, resolve_model_path, tiny_llama
    from envhub.user_modules import load_user_modules

    if args.threads:
        torch.set_num_threads(args.threads)
    load_user_modules(args.imports)
    env_kwargs = json.loads(args.kwargs)
    _, tools = envhub_trl.describe(args.env, **env_kwargs)
    tokenizer = load_tokenizer("tiny" if args.model == "tiny" else args.model)
    if tools:  # TRL renders the tools with the chat template and parses the model's calls
        tokenizer = envhub_trl.use_tool_template(tokenizer)
        how = {"environment_factory": envhub_trl.environment_factory(args.env, **env_kwargs)}
    else:
        rollout = envhub_trl.rollout_func(args.env, max_turns=args.max_turns, **env_kwargs)
        how = {"rollout_func": rollout, "reward_funcs": envhub_trl.env_reward}
    if args.model == "tiny":
        model = tiny_llama(tokenizer)
    else:
        model = AutoModelForCausalLM.from_pretrained(resolve_model_path(args.model))
    config = GRPOConfig(
        output_dir=args.out,
        use_cpu=not torch.cuda.is_available(),  # GRPOConfig's default bf16 needs a GPU otherwise
        per_device_train_batch_size=args.batch,
        num_generations=args.group,
        max_completion_length=args.max_completion_length,
        max_tool_calling_iterations=args.max_turns,
        max_steps=args.max_steps,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
    )
    trainer = GRPOTrainer(
        model=model,
        args=config,
        train_dataset=envhub_trl.dataset(args.env, range(args.seeds), **env_kwargs),
        processing_class=tokenizer,
        **how,
    )
    trainer.train()
    for log in (h for h in trainer.state.log_history if "reward" in h):
        print(f"step {log['step']}: reward {log['reward']:.3f} ± {log['reward_std']:.3f}", file=sys.stderr)
    if args.save:
        trainer.save_model(args.out)
    return 0


if __name__ == "__main__":
    from envhub.errors import EnvhubError

    try:
        sys.exit(main())
    except EnvhubError as exc:  # one line naming the problem and the fix
        sys.exit(f"error: {exc}")
