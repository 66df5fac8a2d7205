"""A seeded product catalogue in the style of WebShop (Yao et al. 2022, arXiv 2207.01206).

WebShop scrapes 1.18M Amazon products; offline we generate a catalogue with the same
structure: every product has a category, a title, a price, a set of *attributes* (short
properties such as "waterproof" or "gluten free" that instructions ask for) and *options*
(customisations chosen on the item page, e.g. ``size: 10`` or ``color: black``). The
catalogue is a pure function of its seed, so every process builds the same one.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache

from entropace.envs.shop.more_categories import MORE_CATEGORIES

#: category -> (department, product nouns, attribute vocabulary, option types and values,
#: price range in dollars). Attribute and option words were chosen to read like WebShop's.
CATEGORIES: dict[
    str,
    tuple[str, tuple[str, ...], tuple[str, ...], dict[str, tuple[str, ...]], tuple[float, float]],
] = {
    "running shoes": (
        "fashion",
        ("running shoes", "sneakers", "trail runners"),
        (
            "lightweight",
            "breathable",
            "slip resistant",
            "memory foam",
            "arch support",
            "non slip",
            "waterproof",
            "wide fit",
        ),
        {
            "size": ("6", "7", "8", "9", "10", "11", "12"),
            "color": ("black", "white", "navy", "grey", "red"),
        },
        (25.0, 140.0),
    ),
    "hiking boots": (
        "fashion",
        ("hiking boots", "trekking boots", "ankle boots"),
        (
            "waterproof",
            "insulated",
            "leather",
            "steel toe",
            "lightweight",
            "slip resistant",
            "high top",
            "anti fatigue",
        ),
        {
            "size": ("7", "8", "9", "10", "11", "12", "13"),
            "color": ("brown", "black", "tan", "olive"),
        },
        (40.0, 220.0),
    ),
    "t-shirts": (
        "fashion",
        ("t-shirt", "crew neck tee", "graphic tee"),
        (
            "cotton",
            "moisture wicking",
            "slim fit",
            "short sleeve",
            "long sleeve",
            "machine wash",
            "relaxed fit",
            "quick dry",
        ),
        {
            "size": ("small", "medium", "large", "x-large", "xx-large"),
            "color": ("black", "white", "heather grey", "royal blue", "maroon", "green"),
        },
        (8.0, 45.0),
    ),
    "headphones": (
        "electronics",
        ("headphones", "earbuds", "headset"),
        (
            "wireless",
            "noise cancelling",
            "bluetooth",
            "over ear",
            "in ear",
            "long battery life",
            "water resistant",
            "built-in microphone",
        ),
        {"color": ("black", "white", "silver", "blue", "rose gold")},
        (15.0, 350.0),
    ),
    "phone cases": (
        "electronics",
        ("phone case", "protective cover", "wallet case"),
        (
            "shockproof",
            "slim",
            "clear",
            "magnetic",
            "card holder",
            "kickstand",
            "anti scratch",
            "wireless charging compatible",
        ),
        {
            "model": ("iphone 14", "iphone 15", "iphone 16", "galaxy s23", "galaxy s24", "pixel 8"),
            "color": ("black", "clear", "pink", "purple", "green"),
        },
        (6.0, 40.0),
    ),
    "coffee": (
        "grocery",
        ("ground coffee", "whole bean coffee", "coffee pods"),
        (
            "organic",
            "fair trade",
            "dark roast",
            "medium roast",
            "decaf",
            "single origin",
            "low acid",
            "kosher",
        ),
        {
            "size": ("8 ounce", "12 ounce", "2 pound", "5 pound"),
            "flavor": ("original", "vanilla", "hazelnut", "mocha"),
        },
        (6.0, 60.0),
    ),
    "snacks": (
        "grocery",
        ("protein bars", "trail mix", "granola bites", "rice crackers"),
        (
            "gluten free",
            "keto friendly",
            "low sugar",
            "vegan",
            "non gmo",
            "high protein",
            "dairy free",
            "individually wrapped",
        ),
        {
            "size": ("6 count", "12 count", "24 count"),
            "flavor": ("chocolate", "peanut butter", "sea salt", "berry", "almond"),
        },
        (5.0, 45.0),
    ),
    "shampoo": (
        "beauty",
        ("shampoo", "conditioner", "2-in-1 shampoo"),
        (
            "sulfate free",
            "paraben free",
            "for dry hair",
            "for curly hair",
            "argan oil",
            "tea tree",
            "cruelty free",
            "color safe",
        ),
        {
            "size": ("8 fl oz", "16 fl oz", "32 fl oz"),
            "scent": ("unscented", "lavender", "coconut", "citrus"),
        },
        (5.0, 50.0),
    ),
    "desk lamps": (
        "home",
        ("desk lamp", "reading lamp", "led task light"),
        (
            "dimmable",
            "usb charging port",
            "eye caring",
            "touch control",
            "adjustable arm",
            "energy efficient",
            "clamp mount",
            "color temperature",
        ),
        {"color": ("black", "white", "silver", "wood")},
        (12.0, 90.0),
    ),
    "backpacks": (
        "home",
        ("backpack", "daypack", "laptop backpack"),
        (
            "water resistant",
            "anti theft",
            "usb charging port",
            "lightweight",
            "padded straps",
            "laptop compartment",
            "large capacity",
            "travel friendly",
        ),
        {
            "color": ("black", "grey", "navy", "camo", "red"),
            "size": ("20 liter", "30 liter", "40 liter"),
        },
        (15.0, 130.0),
    ),
    "water bottles": (
        "home",
        ("water bottle", "insulated tumbler", "sports bottle"),
        (
            "bpa free",
            "leak proof",
            "insulated",
            "stainless steel",
            "dishwasher safe",
            "wide mouth",
            "straw lid",
            "keeps cold 24 hours",
        ),
        {
            "size": ("12 oz", "20 oz", "32 oz", "40 oz"),
            "color": ("black", "white", "teal", "lilac", "orange"),
        },
        (8.0, 50.0),
    ),
    "dog food": (
        "pets",
        ("dry dog food", "wet dog food", "dog treats"),
        (
            "grain free",
            "high protein",
            "natural",
            "for puppies",
            "for senior dogs",
            "chicken recipe",
            "salmon recipe",
            "no artificial flavors",
        ),
        {
            "size": ("4 pound", "15 pound", "30 pound"),
            "flavor": ("chicken", "beef", "lamb", "salmon"),
        },
        (10.0, 90.0),
    ),
}

CATEGORIES.update(MORE_CATEGORIES)  # 24 categories; the first twelve keep their products

BRANDS: tuple[str, ...] = (
    "Arbor",
    "Brightway",
    "Corvale",
    "Dunmore",
    "Elmstone",
    "Fernhill",
    "Glenrock",
    "Halden",
    "Ironleaf",
    "Juniper & Co",
    "Kestrel",
    "Larkspur",
    "Moorland",
    "Northvale",
    "Oakridge",
    "Pinecrest",
    "Quayside",
    "Redfern",
    "Silverline",
    "Thornbury",
)

CATALOGUE_SEED = 2207_01206
PRODUCTS_PER_CATEGORY = 300


@dataclass(frozen=True)
class Product:
    """One product of the catalogue.

    Attributes:
        asin: a WebShop-style 10-character id (``B0...``).
        category: key of :data:`CATEGORIES`.
        title: the product title shown on result and item pages.
        price: in dollars.
        attributes: the product's attributes (a subset of its category's vocabulary).
        options: option type -> the values this product offers.
        rating: 1.0-5.0.
    """

    asin: str
    category: str
    title: str
    price: float
    attributes: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]
    rating: float

    @property
    def department(self) -> str:
        return CATEGORIES[self.category][0]

    def option_dict(self) -> dict[str, tuple[str, ...]]:
        return dict(self.options)


def _make_product(rng: random.Random, category: str, index: int) -> Product:
    _dept, nouns, attr_vocab, option_types, (lo, hi) = CATEGORIES[category]
    attributes = tuple(sorted(rng.sample(attr_vocab, rng.randint(2, 4))))
    options = tuple(
        (name, tuple(v for v in values if rng.random() < 0.6) or (values[0],))
        for name, values in sorted(option_types.items())
    )
    noun = rng.choice(nouns)
    brand = rng.choice(BRANDS)
    shown = rng.sample(attributes, min(len(attributes), rng.randint(1, 2)))
    title = f"{brand} {' '.join(shown).title()} {noun.title()}"
    price = round(rng.uniform(lo, hi), 2)
    asin = "B0" + "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ0123456789") for _ in range(8))
    rating = round(rng.uniform(2.5, 5.0), 1)
    return Product(asin, category, title, price, attributes, options, rating)


@lru_cache(maxsize=4)
def build_catalogue(
    seed: int = CATALOGUE_SEED, per_category: int = PRODUCTS_PER_CATEGORY
) -> tuple[Product, ...]:
    """The catalogue for ``seed``: ``per_category`` products in each of :data:`CATEGORIES`.

    Deterministic; built in tens of milliseconds and memoised per process. ASINs are unique.
    """
    rng = random.Random(seed)
    products: list[Product] = []
    seen: set[str] = set()
    for category in CATEGORIES:
        for i in range(per_category):
            product = _make_product(rng, category, i)
            while product.asin in seen:  # astronomically rare; keep ids unique anyway
                product = _make_product(rng, category, i)
            seen.add(product.asin)
            products.append(product)
    return tuple(products)


def product_description(product: Product) -> str:
    """The text of a product's Description page (what WebShop's ``Description`` field holds)."""
    category = product.category
    singular = category[:-1] if category.endswith("s") else category
    return (
        f"{product.title}. A {', '.join(product.attributes)} {singular} "
        f"from our {product.department} department."
    )
