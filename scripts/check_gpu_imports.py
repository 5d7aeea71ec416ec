"""Import modules in this Python and name each one that fails: by default every module of envhub's trainer and the
CLI commands that start it, else the modules named on the command line (an engine's, in its own virtualenv).

`make install-gpu` runs it in each new virtualenv with `--cuda-build` (torch there must be a CUDA build; importing
needs no GPU); `make check-install-gpu` runs it in the CPU virtualenv with CUDA hidden, where the GPU code paths must
import too and refuse only when a run asks for CUDA.

usage: python scripts/check_gpu_imports.py [--cuda-build] [MODULE...]
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import traceback

# the harness programs run inside sandboxes on the harness overlay's packages, never in the trainer's process
SANDBOX_ONLY = "envhub.trainer.harness.programs"
COMMANDS = ("envhub.cli.main", "envhub.cli.serve_engine")


def trainer_modules() -> list[str]:
    """envhub.trainer's modules (the GPU paths among them: engines, learner, placement) and the CLI's entry points."""
    import envhub.trainer

    found = pkgutil.walk_packages(envhub.trainer.__path__, "envhub.trainer.")
    return [m.name for m in found if not m.name.startswith(SANDBOX_ONLY)] + list(COMMANDS)


def check_cuda_build() -> str:
    """torch's version and CUDA version; exits naming the likely cause when torch is a CPU build."""
    import torch

    if torch.version.cuda is None:
        sys.exit(
            f"torch {torch.__version__} in {sys.prefix} is a CPU build: pip's settings (`pip config list`) probably "
            "name a CPU-only index; on Linux x86_64 PyPI's own torch wheel is the CUDA build"
        )
    return f"torch {torch.__version__} (CUDA {torch.version.cuda}, GPU visible: {torch.cuda.is_available()})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuda-build", action="store_true", help="fail unless torch is a CUDA build")
    parser.add_argument("modules", nargs="*", help="modules to import (default: envhub's trainer and CLI)")
    args = parser.parse_args()
    if args.cuda_build:
        print(check_cuda_build())
    modules = args.modules or trainer_modules()
    failed = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:
            failed.append(name)
            print(f"{name}: import failed\n{traceback.format_exc(limit=-3)}", file=sys.stderr)
    if failed:
        sys.exit(f"{len(failed)} of {len(modules)} modules failed to import in {sys.prefix}: {', '.join(failed)}")
    print(f"{len(modules)} modules import in {sys.prefix}")


if __name__ == "__main__":
    main()
