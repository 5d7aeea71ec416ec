"""Split an expression into tokens."""

import re
from dataclasses import dataclass


class CalcError(Exception):
    """Any problem with an expression: syntax, unknown names, bad arguments, division by zero."""


@dataclass(frozen=True)
class Token:
    kind: str  # "number", "name", "op", "lparen", "rparen", "comma", "end"
    text: str
    pos: int


_TOKEN = re.compile(
    r"\s*(?:(?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)"
    r"|(?P<name>[A-Za-z_]\w*)"
    r"|(?P<op>\*\*|//|[-+*/%])"
    r"|(?P<lparen>\()|(?P<rparen>\))|(?P<comma>,))"
)


def tokenize(text):
    """The tokens of `text`, ending with an "end" token."""
    tokens = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        match = _TOKEN.match(text, pos)
        if not match or match.end() == pos:
            bad = len(text) - len(text[pos:].lstrip())
            raise CalcError(f"unexpected character {text[bad]!r} at position {bad}")
        kind = match.lastgroup
        tokens.append(Token(kind, match.group(kind), match.start(kind)))
        pos = match.end()
    tokens.append(Token("end", "", len(text)))
    return tokens
