"""Offline images: the base image is cached by content hash; derived images add files on top."""

from envhub.cli.main import main as cli_main
from envhub.sandboxes import SandboxPool, base_image_tag, build_base_image, build_derived_image
from envhub.sandboxes.images import recipe_hash


async def test_second_build_is_a_noop(base_image, capsys):
    assert base_image == base_image_tag() and base_image.endswith(recipe_hash())
    report = build_base_image()
    assert report.cached and report.size_bytes > 100e6
    assert cli_main(["sandbox", "build"]) == 0
    assert "up to date" in capsys.readouterr().out


async def test_base_image_has_python_pytest_git(docker_pool):
    async with docker_pool.acquire() as sb:
        r = await sb.exec("python3 --version && python3 -m pytest --version && git --version", timeout=30)
    assert r.exit_code == 0, r.stderr
    assert "Python 3.11" in r.stdout and "git version" in r.stdout and "pytest" in (r.stdout + r.stderr)


async def test_derived_image_carries_files_and_is_cached(base_image):
    files = {"repo/hello.py": b"print('hello from derived')\n"}
    tag = build_derived_image(files, base=base_image, dest="/opt/task")
    assert build_derived_image(files, base=base_image, dest="/opt/task") == tag
    assert build_derived_image({"repo/hello.py": b"print(2)\n"}, base=base_image, dest="/opt/task") != tag
    async with SandboxPool(backend="docker", image=tag, size=1) as pool:
        async with pool.acquire() as sb:
            r = await sb.exec("python3 /opt/task/repo/hello.py", timeout=20)
    assert r.stdout == "hello from derived\n"


def test_debootstrap_runs_under_eatmydata_where_installed_and_plainly_elsewhere(monkeypatch, tmp_path):
    from envhub.sandboxes import images

    plain = images.debootstrap_command(tmp_path)  # `make install` brings eatmydata
    assert plain[0].endswith("/eatmydata") and plain[1] == "debootstrap" and str(tmp_path) in plain
    real_which = images.shutil.which
    monkeypatch.setattr(images.shutil, "which", lambda name: None if name == "eatmydata" else real_which(name))
    assert images.debootstrap_command(tmp_path) == plain[1:]
