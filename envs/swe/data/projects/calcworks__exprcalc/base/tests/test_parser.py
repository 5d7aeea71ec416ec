import pytest

from exprcalc import CalcError, parse, tokenize


def test_tokenize_kinds():
    kinds = [t.kind for t in tokenize("f(x, 2.5) ** 2")]
    assert kinds == ["name", "lparen", "name", "comma", "number", "rparen", "op", "number", "end"]


def test_tokenize_positions():
    assert [t.pos for t in tokenize("1 + 22")] == [0, 2, 4, 6]


def test_tokenize_rejects_unknown_characters():
    with pytest.raises(CalcError, match="unexpected character"):
        tokenize("2 $ 3")


def test_parse_tree():
    assert parse("1 + 2 * x") == ("+", ("num", 1), ("*", ("num", 2), ("var", "x")))


def test_parse_call():
    assert parse("max(1, 2)") == ("call", "max", (("num", 1), ("num", 2)))


def test_missing_parenthesis():
    with pytest.raises(CalcError, match="expected"):
        parse("(1 + 2")


def test_trailing_garbage():
    with pytest.raises(CalcError):
        parse("1 2")
