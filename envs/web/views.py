"""The shop's HTML pages: home with search, result lists, product pages with options, purchase summary.

Every clickable element is a real link or form button; `aria-label` gives an element the accessible
name an agent clicks (for options, "size: M") when its visible text alone would be ambiguous.
"""

from __future__ import annotations

from html import escape
from urllib.parse import urlencode

from envhub.envs.web.catalog import Goal, Product
from envhub.envs.web.scoring import Score
from envhub.envs.web.search import Page

_STYLE = """
body{font-family:DejaVu Sans,Arial,sans-serif;margin:0;background:#f3f3f3;color:#111}
header{background:#232f3e;color:#fff;padding:14px 24px;font-size:22px;font-weight:bold}
header span{color:#febd69}
.instruction{background:#fff8e1;border-bottom:1px solid #e0c870;padding:10px 24px;font-size:15px}
main{padding:18px 24px}
.card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:12px 16px;margin-bottom:10px}
a{color:#0066c0;text-decoration:none}
.price{color:#b12704;font-weight:bold;font-size:18px}
.nav a{margin-right:16px}
.options a{display:inline-block;border:1px solid #999;border-radius:4px;padding:3px 10px;margin:3px;color:#111}
.options a.selected{border:2px solid #e77600;background:#fdf0d5;font-weight:bold}
button{background:#ffd814;border:1px solid #fcd200;border-radius:18px;padding:8px 22px;font-size:15px;cursor:pointer}
input[type=text]{font-size:16px;padding:8px;width:480px;border:1px solid #888;border-radius:4px}
.score{font-size:20px}
"""


def _layout(title: str, goal: Goal | None, body: str) -> str:
    instruction = f'<div class="instruction">Instruction: {escape(goal.instruction)}</div>' if goal else ""
    return (
        f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{escape(title)}</title>"
        f"<style>{_STYLE}</style></head><body><header>Web<span>Shop</span></header>{instruction}"
        f"<main>{body}</main></body></html>"
    )


def _stars(rating: int) -> str:
    return "★" * rating + "☆" * (5 - rating)


def home_page(sid: str, goal: Goal | None) -> str:
    """The start page: a search box."""
    body = (
        f'<form class="card" action="/s/{sid}/search" method="get">'
        '<input type="text" name="q" placeholder="What are you shopping for?" aria-label="search query"> '
        "<button type=\"submit\">Search</button></form>"
        "<p>Search our catalogue of clothing, shoes, electronics, home goods, beauty products and groceries.</p>"
    )
    return _layout("WebShop", goal, body)


def results_page(sid: str, goal: Goal | None, page: Page) -> str:
    """One page of search results with paging links."""
    base = f"/s/{sid}/search?"
    nav = [f'<a href="/s/{sid}/">Back to Search</a>']
    if page.page > 1:
        nav.append(f'<a href="{base}{escape(urlencode({"q": page.query, "page": page.page - 1}))}">&lt; Prev</a>')
    if page.page < page.pages:
        nav.append(f'<a href="{base}{escape(urlencode({"q": page.query, "page": page.page + 1}))}">Next &gt;</a>')
    items = []
    for product in page.products:
        href = f"/s/{sid}/item/{product.asin}?" + urlencode({"q": page.query, "page": page.page})
        items.append(
            f'<div class="card"><a href="{escape(href)}">{product.asin}</a>'
            f"<div>{escape(product.title)}</div><div class=\"price\">${product.price:.2f}</div></div>"
        )
    if not items:
        items.append('<div class="card">No products matched your search. Try other words.</div>')
    summary = (
        f"<p>Page {page.page} of {page.pages} (total results: {page.total}) for &quot;{escape(page.query)}&quot;</p>"
    )
    body = f'<div class="nav">{"".join(nav)}</div>{summary}{"".join(items)}'
    return _layout(f"Results for {page.query}", goal, body)


def product_page(sid: str, goal: Goal | None, product: Product, query: str, page: int, selected: dict[str, str]) -> str:
    """A product with its options (links that select one value each) and a Buy Now form."""
    back = f"/s/{sid}/search?" + urlencode({"q": query, "page": page})
    nav = f'<div class="nav"><a href="/s/{sid}/">Back to Search</a><a href="{escape(back)}">&lt; Prev</a></div>'
    option_rows = []
    for dim, values in product.options.items():
        links = []
        for value in values:
            params = {"q": query, "page": page, **{f"opt.{d}": v for d, v in selected.items()}, f"opt.{dim}": value}
            href = f"/s/{sid}/item/{product.asin}?" + urlencode(params)
            css = ' class="selected"' if selected.get(dim) == value else ""
            label = escape(f"{dim}: {value}")
            links.append(f'<a href="{escape(href)}"{css} aria-label="{label}">{escape(value)}</a>')
        # Each link's accessible name already says "size: M", so the row's visible label is hidden from readers.
        option_rows.append(f'<div><span aria-hidden="true">{escape(dim)}: </span>{" ".join(links)}</div>')
    hidden = "".join(
        f'<input type="hidden" name="{escape(name)}" value="{escape(str(value))}">'
        for name, value in {
            "asin": product.asin,
            "q": query,
            "page": page,
            **{f"opt.{d}": v for d, v in selected.items()},
        }.items()
    )
    body = (
        f'{nav}<div class="card"><h2>{escape(product.title)}</h2>'
        f'<div class="price">Price: ${product.price:.2f}</div><div>Rating: {_stars(product.rating)}</div>'
        f'<div class="options">{"".join(option_rows)}</div>'
        f"<p>{escape(product.description)}</p>"
        f'<form action="/s/{sid}/buy" method="post">{hidden}<button type="submit">Buy Now</button></form></div>'
    )
    return _layout(product.title, goal, body)


def done_page(goal: Goal | None, product: Product, selected: dict[str, str], score: Score) -> str:
    """The purchase summary with its score."""
    options = ", ".join(f"{d}: {v}" for d, v in selected.items()) or "none"
    body = (
        f'<div class="card"><h2>Thank you for shopping with us!</h2>'
        f"<p>You bought: {escape(product.title)} ({product.asin}) for ${product.price:.2f}</p>"
        f"<p>Options: {escape(options)}</p>"
        f'<p class="score" id="score" data-reward="{score.reward}">Your score (min 0.0, max 1.0): '
        f'{score.reward:.2f}</p>'
        '<p><a href="/">Start a new shopping session</a></p></div>'
    )
    return _layout("Purchase complete", goal, body)


def error_page(message: str) -> str:
    """A readable error page (unknown session, product, bad request)."""
    return _layout(
        "Not found", None, f'<div class="card"><p>{escape(message)}</p><p><a href="/">Start over</a></p></div>'
    )
