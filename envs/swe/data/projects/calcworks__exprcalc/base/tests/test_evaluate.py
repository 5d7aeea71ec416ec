import math

import pytest

from exprcalc import CalcError, evaluate


def test_numbers():
    assert evaluate("42") == 42
    assert evaluate("3.5") == 3.5
    assert evaluate(".5") == 0.5


def test_addition_and_multiplication_precedence():
    assert evaluate("2 + 3 * 4") == 14
    assert evaluate("(2 + 3) * 4") == 20


def test_subtraction_and_division_are_left_associative():
    assert evaluate("10 - 4 - 3") == 3
    assert evaluate("64 / 4 / 2") == 8


def test_floor_division_and_modulo():
    assert evaluate("7 // 2") == 3
    assert evaluate("7 % 3") == 1


def test_power():
    assert evaluate("2 ** 10") == 1024


def test_unary_minus():
    assert evaluate("-3 + 5") == 2
    assert evaluate("2 * -3") == -6
    assert evaluate("--4") == 4


def test_variables_and_constants():
    assert evaluate("x * y", {"x": 3, "y": 4}) == 12
    assert evaluate("pi") == math.pi


def test_functions():
    assert evaluate("max(1, 7, 3)") == 7
    assert evaluate("sqrt(16) + abs(-2)") == 6.0
    assert evaluate("round(2.567, 2)") == 2.57


def test_unknown_variable():
    with pytest.raises(CalcError, match="unknown variable"):
        evaluate("x + 1")


def test_unknown_function():
    with pytest.raises(CalcError, match="unknown function"):
        evaluate("foo(1)")


def test_division_by_zero():
    with pytest.raises(CalcError, match="division by zero"):
        evaluate("1 / 0")


def test_sqrt_of_negative():
    with pytest.raises(CalcError):
        evaluate("sqrt(-1)")
