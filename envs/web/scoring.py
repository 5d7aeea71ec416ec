"""WebShop's reward for a purchase: attribute, option and price match, scaled by product-type match.

    r = (|U_att ∩ Y_att| + |U_opt ∩ Y_opt| + 1[y_price <= u_price]) / (|U_att| + |U_opt| + 1) * r_type

U is the goal (instruction), Y the purchase: Y_att are the bought product's attributes, Y_opt the
options selected on its page. r_type is 1 for the goal's product type, 0.5 for another type of the
same category, 0.1 for another category whose title shares a word with the goal's type, and 0 else.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from envhub.envs.web.catalog import Goal, Product


@dataclass(frozen=True)
class Score:
    """The reward of one purchase and the terms that made it."""

    reward: float
    attribute_hits: int
    attribute_total: int
    option_hits: int
    option_total: int
    price_ok: bool
    type_factor: float

    def as_dict(self) -> dict[str, float | int | bool]:
        """The score as a JSON-friendly dict."""
        return asdict(self)


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def type_factor(goal: Goal, product: Product) -> float:
    """How well the bought product's type matches the goal's: 1, 0.5, 0.1 or 0."""
    if product.product_type == goal.product_type:
        return 1.0
    if product.category == goal.category:
        return 0.5
    if _words(goal.product_type) & _words(product.title):
        return 0.1
    return 0.0


def score_purchase(goal: Goal, product: Product, selected: dict[str, str]) -> Score:
    """Score buying `product` with `selected` options against `goal`."""
    chosen = {dim.lower(): value.lower() for dim, value in selected.items()}
    attribute_hits = sum(1 for a in goal.attributes if a in product.attributes)
    option_hits = sum(1 for dim, value in goal.options.items() if chosen.get(dim.lower()) == value.lower())
    price_ok = product.price <= goal.price_bound
    factor = type_factor(goal, product)
    total = len(goal.attributes) + len(goal.options) + 1
    reward = (attribute_hits + option_hits + int(price_ok)) / total * factor
    return Score(
        round(reward, 6), attribute_hits, len(goal.attributes), option_hits, len(goal.options), price_ok, factor
    )
