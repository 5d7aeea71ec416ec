"""The `envhub` command line: listing, info, playing from a pipe, and one-line errors."""

import io
import subprocess
import sys

import envhub
from envhub.cli.main import main
from envhub.cli.play import play
from tests.test_registry import Echo


def run_cli(*args, stdin=""):
    return subprocess.run(
        [sys.executable, "-m", "envhub.cli.main", *args], input=stdin, capture_output=True, text=True, timeout=120
    )


def test_list_shows_builtins_and_filters_by_tag(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "Sokoban-v0" in out and "Math-v0" in out
    assert main(["list", "--tag", "math"]) == 0
    out = capsys.readouterr().out
    assert "Math-v0" in out and "Sokoban-v0" not in out
    # envhub's own games, without the hundreds the adapted suites register under the same tag
    assert main(["list", "--tag", "game", "--source", "envhub"]) == 0
    ids = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert "Sokoban-v0" in ids and not any(i.startswith(("ta-", "gem-")) for i in ids) and len(ids) < 20
    assert main(["list", "--source", "nowhere"]) == 1
    assert "sources here:" in capsys.readouterr().err


def test_unknown_id_is_one_line_with_a_suggestion_and_nonzero_exit():
    result = run_cli("info", "FrozenLak-v0")
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert lines[0] == "envhub: error: unknown environment 'FrozenLak-v0'" and len(lines) == 2
    # adapted families (ta-FrozenLake-v0, ...) may follow the built-in id
    assert lines[1].startswith("hint: did you mean FrozenLake-v0") and "`envhub list` shows every id" in lines[1]
    assert "--import MODULE_OR_FILE" in lines[1] and "plugin package" in lines[1]  # how one's own envs get found


def test_unknown_tag_says_so(capsys):
    assert main(["list", "--tag", "no-such-tag"]) == 1
    assert "no environment has tag 'no-such-tag'" in capsys.readouterr().out


def test_play_reads_actions_from_a_pipe():
    envhub.register("EchoPlay-v0", Echo, kwargs={"limit": 2})
    out = io.StringIO()
    total = play("EchoPlay-v0", seed=0, stdin=io.StringIO("hello\nworld\nunused\n"), stdout=out)
    text = out.getvalue()
    assert total == 2.0
    assert "you said: hello" in text and "you said: world" in text and "unused" not in text
    assert "episode finished after 2 steps" in text


def test_play_stops_cleanly_at_end_of_input():
    envhub.register("EchoPlayEof-v0", Echo, kwargs={"limit": 5})
    out = io.StringIO()
    play("EchoPlayEof-v0", stdin=io.StringIO("one\n"), stdout=out)
    assert "end of input" in out.getvalue()


def test_list_marks_ids_that_cannot_run_here_available_hides_them_info_says_why(capsys):
    import json

    envhub.register("EchoBroken-v0", Echo, tags=("avail-check",), requires=("broken:its data files are missing",))
    envhub.register("EchoFine-v0", Echo, tags=("avail-check",))
    assert main(["list", "--tag", "avail-check"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("EchoBroken-v0") and "unavailable here" in line for line in lines)
    assert any(line.startswith("EchoFine-v0") and "unavailable" not in line for line in lines)
    assert "1 ids cannot run on this machine" in "\n".join(lines)
    assert main(["list", "--tag", "avail-check", "--available"]) == 0
    out = capsys.readouterr().out
    assert "EchoFine-v0" in out and "EchoBroken-v0" not in out
    assert main(["list", "--tag", "avail-check", "--json"]) == 0
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["EchoBroken-v0"]["unavailable"] == "its data files are missing" and rows["EchoFine-v0"]["available"]
    assert main(["info", "EchoBroken-v0"]) == 0
    assert "available:    no: its data files are missing (pick another env)" in capsys.readouterr().out
    try:
        envhub.make("EchoBroken-v0")
    except envhub.EnvhubError as exc:
        assert "cannot run here: its data files are missing" in str(exc) and "\n" not in str(exc)
    else:
        raise AssertionError("an unavailable env was made")


def test_a_reader_that_stops_early_ends_the_listing_quietly():
    """`envhub list | head -1`: the pipe closes after one line; no BrokenPipeError traceback, SIGPIPE's status."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "envhub.cli.main", "list"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    first = proc.stdout.readline()
    proc.stdout.close()  # the listing (~100 KB) is more than the pipe holds: the writer meets the closed end
    stderr = proc.stderr.read()
    assert proc.wait(timeout=120) == 141, stderr
    assert first.split()[0].endswith("-v0") and stderr == ""
