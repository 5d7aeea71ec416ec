"""minidiff: line diffs and unified diff output."""

from minidiff.core import Op, diff_lines, ratio
from minidiff.unified import unified_diff

__all__ = ["Op", "diff_lines", "ratio", "unified_diff"]
