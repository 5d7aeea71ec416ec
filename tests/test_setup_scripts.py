"""The set-up scripts `make install` / `make test` run before anything else."""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECK_DISK = ROOT / "scripts" / "check-disk.sh"


def _check_disk(tmp_path, need, env_need=None):
    env = {"PATH": "/usr/bin:/bin"}
    if env_need is not None:
        env["ENVHUB_MIN_FREE_GIB"] = str(env_need)
    return subprocess.run(
        ["bash", str(CHECK_DISK), "the test suite", str(need), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )


def test_check_disk_fails_with_the_numbers_and_the_fix_when_space_is_short(tmp_path):
    result = _check_disk(tmp_path, 1_000_000)
    assert result.returncode == 1
    assert f"the test suite needs about 1000000 GiB free on the disk holding {tmp_path}" in result.stderr
    assert "it has " in result.stderr and "ENVHUB_MIN_FREE_GIB" in result.stderr


def test_check_disk_passes_when_space_suffices_and_the_override_lowers_the_need(tmp_path):
    assert _check_disk(tmp_path, 0).returncode == 0
    overridden = _check_disk(tmp_path, 1_000_000, env_need=0)
    assert overridden.returncode == 0, overridden.stderr
