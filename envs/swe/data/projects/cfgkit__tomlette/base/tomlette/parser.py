"""Parse a TOML document line by line into nested dicts."""

import re

from tomlette.values import ValueError_, scan_string, scan_value

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


class TomlError(ValueError):
    """A document that is not valid (tomlette-subset) TOML; `lineno` is 1-based."""

    def __init__(self, message, lineno):
        super().__init__(f"line {lineno}: {message}")
        self.lineno = lineno


def strip_comment(line):
    """Remove a trailing `# comment`, leaving '#' inside strings alone."""
    quote = None
    i = 0
    while i < len(line):
        ch = line[i]
        if quote:
            if ch == "\\" and quote == '"':
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            return line[:i]
        i += 1
    return line


def split_key(text):
    """Split a (possibly dotted, possibly quoted) key into its parts."""
    parts = []
    pos = 0
    text = text.strip()
    while True:
        while pos < len(text) and text[pos] in " \t":
            pos += 1
        if pos < len(text) and text[pos] in "\"'":
            part, pos = scan_string(text, pos)
        else:
            match = _BARE_KEY.match(text, pos)
            if not match:
                raise ValueError_(f"invalid key {text!r}")
            part, pos = match.group(), match.end()
        parts.append(part)
        while pos < len(text) and text[pos] in " \t":
            pos += 1
        if pos >= len(text):
            return parts
        if text[pos] != ".":
            raise ValueError_(f"invalid key {text!r}")
        pos += 1


def assign(table, key, value):
    """Set table[k1][k2]...[kn] = value, creating tables; redefining a key is an error."""
    for part in key[:-1]:
        table = table.setdefault(part, {})
        if not isinstance(table, dict):
            raise ValueError_(f"key {part!r} is not a table")
    if key[-1] in table:
        raise ValueError_(f"duplicate key {'.'.join(key)!r}")
    table[key[-1]] = value


def _open_table(root, key):
    table = root
    for part in key:
        table = table.setdefault(part, {})
        if not isinstance(table, dict):
            raise ValueError_(f"{'.'.join(key)!r} is not a table")
    return table


def _value_text(lines, index, first):
    """Join continuation lines while an array or inline table is still open."""
    text = first
    depth = _depth(first)
    while depth > 0 and index + 1 < len(lines):
        index += 1
        more = strip_comment(lines[index])
        text += "\n" + more
        depth += _depth(more)
    return text, index


def _depth(text):
    depth = 0
    quote = None
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
    return depth


def loads(text):
    """Parse a TOML document into a dict."""
    root = {}
    current = root
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        lineno = index + 1
        line = strip_comment(lines[index]).strip()
        try:
            if not line:
                pass
            elif line.startswith("["):
                if not line.endswith("]") or line.startswith("[["):
                    raise ValueError_("bad table header")
                current = _open_table(root, split_key(line[1:-1]))
            else:
                if "=" not in line:
                    raise ValueError_("expected 'key = value'")
                key_text, _, rest = line.partition("=")
                value_text, index = _value_text(lines, index, rest)
                value, end = scan_value(value_text, 0)
                if value_text[end:].strip():
                    raise ValueError_(f"unexpected text after value: {value_text[end:].strip()!r}")
                assign(current, split_key(key_text), value)
        except ValueError_ as exc:
            raise TomlError(str(exc), lineno) from None
        index += 1
    return root


def load(fp):
    """Parse a TOML document from a text file object."""
    return loads(fp.read())
