"""The layout's promises, read from the code's own imports: no import cycle among envhub's modules, and
dependencies that point one way (core <- envs <- agents/eval <- servers <- integrations <- trainer <- CLI)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {
    "envhub": ROOT / "envhub",
    "envhub.envs": ROOT / "envs",
    "envhub.sandboxes": ROOT / "sandboxes",
    "envhub.trainer": ROOT / "trainer",
}
# Lower layers never import higher ones; a module sits in the first layer whose prefix it matches.
LAYERS = [
    ("cli", ("envhub.cli",)),
    ("trainer", ("envhub.trainer",)),
    ("integrations", ("envhub.integrations",)),  # envhub envs in TRL, verl and SkyRL: above every env, below the CLI
    ("server", ("envhub.server",)),
    ("agents/eval", ("envhub.agents", "envhub.eval")),
    ("envs", ("envhub.envs",)),
    ("core", ("envhub",)),  # the core API, sandboxes included (envs run in them)
]
# Functions may not pass this many lines; literal data tables are the exception (named here, with the reason).
MAX_FUNCTION_LINES = 80
DATA_TABLES = {"envhub.envs.register_builtin_envs"}  # one register() call per bundled env
# Modules every env may build on; otherwise an env imports only its own package.
SHARED_ENV_MODULES = ("envhub.envs.directions", "envhub.envs.games.base", "envhub.envs.adapters.family")


def modules() -> dict[str, Path]:
    """Every module of the project, by import name."""
    found = {}
    for prefix, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            if "data" in path.relative_to(folder).parts:  # envs/swe/data: source trees of bundled SWE tasks
                continue
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([prefix, *parts])] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Project modules that `name` imports anywhere in its file (function-level imports included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):  # a package's own face is no edge
                found.add(target)
    return found


def layer(name: str) -> int:
    return next(
        i for i, (_, prefixes) in enumerate(LAYERS) if any(name == p or name.startswith(p + ".") for p in prefixes)
    )


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_no_import_cycle(graph):
    index, low, stack, on_stack, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_dependencies_point_one_way(graph):
    wrong = [
        f"{a} ({LAYERS[layer(a)][0]}) imports {b} ({LAYERS[layer(b)][0]})"
        for a, targets in graph.items()
        if a != "envhub"
        for b in targets
        if layer(b) < layer(a)
    ]
    assert not wrong, "imports against the layering:\n" + "\n".join(sorted(wrong))


def test_envs_do_not_reach_into_each_other(graph):
    def package(name: str) -> str:
        return ".".join(name.split(".")[:3])  # envhub.envs.<env module or package>

    wrong = [
        f"{a} imports {b}"
        for a, targets in graph.items()
        if a.startswith("envhub.envs.")
        for b in targets
        if b.startswith("envhub.envs.") and package(a) != package(b) and b not in SHARED_ENV_MODULES
    ]
    assert not wrong, "an env imports another env's internals:\n" + "\n".join(sorted(wrong))


def test_servers_do_not_import_the_client(graph):
    wrong = [
        f"{a} imports {b}"
        for a, targets in graph.items()
        if a.startswith("envhub.server")
        for b in targets
        if b in ("envhub.remote", "envhub.envs.adapters.openenv")
    ]
    assert not wrong, "\n".join(wrong)


def test_functions_stay_short():
    files = {name: path for name, path in modules().items()}
    files |= {f"benchmarks.{p.stem}": p for p in (ROOT / "benchmarks").glob("*.py")}
    long = []
    for name, path in files.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES and f"{name}.{node.name}" not in DATA_TABLES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them into named steps):\n" + "\n".join(long)


def test_every_module_says_its_job():
    missing = [str(p.relative_to(ROOT)) for p in modules().values() if not ast.get_docstring(ast.parse(p.read_text()))]
    assert not missing, f"modules without a docstring naming their job: {missing}"


# The trainer's rooms: the modules loose at trainer/'s top (the contract between rollout and learner, the config,
# the loop and its one-off jobs) and the folders along the data path. A new module goes into a room, or here.
TRAINER_TOP = {
    "bench", "collect", "config", "evaluation", "models", "sft", "staleness", "train", "trajectory",
}  # fmt: skip
TRAINER_ROOMS = {
    "rollout": {"tasks", "producer", "sources", "worker", "ray_workers", "queue", "preflight"},
    "run": {"record", "resume", "metrics", "errors", "cpu_usage"},
    "engines": {"kinds", "protocol", "routing", "launcher", "resubmit", "weights", "weight_sync", "watch"},
    "engines/embedded": {"engine", "kind"},
    "engines/server": {"app", "security", "state", "weights", "openai_api", "gate"},
    "engines/sglang": {"client", "kind", "deploy", "launch"},
    "engines/vllm": {"engine", "kind", "command", "weights"},
}


def test_the_trainer_keeps_its_rooms():
    top = {p.stem for p in (ROOT / "trainer").glob("*.py")} - {"__init__"}
    assert top == TRAINER_TOP, (
        f"loose modules at trainer/'s top changed: {sorted(top ^ TRAINER_TOP)} (put new ones in a room)"
    )
    for room, members in TRAINER_ROOMS.items():
        present = {p.stem for p in (ROOT / "trainer" / room).glob("*.py")}
        assert members <= present, f"trainer/{room}/ lacks {sorted(members - present)}"
    families = {p.name for p in (ROOT / "trainer" / "engines").iterdir() if (p / "__init__.py").exists()}
    assert families == {"embedded", "server", "sglang", "vllm"}, "one folder per engine family"


ENGINE_KIND_NAMES = {"embedded", "local", "sglang", "vllm"}


def _kind_comparisons(path: Path, root: Path = ROOT) -> list[str]:
    """Comparisons of an engine kind's name with a string literal: `kind == "vllm"`, `x.kind in ("local", ...)`,
    `backend != "embedded"` (the sandboxes' own `backend == "local"` is another thing: it names no engine)."""
    tree, found = ast.parse(path.read_text()), []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        literals = set()
        for operand in operands:
            elts = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
            literals |= {e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        names = literals & ENGINE_KIND_NAMES
        text = " ".join(ast.unparse(o) for o in operands)
        engine_words = ("kind", "engine") if names == {"local"} else ("kind", "engine", "backend")
        if names and any(word in text for word in engine_words):
            found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_only_the_engines_compare_engine_kind_names():
    """The engine kind is a type (trainer/engines/kinds.py): outside trainer/engines/, code asks the kind."""
    engines = ROOT / "trainer" / "engines"
    files = [p for p in modules().values() if engines not in p.parents]
    files += list((ROOT / "benchmarks").glob("*.py"))
    found = [line for path in files for line in _kind_comparisons(path)]
    assert not found, "engine kinds compared with strings outside trainer/engines/:\n" + "\n".join(found)


def test_the_kind_check_finds_string_comparisons(tmp_path):
    """The check above can fail: it finds each spelling of the comparison it forbids."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        'if cfg.engine.kind != "local": pass\n'
        'if kind in ("sglang", "vllm"): pass\n'
        'if args.backend == "vllm": pass\n'
        'if backend == "local": pass\n'  # a sandbox backend: not an engine kind
    )
    found = _kind_comparisons(sample, tmp_path)
    assert [line.split(":")[1] for line in found] == ["1", "2", "3"], found
