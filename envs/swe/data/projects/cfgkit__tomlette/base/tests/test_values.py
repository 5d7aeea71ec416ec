import math

import pytest

from tomlette import TomlError, loads


def test_integers():
    assert loads("a = 42\nb = -7\nc = 1_000") == {"a": 42, "b": -7, "c": 1000}


def test_hex():
    assert loads("mask = 0xff") == {"mask": 255}


def test_floats():
    assert loads("pi = 3.14\nneg = -0.5") == {"pi": 3.14, "neg": -0.5}


def test_special_floats():
    doc = loads("a = inf\nb = nan")
    assert doc["a"] == math.inf and math.isnan(doc["b"])


def test_booleans():
    assert loads("on = true\noff = false") == {"on": True, "off": False}


def test_basic_string_escapes():
    assert loads(r'msg = "tab\there\nquote\" done"') == {"msg": 'tab\there\nquote" done'}


def test_unicode_escape():
    assert loads(r'snow = "\u2603"') == {"snow": "\u2603"}


def test_literal_string_keeps_backslashes():
    assert loads(r"path = 'C:\temp\new'") == {"path": "C:\\temp\\new"}


def test_arrays():
    assert loads('a = [1, 2, 3]\nb = ["x", "y"]\nc = [[1], [2, 3]]') == {"a": [1, 2, 3], "b": ["x", "y"], "c": [[1], [2, 3]]}


def test_multiline_array():
    assert loads("ports = [\n  80,\n  443\n]") == {"ports": [80, 443]}


def test_inline_table():
    assert loads('point = {x = 1, y = 2}') == {"point": {"x": 1, "y": 2}}


def test_invalid_value():
    with pytest.raises(TomlError):
        loads("a = maybe")
