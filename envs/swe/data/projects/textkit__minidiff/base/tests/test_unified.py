from minidiff import unified_diff


def test_equal_texts_give_empty_diff():
    assert unified_diff("a\nb\n", "a\nb\n") == ""


def test_simple_change():
    expected = "--- old\n+++ new\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n"
    assert unified_diff("a\nb\nc\n", "a\nB\nc\n", "old", "new") == expected


def test_context_is_limited():
    a = "".join(f"{i}\n" for i in range(20))
    b = a.replace("10\n", "ten\n")
    diff = unified_diff(a, b, context=2)
    assert "@@ -9,5 +9,5 @@\n 8\n 9\n-10\n+ten\n 11\n 12\n" in diff


def test_far_apart_changes_make_two_hunks():
    a = "".join(f"{i}\n" for i in range(30))
    b = a.replace("2\n", "two\n", 1).replace("25\n", "twenty-five\n")
    diff = unified_diff(a, b, context=3)
    assert diff.count("@@ -") == 2


def test_single_line_ranges_omit_the_count():
    assert "@@ -1 +1 @@\n-a\n+b\n" in unified_diff("a\n", "b\n")


def test_accepts_lists_of_lines():
    assert "+y\n" in unified_diff(["x\n"], ["x\n", "y\n"])


def test_missing_newline_marker():
    diff = unified_diff("a\nb", "a\nc")
    assert diff.endswith("-b\n\\ No newline at end of file\n+c\n\\ No newline at end of file\n")
