"""Async vs sync GRPO training throughput (same model, envs, budget, seeds); see envhub.trainer.bench."""

import argparse
import sys

from envhub.trainer.bench import main

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="async_vs_sync.json")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    sys.exit(main(out=args.out, steps=args.steps))
