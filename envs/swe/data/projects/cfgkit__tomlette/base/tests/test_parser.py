import io

import pytest

from tomlette import TomlError, load, loads


def test_empty_document():
    assert loads("") == {}


def test_comments_are_ignored():
    assert loads("# header\na = 1  # trailing\n") == {"a": 1}


def test_tables():
    doc = loads("[server]\nhost = 'x'\n[client]\nretries = 3")
    assert doc == {"server": {"host": "x"}, "client": {"retries": 3}}


def test_dotted_keys():
    assert loads("site.name = 'blog'\nsite.port = 80") == {"site": {"name": "blog", "port": 80}}


def test_dotted_table_header():
    assert loads("[a.b]\nc = 1") == {"a": {"b": {"c": 1}}}


def test_quoted_keys():
    assert loads('"my key" = 1\n\'other\' = 2') == {"my key": 1, "other": 2}


def test_duplicate_key_is_an_error():
    with pytest.raises(TomlError, match="duplicate"):
        loads("a = 1\na = 2")


def test_missing_equals():
    with pytest.raises(TomlError):
        loads("just words")


def test_load_from_file():
    assert load(io.StringIO("x = 1")) == {"x": 1}
