"""SGLang 0.5.23's own code, loaded without its GPU runtime, as the oracle for envhub's SGLang client and server.

`pip install --no-deps sglang==0.5.23` puts SGLang's source here, but `sglang/__init__`, `io_struct` and
`utils/common` import CUDA-only packages (triton, sgl_kernel, zmq). The pure modules are imported with the
package mounted but not run; for the rest, the definitions the tests need (the request structs of
`io_struct.py`, `SafeUnpickler`, `MultiprocessingSerializer` and `init_custom_process_group` of `common.py`) are
taken verbatim from SGLang's source files and executed in a module of their own. Nothing is re-implemented.
"""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import sys
import types
from pathlib import Path

import pytest

# Packages whose __init__ imports the GPU runtime: mounted (their modules importable) but not run.
_MOUNTED = ("sglang", "sglang.srt", "sglang.srt.utils")


def sglang_module(name: str) -> types.ModuleType:
    """Import one of SGLang's pure-Python modules without running the package `__init__`s that need a GPU stack."""
    if "sglang" not in sys.modules:
        try:  # the installed distribution's folder, whatever else on sys.path is named `sglang` (tests/.../sglang)
            root = Path(importlib.metadata.distribution("sglang").locate_file("sglang"))
        except importlib.metadata.PackageNotFoundError:
            pytest.skip("sglang is not installed (pip install --no-deps sglang==0.5.23)")
        for package_name in _MOUNTED:
            package = types.ModuleType(package_name)
            package.__path__ = [str(root.joinpath(*package_name.split(".")[1:]))]
            package.__spec__ = importlib.machinery.ModuleSpec(package_name, None, is_package=True)
            package.__spec__.submodule_search_locations = package.__path__
            sys.modules[package_name] = package
    return importlib.import_module(name)


def _definitions(relative: str, names: set[str], module_name: str, namespace: dict) -> types.ModuleType:
    """Run the top-level definitions `names` of SGLang's `relative` source file in a fresh module."""
    if module_name in sys.modules:
        return sys.modules[module_name]
    sglang_module("sglang.srt.utils.msgspec_utils")  # mounts the package (or skips)
    source = Path(sys.modules["sglang"].__path__[0], relative).read_text()
    tree = ast.parse(source)
    body = []
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name in names:
            body.append(node)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in names for t in node.targets):
            body.append(node)
    found = {getattr(n, "name", None) or n.targets[0].id for n in body}
    assert found == names, f"not in SGLang's {relative}: {names - found}"
    module = types.ModuleType(module_name)
    module.__dict__.update(namespace)
    sys.modules[module_name] = module
    future = ast.parse("from __future__ import annotations").body
    exec(compile(ast.Module(future + body, type_ignores=[]), f"sglang/{relative}", "exec"), module.__dict__)
    return module


def io_structs() -> types.ModuleType:
    """SGLang's request structs for the routes envhub calls (msgspec structs; FastAPI validates JSON with them)."""
    import typing

    import msgspec

    utils = sglang_module("sglang.srt.utils.msgspec_utils")
    versions = sglang_module("sglang.srt.utils.weight_versions")
    namespace = {name: getattr(typing, name) for name in ("Any", "Annotated", "Dict", "List", "Literal", "Optional")}
    namespace |= {"Union": typing.Union, "msgspec": msgspec, "Base64Bytes": utils.Base64Bytes}
    namespace |= {
        "msgspec_struct_pydantic_core_schema": utils.msgspec_struct_pydantic_core_schema,
        "WeightVersionSpans": versions.WeightVersionSpans,
    }
    names = {
        "BaseReq",
        "FinishReasonDict",
        "AbortReq",
        "PauseGenerationReqInput",
        "ContinueGenerationReqInput",
        "UpdateWeightFromDiskReqInput",
        "UpdateWeightsFromTensorReqInput",
        "UpdateWeightsFromDistributedReqInput",
        "InitWeightsUpdateGroupReqInput",
        "DestroyWeightsUpdateGroupReqInput",
        "BeginWeightUpdateReqInput",
        "EndWeightUpdateReqInput",
    }
    return _definitions("srt/managers/io_struct.py", names, "sglang_io_struct_oracle", namespace)


def parse_as_sglang(struct: type, body: dict) -> object:
    """The request body as SGLang's HTTP server parses it (FastAPI: pydantic over the struct's schema, JSON mode)."""
    import json

    import pydantic

    return pydantic.TypeAdapter(struct).validate_json(json.dumps(body))


def common() -> types.ModuleType:
    """SafeUnpickler, MultiprocessingSerializer and init_custom_process_group from SGLang's utils/common.py."""
    import io
    import pickle
    from multiprocessing.reduction import ForkingPickler

    import pybase64
    import torch

    namespace = {"io": io, "pickle": pickle, "torch": torch, "pybase64": pybase64, "ForkingPickler": ForkingPickler}
    namespace["torch_release"] = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:3])
    names = {"_safe_load_torch_storage", "SafeUnpickler", "MultiprocessingSerializer", "init_custom_process_group"}
    return _definitions("srt/utils/common.py", names, "sglang_common_oracle", namespace)


def decode_in_child(payloads: list[str], flattened: bool) -> list[list[tuple[str, list, str]]]:
    """Run in a child process: each rank's payload through SGLang's `MultiprocessingSerializer.deserialize`
    (its SafeUnpickler allow-list), flattened buckets through its `FlattenedTensorBucket`."""
    serializer = common().MultiprocessingSerializer
    decoded = []
    for payload in payloads:
        obj = serializer.deserialize(payload)
        if flattened:
            bucket_module = sglang_module("sglang.srt.weight_sync.tensor_bucket")
            metadata = [
                bucket_module.FlattenedTensorMetadata(m.name, m.shape, m.dtype, m.start_idx, m.end_idx, m.numel)
                for m in obj["metadata"]
            ]
            bucket = bucket_module.FlattenedTensorBucket(flattened_tensor=obj["flattened_tensor"], metadata=metadata)
            obj = bucket.reconstruct_tensors()
        decoded.append([(name, t.float().tolist(), str(t.dtype)) for name, t in obj])
    return decoded


def receive_in_child(port: int, world_size: int, rank: int, buckets: list[tuple[list, list, list, str | None]]) -> list:
    """Run in a child process: join the trainer's group with SGLang's `init_custom_process_group` and receive
    each bucket as SGLang's weight updater does (tensor by tensor with async broadcasts, or one flat bucket)."""
    import torch

    bucket_module = sglang_module("sglang.srt.weight_sync.tensor_bucket")
    group = common().init_custom_process_group(
        backend="gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=world_size, rank=rank, group_name="g1"
    )
    received = []
    for names, dtypes, shapes, load_format in buckets:
        if load_format == "flattened_bucket":
            bucket = bucket_module.FlattenedTensorBucket.empty(names, dtypes, shapes, "cpu")
            torch.distributed.broadcast(bucket.get_flattened_tensor(), src=0, group=group)
            weights = bucket.reconstruct_tensors()
        else:
            weights, handles = [], []
            for name, dtype, shape in zip(names, dtypes, shapes):
                weight = torch.empty(shape, dtype=getattr(torch, dtype))
                handles.append(torch.distributed.broadcast(weight, src=0, group=group, async_op=True))
                weights.append((name, weight))
            for handle in handles:
                handle.wait()
        received += [(name, t.float().tolist()) for name, t in weights]
    torch.distributed.destroy_process_group(group)
    return received


def server_arg_fields() -> dict[str, str]:
    """Every `sglang.launch_server` option of SGLang's arg groups (`srt/arg_groups/fields/*.py`, one dataclass
    field per flag: `snake_case` -> `--kebab-case`), with the source text of its type."""
    sglang_module("sglang.srt.utils.msgspec_utils")  # mounts the package (or skips)
    folder = Path(sys.modules["sglang"].__path__[0], "srt", "arg_groups", "fields")
    fields = {}
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        annotation = item.annotation
                        if isinstance(annotation, ast.Subscript) and isinstance(annotation.slice, ast.Tuple):
                            annotation = annotation.slice.elts[0]  # A[type, help]
                        fields[item.target.id] = ast.unparse(annotation)
    return fields


async def recorded_server(engine, **options):
    """serve-engine on 127.0.0.1 recording every (path, JSON body) it is sent: (url, bodies, runner, state)."""
    from aiohttp import web

    from envhub.trainer.engines.server.app import create_app
    from envhub.trainer.engines.server.state import STATE_KEY

    bodies: list[tuple[str, dict]] = []

    @web.middleware
    async def record(request, handler):
        if request.method == "POST" and request.can_read_body:
            bodies.append((request.path, await request.json()))
        return await handler(request)

    app = create_app(engine, "tiny", **options)
    app.middlewares.insert(0, record)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return f"http://127.0.0.1:{runner.addresses[0][1]}", bodies, runner, app[STATE_KEY]
