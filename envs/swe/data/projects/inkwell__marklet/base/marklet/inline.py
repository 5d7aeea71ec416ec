"""Inline Markdown: code spans, links, strong, emphasis and HTML escaping."""

import re

_CODE = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)(?:\s+\"([^\"]*)\")?\)")
_STRONG = re.compile(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1")
_EM = re.compile(r"\*(?=\S)(.+?)(?<=\S)\*|(?<!\w)_(?=\S)(.+?)(?<=\S)_(?!\w)")
_PLACEHOLDER = "\x00{}\x00"


def escape(text, quote=False):
    """Escape &, < and > (and double quotes when `quote`) for HTML."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    if quote:
        text = text.replace('"', "&quot;")
    return text


def render_inline(text):
    """Render the inline markup of one block of text to HTML."""
    saved = []

    def stash(html):
        saved.append(html)
        return _PLACEHOLDER.format(len(saved) - 1)

    text = _CODE.sub(lambda m: stash(f"<code>{escape(m.group(2).strip())}</code>"), text)
    text = _LINK.sub(lambda m: stash(_link(m.group(1), m.group(2), m.group(3))), text)
    text = escape(text)
    text = _STRONG.sub(r"<strong>\2</strong>", text)
    text = _EM.sub(lambda m: f"<em>{m.group(1) or m.group(2)}</em>", text)
    return re.sub("\x00(\\d+)\x00", lambda m: saved[int(m.group(1))], text)


def _link(label, url, title):
    attrs = f' href="{escape(url, quote=True)}"'
    if title:
        attrs += f' title="{escape(title, quote=True)}"'
    return f"<a{attrs}>{render_inline(label)}</a>"
