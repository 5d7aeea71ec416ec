"""The diff itself: a longest-common-subsequence alignment of two lists of lines."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Op:
    """One line of a diff: tag is ' ' (same), '-' (only in a) or '+' (only in b)."""

    tag: str
    line: str
    a_index: int  # index in a of this line, or of the next a line for '+'
    b_index: int  # index in b of this line, or of the next b line for '-'


def _normalise(line, ignore_whitespace):
    return " ".join(line.split()) if ignore_whitespace else line


def diff_lines(a, b, ignore_whitespace=False):
    """Align two lists of lines; returns Ops in order (deletions before insertions)."""
    ka = [_normalise(x, ignore_whitespace) for x in a]
    kb = [_normalise(x, ignore_whitespace) for x in b]
    n, m = len(ka), len(kb)
    # lcs[i][j] = length of the LCS of ka[i:] and kb[j:]
    lcs = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            lcs[i][j] = lcs[i + 1][j + 1] + 1 if ka[i] == kb[j] else max(lcs[i + 1][j], lcs[i][j + 1])
    ops = []
    i = j = 0
    while i < n and j < m:
        if ka[i] == kb[j]:
            ops.append(Op(" ", b[j], i, j))
            i += 1
            j += 1
        elif lcs[i + 1][j] >= lcs[i][j + 1]:
            ops.append(Op("-", a[i], i, j))
            i += 1
        else:
            ops.append(Op("+", b[j], i, j))
            j += 1
    ops.extend(Op("-", a[k], k, j) for k in range(i, n))
    ops.extend(Op("+", b[k], n, k) for k in range(j, m))
    return ops


def ratio(a, b):
    """Similarity in [0, 1]: 2 * matching lines / total lines (1.0 for two empty inputs)."""
    total = len(a) + len(b)
    if total == 0:
        return 1.0
    same = sum(1 for op in diff_lines(a, b) if op.tag == " ")
    return 2 * same / total
