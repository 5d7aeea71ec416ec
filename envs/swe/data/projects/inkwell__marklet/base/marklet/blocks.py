"""Block-level Markdown: split a document into blocks and render each one."""

import re

from marklet.inline import escape, render_inline

_HEADING = re.compile(r"(#{1,6})\s+(.*?)\s*#*\s*$")
_RULE = re.compile(r"(?:-\s*){3,}|(?:\*\s*){3,}")
_BULLET = re.compile(r"[-*+]\s+(.*)")
_ORDERED = re.compile(r"(\d+)[.)]\s+(.*)")
_FENCE = re.compile(r"(```|~~~)\s*([\w+-]*)\s*$")


def render(text):
    """Render a Markdown document to HTML, one block per line of output."""
    lines = text.replace("\r\n", "\n").split("\n")
    out = []
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = _FENCE.match(line)
        if fence:
            i = _code_block(lines, i, fence, out)
            continue
        if not line.strip():
            i += 1
            continue
        heading = _HEADING.match(line)
        if heading:
            level = len(heading.group(1))
            out.append(f"<h{level}>{render_inline(heading.group(2))}</h{level}>")
            i += 1
        elif _RULE.fullmatch(line.strip()):
            out.append("<hr>")
            i += 1
        elif line.startswith(">"):
            quoted = []
            while i < len(lines) and lines[i].startswith(">"):
                quoted.append(lines[i][1:].removeprefix(" "))
                i += 1
            out.append(f"<blockquote>\n{render(chr(10).join(quoted))}\n</blockquote>")
        elif _BULLET.match(line) or _ORDERED.match(line):
            i = _list(lines, i, out)
        else:
            para = []
            while i < len(lines) and lines[i].strip() and not _starts_block(lines[i]):
                para.append(lines[i].strip())
                i += 1
            out.append(f"<p>{render_inline(' '.join(para))}</p>")
    return "\n".join(out)


def _starts_block(line):
    return bool(_HEADING.match(line) or _FENCE.match(line) or line.startswith(">") or _BULLET.match(line)
                or _ORDERED.match(line) or _RULE.fullmatch(line.strip()))


def _code_block(lines, i, fence, out):
    marker, language = fence.group(1), fence.group(2)
    body = []
    i += 1
    while i < len(lines) and not lines[i].startswith(marker):
        body.append(lines[i])
        i += 1
    attr = f' class="language-{language}"' if language else ""
    code = escape("\n".join(body))
    out.append(f"<pre><code{attr}>{code}\n</code></pre>" if body else f"<pre><code{attr}></code></pre>")
    return i + 1


def _list(lines, i, out):
    ordered = bool(_ORDERED.match(lines[i]))
    pattern = _ORDERED if ordered else _BULLET
    items = []
    start = int(_ORDERED.match(lines[i]).group(1)) if ordered else 1
    while i < len(lines) and pattern.match(lines[i]):
        match = pattern.match(lines[i])
        items.append(match.group(match.lastindex))
        i += 1
        while i < len(lines) and lines[i].startswith("  ") and lines[i].strip():
            items[-1] += " " + lines[i].strip()
            i += 1
    tag = "ol" if ordered else "ul"
    open_tag = f'<ol start="{start}">' if ordered and start != 1 else f"<{tag}>"
    body = "\n".join(f"<li>{render_inline(item)}</li>" for item in items)
    out.append(f"{open_tag}\n{body}\n</{tag}>")
    return i
