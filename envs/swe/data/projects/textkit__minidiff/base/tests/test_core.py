from minidiff import Op, diff_lines, ratio


def test_identical():
    assert [op.tag for op in diff_lines(["a", "b"], ["a", "b"])] == [" ", " "]


def test_insert_and_delete():
    ops = diff_lines(["a", "b", "c"], ["a", "c", "d"])
    assert [(op.tag, op.line) for op in ops] == [(" ", "a"), ("-", "b"), (" ", "c"), ("+", "d")]


def test_replacement_deletes_before_inserting():
    ops = diff_lines(["x"], ["y"])
    assert [(op.tag, op.line) for op in ops] == [("-", "x"), ("+", "y")]


def test_indices():
    ops = diff_lines(["a", "b"], ["b"])
    assert ops[0] == Op("-", "a", 0, 0)
    assert ops[1] == Op(" ", "b", 1, 0)


def test_empty_inputs():
    assert diff_lines([], []) == []
    assert [op.tag for op in diff_lines([], ["a"])] == ["+"]


def test_ignore_whitespace_at_ends():
    ops = diff_lines(["  a  "], ["a"], ignore_whitespace=True)
    assert [op.tag for op in ops] == [" "]


def test_ratio():
    assert ratio(["a", "b"], ["a", "b"]) == 1.0
    assert ratio(["a", "b"], ["a", "c"]) == 0.5
    assert ratio(["a"], ["b"]) == 0.0
