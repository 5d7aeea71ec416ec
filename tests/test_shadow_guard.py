"""A clone directory named `envhub` beside a script must not shadow the installed envhub (scripts/*shadow*guard*)."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_a_clone_named_envhub_next_to_a_script_does_not_hide_the_installed_package(tmp_path):
    (tmp_path / "envhub").symlink_to(REPO)  # the clone's root, seen from its parent: a directory with no __init__.py
    # the start-up hook as `make install` puts it beside envhub: a .pth file that site processes
    script = (
        f"import site; site.addsitedir({str(REPO / 'scripts')!r})\n"
        "import envhub, gymnasium\n"
        "print(gymnasium.make('envhub/Letters-v0').spec.id, envhub.make('Letters-v0').spec.id)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]  # before the hook: NamespaceNotFound: Namespace envhub not found
    assert done.stdout.split() == ["envhub/Letters-v0"] * 2
    assert f"the directory {tmp_path / 'envhub'} (no __init__.py" in done.stderr
    assert "Run from inside the clone, or rename the directory." in done.stderr
