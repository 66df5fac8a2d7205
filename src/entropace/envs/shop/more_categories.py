"""The second half of the shop catalogue's categories (added with the content splits).

Same structure as :data:`entropace.envs.shop.catalogue.CATEGORIES` (department, product nouns,
attribute vocabulary, option types and values, price range); appended after the first twelve,
so the products of those keep their ASINs and texts.
"""

from __future__ import annotations

MORE_CATEGORIES: dict[
    str,
    tuple[str, tuple[str, ...], tuple[str, ...], dict[str, tuple[str, ...]], tuple[float, float]],
] = {
    "rain jackets": (
        "fashion",
        ("rain jacket", "windbreaker", "shell jacket"),
        ("waterproof", "packable", "hooded", "breathable", "lightweight", "zip pockets",
         "windproof", "reflective"),
        {"size": ("small", "medium", "large", "x-large"), "color": ("black", "navy", "olive",
                                                                    "yellow", "red")},
        (30.0, 180.0),
    ),
    "yoga pants": (
        "fashion",
        ("yoga pants", "leggings", "joggers"),
        ("high waist", "moisture wicking", "four way stretch", "squat proof", "side pockets",
         "tummy control", "quick dry", "soft"),
        {"size": ("x-small", "small", "medium", "large", "x-large"),
         "color": ("black", "charcoal", "navy", "burgundy", "teal")},
        (12.0, 70.0),
    ),
    "smart watches": (
        "electronics",
        ("smart watch", "fitness tracker", "sport watch"),
        ("heart rate monitor", "gps", "waterproof", "sleep tracking", "long battery life",
         "bluetooth", "touch screen", "blood oxygen"),
        {"color": ("black", "silver", "rose gold", "blue"), "band size": ("small", "large")},
        (25.0, 400.0),
    ),
    "usb chargers": (
        "electronics",
        ("wall charger", "car charger", "charging station"),
        ("fast charging", "usb c", "dual port", "foldable plug", "compact", "overheat protection",
         "power delivery", "travel ready"),
        {"wattage": ("20w", "30w", "45w", "65w", "100w"), "color": ("black", "white")},
        (8.0, 60.0),
    ),
    "tea": (
        "grocery",
        ("green tea", "black tea", "herbal tea"),
        ("organic", "caffeine free", "loose leaf", "decaf", "non gmo", "fair trade", "kosher",
         "individually wrapped"),
        {"size": ("20 count", "50 count", "100 count"),
         "flavor": ("jasmine", "earl grey", "chamomile", "peppermint", "chai")},
        (4.0, 35.0),
    ),
    "olive oil": (
        "grocery",
        ("extra virgin olive oil", "olive oil spray", "infused olive oil"),
        ("cold pressed", "organic", "non gmo", "first harvest", "gluten free", "single origin",
         "kosher", "unfiltered"),
        {"size": ("250 ml", "500 ml", "1 liter", "3 liter")},
        (6.0, 60.0),
    ),
    "face moisturizer": (
        "beauty",
        ("face moisturizer", "night cream", "day cream"),
        ("fragrance free", "hyaluronic acid", "oil free", "spf 30", "vegan", "cruelty free",
         "for sensitive skin", "non comedogenic"),
        {"size": ("1.7 ounce", "2.5 ounce", "4 ounce")},
        (7.0, 80.0),
    ),
    "toothbrushes": (
        "beauty",
        ("electric toothbrush", "manual toothbrush", "sonic toothbrush"),
        ("soft bristles", "rechargeable", "travel case", "timer", "bpa free", "replaceable heads",
         "waterproof", "whitening"),
        {"color": ("white", "black", "blue", "pink"), "pack": ("1 pack", "2 pack", "4 pack")},
        (3.0, 120.0),
    ),
    "office chairs": (
        "home",
        ("office chair", "desk chair", "gaming chair"),
        ("ergonomic", "lumbar support", "adjustable height", "mesh back", "swivel", "padded arms",
         "high back", "easy assembly"),
        {"color": ("black", "grey", "white", "blue")},
        (60.0, 450.0),
    ),
    "bed sheets": (
        "home",
        ("sheet set", "fitted sheet", "duvet cover"),
        ("100% cotton", "deep pocket", "wrinkle free", "breathable", "hypoallergenic",
         "machine wash", "cooling", "microfiber"),
        {"size": ("twin", "full", "queen", "king"),
         "color": ("white", "ivory", "grey", "navy", "sage")},
        (18.0, 160.0),
    ),
    "tents": (
        "sports",
        ("camping tent", "backpacking tent", "pop up tent"),
        ("waterproof", "easy setup", "lightweight", "rainfly", "mesh windows", "carry bag",
         "double wall", "ventilated"),
        {"capacity": ("2 person", "4 person", "6 person"), "color": ("green", "orange", "grey")},
        (40.0, 400.0),
    ),
    "cat litter": (
        "pets",
        ("clumping cat litter", "crystal cat litter", "pine cat litter"),
        ("unscented", "odor control", "low dust", "natural", "lightweight", "multi cat",
         "flushable", "hypoallergenic"),
        {"size": ("10 pound", "20 pound", "40 pound")},
        (8.0, 45.0),
    ),
}  # fmt: skip
