"""Catalogue generation, goals, search ranking and WebShop scoring."""

from envhub.envs.web import build_catalog, make_goal, score_purchase
from envhub.envs.web.scoring import type_factor
from envhub.envs.web.search import PAGE_SIZE, search_index


def test_catalog_is_large_varied_and_seeded():
    catalog = build_catalog(0, 1200)
    assert len(catalog) == 1200 and len(catalog.by_asin) == 1200
    assert len({p.category for p in catalog.products}) >= 6
    assert len({p.product_type for p in catalog.products}) >= 20
    for product in catalog.products[:50]:
        assert product.attributes and product.options and product.description and product.price > 0
        assert all(len(values) >= 2 for values in product.options.values())
    assert any("size" in p.options for p in catalog.products) and any("color" in p.options for p in catalog.products)
    other = build_catalog(1, 1200)
    assert [p.asin for p in other.products] != [p.asin for p in catalog.products]
    assert build_catalog.__wrapped__(0, 1200).products == catalog.products  # same seed, same shop


def test_goal_describes_its_target_and_the_target_scores_one():
    catalog = build_catalog()
    for seed in range(30):
        goal = make_goal(catalog, seed)
        product = catalog.by_asin[goal.target_asin]
        assert goal.product_type in goal.instruction
        assert all(value in goal.instruction for value in goal.options.values())
        assert f"{goal.price_bound:g}" in goal.instruction and product.price <= goal.price_bound
        assert set(goal.attributes) <= set(product.attributes)
        assert score_purchase(goal, product, goal.options).reward == 1.0
    assert make_goal(catalog, 7) == make_goal(catalog, 7) and make_goal(catalog, 7) != make_goal(catalog, 8)


def test_score_follows_the_webshop_formula():
    catalog = build_catalog()
    goal = make_goal(catalog, 0)
    target = catalog.by_asin[goal.target_asin]
    # One option wrong: (|att| + (|opt| - 1) + 1) / (|att| + |opt| + 1).
    dim, value = next(iter(goal.options.items()))
    wrong = next(v for v in target.options[dim] if v != value)
    score = score_purchase(goal, target, {**goal.options, dim: wrong})
    total = len(goal.attributes) + len(goal.options) + 1
    assert score.reward == round((total - 1) / total, 6) and score.option_hits == len(goal.options) - 1
    # Same category, other type: halved; another category with nothing in common: zero.
    sibling = next(p for p in catalog.products if p.category == goal.category and p.product_type != goal.product_type)
    assert type_factor(goal, sibling) == 0.5 and score_purchase(goal, sibling, {}).reward <= 0.5
    stranger = next(p for p in catalog.products if p.category != goal.category and type_factor(goal, p) == 0)
    assert score_purchase(goal, stranger, {}).reward == 0.0


def test_search_ranks_by_relevance_and_paginates():
    catalog = build_catalog()
    index = search_index(catalog)
    hits = 0
    for product in catalog.products[:100]:
        hits += index.search(product.title).products[0] is product
    assert hits >= 90  # a product's own title finds it first almost always (duplicates tie)
    first, second = index.search("red cotton t-shirt for men", 1), index.search("red cotton t-shirt for men", 2)
    assert len(first.products) == PAGE_SIZE and first.pages == 5 and first.total == 50
    assert not {p.asin for p in first.products} & {p.asin for p in second.products}
    assert all(p.product_type == "t-shirt" for p in first.products)
    assert index.search("red cotton t-shirt for men", 99).page == first.pages  # clamped
    assert index.search("zzzzqqq").total == 0
