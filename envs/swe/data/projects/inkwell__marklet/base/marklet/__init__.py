"""marklet: render a practical subset of Markdown to HTML."""

from marklet.blocks import render
from marklet.inline import escape, render_inline

__all__ = ["escape", "render", "render_inline"]
