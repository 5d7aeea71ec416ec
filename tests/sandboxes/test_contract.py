"""The Sandbox contract, run against each backend through a pool."""

import io
import tarfile

import pytest

from envhub.errors import SandboxError
from envhub.sandboxes import ExecResult, LocalSandbox, SandboxLimits, SandboxPool


@pytest.fixture(params=["docker", "bwrap"])
def pool(request):
    return request.getfixturevalue(f"{request.param}_pool")


async def test_exec_prints(pool):
    async with pool.acquire() as sb:
        r = await sb.exec("python3 -c 'print(1)'", timeout=10)
    assert isinstance(r, ExecResult)
    assert r.exit_code == 0 and r.stdout == "1\n" and r.stderr == ""
    assert not r.timed_out and not r.truncated and r.duration > 0


async def test_exit_code_stderr_stdin_cwd_env(pool):
    async with pool.acquire() as sb:
        r = await sb.exec("echo oops >&2; exit 3", timeout=10)
        assert (r.exit_code, r.stderr) == (3, "oops\n")
        r = await sb.exec("python3 -", stdin="import sys; print(sys.version_info[0])", timeout=10)
        assert r.stdout == "3\n"
        await sb.exec("mkdir -p /workspace/sub", timeout=10)
        r = await sb.exec(["sh", "-c", "pwd; echo $GREETING"], cwd="/workspace/sub", env={"GREETING": "hi"}, timeout=10)
        assert r.stdout == "/workspace/sub\nhi\n"


async def test_files_roundtrip_and_persist(pool):
    blob = bytes(range(256)) * 100
    async with pool.acquire() as sb:
        await sb.write_file("/workspace/deep/dir/data.bin", blob)
        assert await sb.read_file("/workspace/deep/dir/data.bin") == blob
        r = await sb.exec("wc -c < deep/dir/data.bin", timeout=10)
        assert r.stdout.strip() == str(len(blob))
        with pytest.raises(SandboxError, match="cannot read"):
            await sb.read_file("/workspace/missing.txt")


async def test_upload_dir_then_git_and_pytest(pool, tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "test_x.py").write_text("def test_ok():\n    assert 1 + 1 == 2\n")
    async with pool.acquire() as sb:
        await sb.upload_dir(tmp_path / "pkg", "/workspace/repo")
        r = await sb.exec(
            "git init -q && git add -A && git -c user.email=a@b -c user.name=a commit -qm init && python3 -m pytest -q",
            cwd="/workspace/repo",
            timeout=60,
        )
        assert r.exit_code == 0, r.stdout + r.stderr
        assert "1 passed" in r.stdout


async def test_write_archive(pool):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("a/b.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    async with pool.acquire() as sb:
        await sb.write_archive(buffer.getvalue(), "/workspace/x")
        assert await sb.read_file("/workspace/x/a/b.txt") == b"hi"


async def test_reset_clears_workspace_and_processes(pool):
    async with pool.acquire() as sb:
        await sb.write_file("/workspace/f.txt", "x")
        await sb.exec("(sleep 300 > /dev/null 2>&1 &); true", timeout=10)
        await sb.reset()
        r = await sb.exec(
            "ls -A /workspace | wc -l; ps -eo args --no-headers | grep -c '[s]leep 300' || true", timeout=10
        )
        assert r.stdout.split() == ["0", "0"]


async def test_timeout_is_a_result_not_an_exception(pool):
    async with pool.acquire() as sb:
        r = await sb.exec("sleep 30", timeout=0.5)
        assert r.timed_out and r.exit_code != 0 and r.duration < 10
        assert (await sb.exec("echo alive", timeout=10)).stdout == "alive\n"


@pytest.mark.parametrize("backend", ["docker", "bwrap"])
async def test_cpuset_pins_the_sandbox_to_those_cpus(backend, request):
    request.getfixturevalue("base_rootfs" if backend == "bwrap" else "base_image")
    async with SandboxPool(backend=backend, size=0, max_size=1, limits=SandboxLimits(cpuset="0")) as pool:
        async with pool.acquire() as sb:
            r = await sb.exec("grep Cpus_allowed_list /proc/self/status", timeout=20)
    assert r.stdout.split() == ["Cpus_allowed_list:", "0"]


async def test_local_sandbox_needs_opt_in():
    with pytest.raises(SandboxError, match="without isolation"):
        LocalSandbox()
    async with SandboxPool(backend="local", size=1) as pool:
        async with pool.acquire() as sb:
            r = await sb.exec("echo $((6*7))", timeout=10)
            assert r.stdout == "42\n"


async def test_bad_backend_is_a_clear_error():
    with pytest.raises(SandboxError, match="unknown sandbox backend"):
        SandboxPool(backend="vm")
