from marklet import escape, render_inline


def test_plain_text_is_unchanged():
    assert render_inline("hello world") == "hello world"


def test_escape_angle_brackets():
    assert escape("<b>") == "&lt;b&gt;"
    assert render_inline("1 < 2") == "1 &lt; 2"


def test_emphasis_and_strong():
    assert render_inline("an *important* word") == "an <em>important</em> word"
    assert render_inline("a **bold** move") == "a <strong>bold</strong> move"
    assert render_inline("_under_ and __score__") == "<em>under</em> and <strong>score</strong>"


def test_lone_asterisk_is_literal():
    assert render_inline("2 * 3 = 6") == "2 * 3 = 6"


def test_code_span_escapes_html():
    assert render_inline("use `<div>` here") == "use <code>&lt;div&gt;</code> here"


def test_double_backtick_code_span():
    assert render_inline("``a ` b``") == "<code>a ` b</code>"


def test_link():
    assert render_inline("see [the docs](https://example.com/docs)") == 'see <a href="https://example.com/docs">the docs</a>'


def test_link_with_title_and_emphasis():
    assert render_inline('[*x*](/x "Ex")') == '<a href="/x" title="Ex"><em>x</em></a>'
