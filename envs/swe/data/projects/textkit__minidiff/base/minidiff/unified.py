"""GNU-style unified diff output."""

import re

from minidiff.core import diff_lines

NO_NEWLINE = "\\ No newline at end of file\n"


def _split(text):
    # Only "\n" ends a line: str.splitlines would also split on form feeds and other separators.
    return re.findall(r"[^\n]*\n|[^\n]+\Z", text) if isinstance(text, str) else list(text)


def _hunks(ops, context):
    """Group ops into hunks: runs of changes with up to `context` unchanged lines around them."""
    changes = [k for k, op in enumerate(ops) if op.tag != " "]
    if not changes:
        return []
    hunks = []
    start, end = changes[0], changes[0]
    for k in changes[1:]:
        if k - end - 1 > 2 * context:
            hunks.append((start, end))
            start = k
        end = k
    hunks.append((start, end))
    return [(max(0, s - context), min(len(ops), e + context + 1)) for s, e in hunks]


def _range(start, count):
    if count == 1:
        return str(start + 1)
    if count == 0:
        return f"{start},0"
    return f"{start + 1},{count}"


def _line(tag, line):
    if line.endswith("\n"):
        return tag + line
    return tag + line + "\n" + NO_NEWLINE


def unified_diff(a, b, fromfile="a", tofile="b", context=3, ignore_whitespace=False):
    """A unified diff of two texts (or lists of lines); '' when they are equal."""
    a_lines, b_lines = _split(a), _split(b)
    ops = diff_lines(a_lines, b_lines, ignore_whitespace=ignore_whitespace)
    hunks = _hunks(ops, context)
    if not hunks:
        return ""
    out = [f"--- {fromfile}\n", f"+++ {tofile}\n"]
    for lo, hi in hunks:
        chunk = ops[lo:hi]
        a_count = sum(1 for op in chunk if op.tag != "+")
        b_count = sum(1 for op in chunk if op.tag != "-")
        a_start = chunk[0].a_index
        b_start = chunk[0].b_index
        out.append(f"@@ -{_range(a_start, a_count)} +{_range(b_start, b_count)} @@\n")
        out.extend(_line(op.tag, op.line) for op in chunk)
    return "".join(out)
