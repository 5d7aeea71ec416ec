"""Served HTML to agent text: marks, forms, and how a click label finds its element."""

from envhub.envs.web.page import parse_page

HTML = """<html><head><title>T</title><style>a{color:red}</style></head><body>
<header>Shop<span aria-hidden="true"><span>x</span><a href="/hidden">icon</a><br></span></header><div>Hello   <b>there</b></div>
<a href="/next">Next &gt;</a>
<div><span aria-hidden="true">color: </span><a href="/c1" aria-label="color: black" class="selected">black</a>
<a href="/c2" aria-label="color: red">red</a></div>
<div>trim: <a href="/t1" aria-label="trim: black">black</a> <a href="/t2" aria-label="trim: gold">gold</a></div>
<form action="/s" method="get"><input type="text" name="q"><button>Search</button></form>
<form action="/buy" method="post"><input type="hidden" name="asin" value="B0X"><button type="submit">Buy Now</button></form>
</body></html>"""


def test_text_marks_every_clickable_element():
    page = parse_page(HTML)
    assert page.text.splitlines()[:2] == ["Shop", "Hello there"]
    assert "[Next >]" in page.text and "[color: black] (selected)" in page.text and "a{color" not in page.text
    assert "\n[color: black] (selected) [color: red]\n" in page.text  # the aria-hidden row label is not read
    assert page.labels == ["Next >", "color: black", "color: red", "trim: black", "trim: gold", "Search", "Buy Now"]
    assert page.search_form.action == "/s" and page.search_form.text_field == "q"
    buy = page.find("buy now").form
    assert (buy.action, buy.method, buy.fields) == ("/buy", "post", (("asin", "B0X"),))


def test_find_is_forgiving_but_never_guesses():
    page = parse_page(HTML)
    assert page.find("[Next >]").href == "/next" and page.find("  next  > ").href == "/next"
    assert page.find("gold").href == "/t2"  # a value alone, when only one option has it
    assert page.find("black") is None  # colour or trim? ambiguous
    assert page.find("Color: Black").href == "/c1"
    assert page.find("nothing") is None and page.find("") is None
