"""Scan one TOML value (string, number, boolean, array, inline table) from a line of text."""

import re

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "b": "\b", "f": "\f"}
_INTEGER = re.compile(r"[+-]?(?:0|[1-9](?:_?\d)*)")
_HEX = re.compile(r"0x[0-9a-fA-F](?:_?[0-9a-fA-F])*")
_FLOAT = re.compile(r"[+-]?(?:0|[1-9](?:_?\d)*)(?:\.\d(?:_?\d)*)?(?:[eE][+-]?\d(?:_?\d)*)?")
_BARE_END = re.compile(r"[\s,\]}#]|$")


class ValueError_(Exception):
    """A value that cannot be parsed; the parser adds the line number."""


def unescape(body):
    """Resolve the backslash escapes of a basic string body."""
    out = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        code = body[i + 1 : i + 2]
        if code in _ESCAPES:
            out.append(_ESCAPES[code])
            i += 2
        elif code in ("u", "U"):
            width = 4 if code == "u" else 8
            digits = body[i + 2 : i + 2 + width]
            if len(digits) != width or not all(c in "0123456789abcdefABCDEF" for c in digits):
                raise ValueError_(f"bad unicode escape \\{code}{digits}")
            out.append(chr(int(digits, 16)))
            i += 2 + width
        else:
            raise ValueError_(f"unknown escape \\{code}")
    return "".join(out)


def scan_string(text, pos):
    """Scan a basic or literal string starting at text[pos]; returns (value, end)."""
    quote = text[pos]
    i = pos + 1
    while i < len(text):
        if quote == '"' and text[i] == "\\":
            i += 2
            continue
        if text[i] == quote:
            body = text[pos + 1 : i]
            return (unescape(body) if quote == '"' else body), i + 1
        i += 1
    raise ValueError_("unterminated string")


def scan_value(text, pos):
    """Scan any value starting at text[pos] (after whitespace); returns (value, end)."""
    while pos < len(text) and text[pos] in " \t":
        pos += 1
    if pos >= len(text):
        raise ValueError_("missing value")
    ch = text[pos]
    if ch in "\"'":
        return scan_string(text, pos)
    if ch == "[":
        return scan_array(text, pos)
    if ch == "{":
        return scan_inline_table(text, pos)
    end = _BARE_END.search(text, pos).start()
    word = text[pos:end]
    if word in ("true", "false"):
        return word == "true", end
    if _HEX.fullmatch(word):
        return int(word, 16), end
    if _INTEGER.fullmatch(word):
        return int(word.replace("_", "")), end
    if _FLOAT.fullmatch(word):
        return float(word.replace("_", "")), end
    if word in ("inf", "+inf", "-inf", "nan", "+nan", "-nan"):
        return float(word), end
    raise ValueError_(f"invalid value {word!r}")


def _skip(text, pos):
    while pos < len(text) and text[pos] in " \t\n":
        pos += 1
    return pos


def scan_array(text, pos):
    """Scan `[a, b, ...]` (nested arrays allowed, trailing comma allowed)."""
    items = []
    pos = _skip(text, pos + 1)
    while True:
        if pos >= len(text):
            raise ValueError_("unterminated array")
        if text[pos] == "]":
            return items, pos + 1
        value, pos = scan_value(text, pos)
        items.append(value)
        pos = _skip(text, pos)
        if pos < len(text) and text[pos] == ",":
            pos = _skip(text, pos + 1)
        elif pos < len(text) and text[pos] != "]":
            raise ValueError_("expected ',' or ']' in array")


def scan_inline_table(text, pos):
    """Scan `{key = value, ...}`."""
    from tomlette.parser import assign, split_key

    table = {}
    pos = _skip(text, pos + 1)
    if pos < len(text) and text[pos] == "}":
        return table, pos + 1
    while True:
        eq = text.find("=", pos)
        if eq < 0:
            raise ValueError_("expected '=' in inline table")
        key = split_key(text[pos:eq])
        value, pos = scan_value(text, eq + 1)
        assign(table, key, value)
        pos = _skip(text, pos)
        if pos < len(text) and text[pos] == "}":
            return table, pos + 1
        if pos >= len(text) or text[pos] != ",":
            raise ValueError_("expected ',' or '}' in inline table")
        pos = _skip(text, pos + 1)
