from marklet import render


def test_headings():
    assert render("# Title") == "<h1>Title</h1>"
    assert render("### Third ###") == "<h3>Third</h3>"


def test_paragraphs_join_lines():
    assert render("one\ntwo\n\nthree") == "<p>one two</p>\n<p>three</p>"


def test_horizontal_rule():
    assert render("above\n\n---\n\nbelow") == "<p>above</p>\n<hr>\n<p>below</p>"


def test_bullet_list():
    assert render("- a\n- b") == "<ul>\n<li>a</li>\n<li>b</li>\n</ul>"


def test_list_item_continuation():
    assert render("* first\n  line\n* second") == "<ul>\n<li>first line</li>\n<li>second</li>\n</ul>"


def test_ordered_list():
    assert render("1. one\n2. two") == "<ol>\n<li>one</li>\n<li>two</li>\n</ol>"


def test_ordered_list_start():
    assert render("3. three\n4. four") == '<ol start="3">\n<li>three</li>\n<li>four</li>\n</ol>'


def test_blockquote():
    assert render("> quoted *text*\n> more") == "<blockquote>\n<p>quoted <em>text</em> more</p>\n</blockquote>"


def test_fenced_code():
    assert render("```python\nx = 1 < 2\n```") == '<pre><code class="language-python">x = 1 &lt; 2\n</code></pre>'


def test_paragraph_then_list():
    assert render("intro\n- item") == "<p>intro</p>\n<ul>\n<li>item</li>\n</ul>"
