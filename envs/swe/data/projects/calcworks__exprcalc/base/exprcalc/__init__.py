"""exprcalc: evaluate arithmetic expressions safely."""

from exprcalc.evaluator import CalcError, evaluate
from exprcalc.parser import parse
from exprcalc.tokenizer import tokenize

__all__ = ["CalcError", "evaluate", "parse", "tokenize"]
