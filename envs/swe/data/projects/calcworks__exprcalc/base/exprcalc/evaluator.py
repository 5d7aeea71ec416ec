"""Evaluate syntax trees from `exprcalc.parser`."""

import math
import operator

from exprcalc.parser import parse
from exprcalc.tokenizer import CalcError

CONSTANTS = {"pi": math.pi, "e": math.e}
FUNCTIONS = {
    "abs": abs,
    "min": min,
    "max": max,
    "sqrt": math.sqrt,
    "round": round,
    "floor": math.floor,
    "ceil": math.ceil,
}
_BINARY = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "//": operator.floordiv,
    "%": operator.mod,
    "**": operator.pow,
}


def _eval(node, names):
    kind = node[0]
    if kind == "num":
        return node[1]
    if kind == "var":
        if node[1] not in names:
            raise CalcError(f"unknown variable {node[1]!r}")
        return names[node[1]]
    if kind == "neg":
        return -_eval(node[1], names)
    if kind == "pos":
        return +_eval(node[1], names)
    if kind == "call":
        function = FUNCTIONS.get(node[1])
        if function is None:
            raise CalcError(f"unknown function {node[1]!r}")
        args = [_eval(arg, names) for arg in node[2]]
        try:
            return function(*args)
        except (TypeError, ValueError) as exc:
            raise CalcError(f"{node[1]}(): {exc}") from None
    left, right = _eval(node[1], names), _eval(node[2], names)
    try:
        return _BINARY[kind](left, right)
    except ZeroDivisionError:
        raise CalcError("division by zero") from None
    except OverflowError:
        raise CalcError("result too large") from None


def evaluate(text, variables=None):
    """Evaluate an expression; `variables` maps names to numbers."""
    names = {**CONSTANTS, **(variables or {})}
    return _eval(parse(text), names)
