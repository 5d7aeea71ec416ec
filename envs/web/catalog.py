"""The shop's catalogue and shopping goals, generated from seeds.

`build_catalog(seed, n_products)` makes products over several categories (each with a product
type, attributes, options such as size and colour, a price and a description);
`make_goal(catalog, seed)` picks a target product and writes the instruction a shopper would give.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from functools import lru_cache

# category -> product type -> (attribute pool, option dimensions and values, price range)
_TYPES: dict[str, dict[str, tuple[list[str], dict[str, list[str]], tuple[float, float]]]] = {
    "clothing": {
        "t-shirt": (
            [
                "cotton",
                "organic cotton",
                "slim fit",
                "relaxed fit",
                "short sleeve",
                "long sleeve",
                "crew neck",
                "v-neck",
                "moisture wicking",
                "machine washable",
                "for men",
                "for women",
            ],
            {"color": ["black", "white", "red", "navy", "grey", "green"], "size": ["XS", "S", "M", "L", "XL", "XXL"]},
            (8, 35),
        ),
        "hoodie": (
            [
                "fleece",
                "cotton",
                "zip up",
                "pullover",
                "with pockets",
                "oversized",
                "machine washable",
                "for men",
                "for women",
            ],
            {"color": ["black", "grey", "navy", "burgundy", "olive", "pink"], "size": ["S", "M", "L", "XL", "XXL"]},
            (20, 70),
        ),
        "jeans": (
            [
                "slim fit",
                "straight leg",
                "high waist",
                "stretch",
                "distressed",
                "bootcut",
                "with pockets",
                "for men",
                "for women",
            ],
            {"color": ["blue", "black", "light blue", "grey"], "size": ["28W", "30W", "32W", "34W", "36W", "38W"]},
            (25, 90),
        ),
        "socks": (
            ["cotton", "wool", "ankle", "crew", "cushioned", "moisture wicking", "for men", "for women"],
            {"color": ["white", "black", "grey", "multicolor"], "size": ["S", "M", "L"]},
            (5, 25),
        ),
    },
    "shoes": {
        "running shoes": (
            ["lightweight", "breathable", "non slip", "memory foam", "wide width", "mesh", "for men", "for women"],
            {"color": ["black", "white", "blue", "red", "grey"], "size": ["6", "7", "8", "9", "10", "11", "12"]},
            (35, 140),
        ),
        "boots": (
            ["leather", "waterproof", "ankle", "insulated", "lace up", "non slip", "for men", "for women"],
            {"color": ["brown", "black", "tan"], "size": ["6", "7", "8", "9", "10", "11", "12"]},
            (50, 180),
        ),
        "sandals": (
            ["leather", "adjustable strap", "arch support", "waterproof", "lightweight", "for men", "for women"],
            {"color": ["brown", "black", "beige", "navy"], "size": ["6", "7", "8", "9", "10", "11"]},
            (15, 60),
        ),
        "slippers": (
            ["memory foam", "fleece lined", "non slip", "machine washable", "open toe", "for men", "for women"],
            {"color": ["grey", "pink", "navy", "brown"], "size": ["S", "M", "L", "XL"]},
            (10, 40),
        ),
    },
    "electronics": {
        "wireless headphones": (
            [
                "noise cancelling",
                "over ear",
                "bluetooth",
                "foldable",
                "long battery life",
                "with microphone",
                "lightweight",
            ],
            {"color": ["black", "white", "silver", "blue"]},
            (25, 250),
        ),
        "phone case": (
            ["shockproof", "slim", "clear", "silicone", "with card holder", "magnetic", "wireless charging compatible"],
            {
                "color": ["black", "clear", "red", "blue", "pink"],
                "model": ["iphone 14", "iphone 15", "galaxy s23", "pixel 8"],
            },
            (8, 40),
        ),
        "usb c charger": (
            ["fast charging", "compact", "foldable plug", "dual port", "gan", "with cable"],
            {"power": ["20W", "30W", "45W", "65W", "100W"], "color": ["white", "black"]},
            (12, 60),
        ),
        "bluetooth speaker": (
            ["waterproof", "portable", "long battery life", "bass boost", "with microphone", "outdoor"],
            {"color": ["black", "blue", "red", "green", "grey"]},
            (20, 150),
        ),
    },
    "home and kitchen": {
        "coffee mug": (
            ["ceramic", "dishwasher safe", "microwave safe", "insulated", "stainless steel", "with lid"],
            {"color": ["white", "black", "blue", "green", "red"], "size": ["11 oz", "15 oz", "20 oz"]},
            (8, 30),
        ),
        "throw pillow": (
            ["velvet", "linen", "decorative", "with insert", "machine washable", "square"],
            {
                "color": ["beige", "grey", "navy", "mustard", "green"],
                "size": ["16x16 inch", "18x18 inch", "20x20 inch"],
            },
            (10, 45),
        ),
        "blanket": (
            ["fleece", "weighted", "cotton", "machine washable", "lightweight", "sherpa"],
            {"color": ["grey", "cream", "navy", "blush"], "size": ["twin", "full", "queen", "king"]},
            (20, 90),
        ),
        "desk lamp": (
            ["led", "dimmable", "adjustable arm", "usb charging port", "touch control", "eye caring"],
            {"color": ["black", "white", "silver"]},
            (15, 70),
        ),
    },
    "beauty": {
        "shampoo": (
            ["sulfate free", "paraben free", "for dry hair", "for curly hair", "natural", "vegan", "moisturizing"],
            {"scent": ["lavender", "coconut", "citrus", "unscented"], "size": ["8 fl oz", "12 fl oz", "16 fl oz"]},
            (6, 30),
        ),
        "face moisturizer": (
            [
                "hyaluronic acid",
                "fragrance free",
                "for sensitive skin",
                "oil free",
                "with spf",
                "vegan",
                "non comedogenic",
            ],
            {"size": ["1.7 fl oz", "2.5 fl oz", "3.4 fl oz"]},
            (10, 60),
        ),
        "lipstick": (
            ["matte", "long lasting", "moisturizing", "cruelty free", "vegan", "waterproof"],
            {"color": ["red", "nude", "pink", "berry", "coral"]},
            (5, 35),
        ),
        "body lotion": (
            ["shea butter", "fast absorbing", "for dry skin", "paraben free", "natural", "non greasy"],
            {"scent": ["vanilla", "lavender", "coconut", "cucumber"], "size": ["8 fl oz", "16 fl oz", "32 fl oz"]},
            (5, 25),
        ),
    },
    "grocery": {
        "ground coffee": (
            ["organic", "fair trade", "dark roast", "medium roast", "decaf", "whole bean", "low acid"],
            {"flavor": ["original", "vanilla", "hazelnut", "mocha"], "size": ["12 oz", "24 oz", "32 oz"]},
            (8, 40),
        ),
        "green tea": (
            ["organic", "caffeine free", "loose leaf", "individually wrapped", "non gmo", "unsweetened"],
            {"flavor": ["jasmine", "mint", "lemon", "matcha"], "count": ["20 count", "50 count", "100 count"]},
            (5, 25),
        ),
        "protein bar": (
            ["gluten free", "low sugar", "high protein", "keto friendly", "vegan", "non gmo"],
            {
                "flavor": ["chocolate", "peanut butter", "vanilla", "berry"],
                "count": ["6 count", "12 count", "24 count"],
            },
            (10, 45),
        ),
        "trail mix": (
            ["gluten free", "non gmo", "no added sugar", "resealable bag", "individually wrapped", "organic"],
            {"flavor": ["classic", "tropical", "chocolate", "spicy"], "size": ["8 oz", "16 oz", "26 oz"]},
            (6, 30),
        ),
    },
}

_BRANDS = [
    "Northwind",
    "Alder & Co",
    "Brightfield",
    "Cobalt Line",
    "Driftwood",
    "Evergreen",
    "Foxglove",
    "Granite Peak",
    "Harbor",
    "Ironbark",
    "Juniper",
    "Kestrel",
    "Lumen",
    "Meadowlark",
    "Nimbus",
    "Oakridge",
    "Pinecrest",
    "Quill",
    "Redwood",
    "Sierra",
    "Tidewater",
    "Umber",
    "Vantage",
    "Willow",
    "Yarrow",
    "Zephyr",
]
_PRICE_BOUNDS = [10, 15, 20, 25, 30, 40, 50, 60, 70, 80, 90, 100, 120, 150, 200, 250, 300]


@dataclass(frozen=True)
class Product:
    """One catalogue item: ASIN-like id, category, type, attributes, options and price."""

    asin: str
    title: str
    category: str
    product_type: str
    attributes: tuple[str, ...]
    options: dict[str, tuple[str, ...]]
    price: float
    rating: int
    description: str


@dataclass(frozen=True)
class Goal:
    """What the shopper wants: a product type, attributes, one value per option, and a price bound."""

    instruction: str
    target_asin: str
    category: str
    product_type: str
    attributes: tuple[str, ...]
    options: dict[str, str]
    price_bound: float


@dataclass(eq=False)  # compared and hashed by identity: one catalogue object per seed
class Catalog:
    """All products of one shop, by ASIN."""

    seed: int
    products: list[Product]
    by_asin: dict[str, Product] = field(init=False)

    def __post_init__(self) -> None:
        self.by_asin = {p.asin: p for p in self.products}

    def __len__(self) -> int:
        return len(self.products)


def _title(brand: str, product_type: str, attributes: list[str]) -> str:
    before = [a for a in attributes if not a.startswith(("for ", "with "))]
    after = [a for a in attributes if a.startswith(("for ", "with "))]
    return " ".join([brand, *(a.title() for a in before), product_type.title(), *after])


def _description(
    rng: random.Random, product_type: str, attributes: list[str], options: dict[str, tuple[str, ...]]
) -> str:
    openers = ["Meet your new favourite", "A dependable", "Designed for everyday use, this", "Our best-selling"]
    feature = ", ".join(attributes[:-1]) + (" and " if len(attributes) > 1 else "") + attributes[-1]
    choices = "; ".join(f"{dim}: {', '.join(values)}" for dim, values in options.items())
    return f"{rng.choice(openers)} {product_type}: {feature}. Available in {choices}."


def _make_product(rng: random.Random, index: int, category: str, product_type: str) -> Product:
    pool, dims, (low, high) = _TYPES[category][product_type]
    audiences = [a for a in pool if a in ("for men", "for women")]
    plain = [a for a in pool if a not in audiences]
    attributes = rng.sample(plain, k=rng.randint(2, min(4, len(plain))))
    if audiences:
        attributes.append(rng.choice(audiences))
    options = {}
    for dim, values in dims.items():
        count = rng.randint(2, len(values))
        chosen = set(rng.sample(values, k=count))
        options[dim] = tuple(v for v in values if v in chosen)
    price = round(math.floor(rng.uniform(low, high)) + 0.99, 2)
    asin = "B0" + "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ23456789") for _ in range(7)) + f"{index % 10}"
    return Product(
        asin=asin,
        title=_title(rng.choice(_BRANDS), product_type, attributes),
        category=category,
        product_type=product_type,
        attributes=tuple(attributes),
        options=options,
        price=price,
        rating=rng.randint(2, 5),
        description=_description(rng, product_type, attributes, options),
    )


@lru_cache(maxsize=4)
def build_catalog(seed: int = 0, n_products: int = 1200) -> Catalog:
    """Generate `n_products` products spread evenly over every category and product type."""
    rng = random.Random(f"catalog-{seed}")
    kinds = [(c, t) for c, types in _TYPES.items() for t in types]
    products: list[Product] = []
    seen: set[str] = set()
    for index in range(n_products):
        category, product_type = kinds[index % len(kinds)]
        product = _make_product(rng, index, category, product_type)
        while product.asin in seen:
            product = _make_product(rng, index, category, product_type)
        seen.add(product.asin)
        products.append(product)
    rng.shuffle(products)
    return Catalog(seed, products)


def _price_bound(price: float) -> float:
    return float(next((b for b in _PRICE_BOUNDS if b >= price * 1.05), math.ceil(price * 1.2)))


def _option_phrase(dim: str, value: str) -> str:
    if dim == "model":
        return f"for the {value}"
    if dim in ("scent", "flavor"):
        return f"{value} {dim}"
    if dim == "size" and " " not in value:
        return f"size {value}"
    return value  # values that carry their unit already: "24 oz", "20 count", "65W", "queen"


def make_goal(catalog: Catalog, seed: int) -> Goal:
    """Pick a target product for `seed` and write the shopper's instruction for it."""
    rng = random.Random(f"goal-{catalog.seed}-{seed}")
    product = rng.choice(catalog.products)
    attributes = tuple(rng.sample(list(product.attributes), k=rng.randint(1, min(3, len(product.attributes)))))
    options = {dim: rng.choice(values) for dim, values in product.options.items()}
    bound = _price_bound(product.price)
    before = [a for a in attributes if not a.startswith(("for ", "with "))]
    after = [a for a in attributes if a.startswith(("for ", "with "))]
    noun = " ".join([*([options["color"]] if "color" in options else []), *before, product.product_type, *after])
    details = [_option_phrase(dim, value) for dim, value in options.items() if dim != "color"]
    article = "an" if noun[0] in "aeiou" else "a"
    opener = rng.choice(["i'm looking for", "i need", "find me", "i want to buy", "please get me"])
    price_text = rng.choice([f"under ${bound:g}", f"price lower than {bound:.2f} dollars", f"for less than ${bound:g}"])
    instruction = f"{opener} {article} {noun}" + "".join(f", {d}" for d in details) + f", {price_text}"
    return Goal(
        instruction=instruction,
        target_asin=product.asin,
        category=product.category,
        product_type=product.product_type,
        attributes=attributes,
        options=options,
        price_bound=bound,
    )
