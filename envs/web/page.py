"""Served HTML to agent text: the page's words, with every clickable element marked as `[label]`.

Like a screen reader, it names an element by its `aria-label` when it has one and skips `aria-hidden` text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html.parser import HTMLParser

_BLOCK = {"div", "p", "h1", "h2", "h3", "h4", "header", "main", "form", "li", "tr", "br", "section"}
_SKIP = {"style", "script", "title", "head"}
_VOID = {"input", "br", "img", "meta", "link", "hr", "area", "base", "col", "embed", "source", "track", "wbr"}


@dataclass(frozen=True)
class Form:
    """A form on the page: where it submits, how, its hidden fields, and its text box if any."""

    action: str
    method: str
    fields: tuple[tuple[str, str], ...] = ()
    text_field: str | None = None


@dataclass(frozen=True)
class Element:
    """Something an agent can click: a link (href) or a form's submit button (form)."""

    label: str
    href: str = ""
    form: Form | None = None


def normalize_label(label: str) -> str:
    """Case- and space-insensitive form of a label, without surrounding brackets."""
    label = label.strip()
    while label.startswith("[") and label.endswith("]"):
        label = label[1:-1].strip()
    return " ".join(label.split()).casefold()


@dataclass
class ParsedPage:
    """A page as text plus its clickable elements and search form."""

    text: str
    elements: list[Element] = field(default_factory=list)
    search_form: Form | None = None

    @property
    def labels(self) -> list[str]:
        """The labels of every clickable element, in page order."""
        return [e.label for e in self.elements]

    def find(self, label: str) -> Element | None:
        """The element an agent means by `label`: exact (any case) or, for options, the value alone if unique."""
        wanted = normalize_label(label)
        exact = [e for e in self.elements if normalize_label(e.label) == wanted]
        if exact:
            return exact[0]
        by_value = [
            e for e in self.elements if ": " in e.label and normalize_label(e.label.split(": ", 1)[1]) == wanted
        ]
        return by_value[0] if len(by_value) == 1 else None


class _PageParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.elements: list[Element] = []
        self.search_form: Form | None = None
        self._skip_stack: list[str] = []  # tags whose content is not read (style, script, aria-hidden)
        self._link: dict[str, str] | None = None
        self._link_text: list[str] = []
        self._form: dict | None = None
        self._button: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attr = {k: v or "" for k, v in attrs}
        if tag not in _VOID and (self._skip_stack or tag in _SKIP or attr.get("aria-hidden") == "true"):
            self._skip_stack.append(tag)  # inside a skipped element every tag is tracked, so nesting unwinds right
            return
        if self._skip_stack:
            return
        if tag in _BLOCK:
            self.out.append("\n")
        if tag == "a" and "href" in attr:
            self._link, self._link_text = attr, []
        elif tag == "form":
            self._form = {
                "action": attr.get("action", ""),
                "method": attr.get("method", "get").lower(),
                "fields": [],
                "text": None,
            }
        elif tag == "input" and self._form is not None:
            kind = attr.get("type", "text").lower()
            if kind == "hidden":
                self._form["fields"].append((attr.get("name", ""), attr.get("value", "")))
            elif kind in ("text", "search"):
                self._form["text"] = attr.get("name", "q")
            elif kind == "submit":
                self._add_button(attr.get("value", "Submit"))
        elif tag == "button":
            self._button = []

    def handle_endtag(self, tag: str) -> None:
        if self._skip_stack and tag == self._skip_stack[-1]:
            self._skip_stack.pop()
        elif tag == "a" and self._link is not None:
            text = " ".join("".join(self._link_text).split())
            label = self._link.get("aria-label") or text
            if label:
                self.elements.append(Element(label, href=self._link["href"]))
                selected = " (selected)" if "selected" in self._link.get("class", "").split() else ""
                self.out.append(f" [{label}]{selected} ")
            self._link = None
        elif tag == "button" and self._button is not None:
            self._add_button(" ".join("".join(self._button).split()) or "Submit")
            self._button = None
        elif tag == "form" and self._form is not None:
            self._form = None
        if tag in _BLOCK:
            self.out.append("\n")

    def _add_button(self, label: str) -> None:
        form = self._current_form()
        if form is not None and form.text_field is not None and self.search_form is None:
            self.search_form = form
        self.elements.append(Element(label, form=form))
        self.out.append(f" [{label}] ")

    def _current_form(self) -> Form | None:
        if self._form is None:
            return None
        f = self._form
        return Form(f["action"], f["method"], tuple(f["fields"]), f["text"])

    def handle_data(self, data: str) -> None:
        if self._skip_stack:
            return
        data = re.sub(r"\s+", " ", data)  # HTML whitespace is one space; lines come from block elements
        if self._button is not None:
            self._button.append(data)
        elif self._link is not None:
            self._link_text.append(data)
        else:
            self.out.append(data)


def parse_page(html: str) -> ParsedPage:
    """Parse served HTML into text with `[clickable]` marks, its elements and its search form."""
    parser = _PageParser()
    parser.feed(html)
    parser.close()
    lines = (re.sub(r"[ \t\r\f\v]+", " ", line).strip() for line in "".join(parser.out).split("\n"))
    return ParsedPage("\n".join(line for line in lines if line), parser.elements, parser.search_form)
