"""Deterministic generator of the embedded WebShop catalogue and its goals.

Provenance: everything here is synthesised by this module from small hand-written vocabularies (product types,
attributes, option values, brand syllables). None of it comes from WebShop's scraped Amazon data. The records
follow WebShop's field layout (``asin``, ``Title``, ``Price``, ``Attributes``, ``options``, ``BulletPoints``,
``Description``, ``query``, ``product_category``, ...) so the reward of :mod:`.reward` reads them the way
WebShop's ``goal.py`` reads its own.

The shipped files under ``taspo_trl/data/webshop/`` are ``write_data(seed=0)``'s output; any other seed builds a
different but equally deterministic world in memory (well under a second). Regenerate the shipped files with
``python -m taspo_trl.envs.webshop.generator --out taspo_trl/data/webshop``.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

SHIPPED_SEED = 0
PRODUCTS_PER_TYPE = 24
GOALS_PER_PRODUCT = 2
EVAL_GOALS = 128
# WebShop draws a goal's price limit from the multiples of ten just above the product's price.
PRICE_STEPS = [10.0 * i for i in range(1, 100)]

# One entry per product type: the search query, the nouns naming it, its category path (WebShop joins the
# levels with "›"), a pool of attributes, option groups with their value pools, and a price range in dollars.
PRODUCT_TYPES: list[dict[str, Any]] = [
    # beauty
    {"category": "beauty", "query": "hair dryer", "nouns": ["hair", "dryer"],
     "path": ["Beauty & Personal Care", "Hair Care", "Styling Tools", "Hair Dryers"],
     "attributes": ["long lasting", "travel size", "easy to use", "high quality", "low noise", "fast drying"],
     "options": {"color": ["black", "white", "rose gold", "purple", "silver"]}, "price": (18, 90)},
    {"category": "beauty", "query": "shampoo", "nouns": ["shampoo"],
     "path": ["Beauty & Personal Care", "Hair Care", "Shampoo & Conditioner", "Shampoos"],
     "attributes": ["paraben free", "sulfate free", "natural ingredients", "dry hair", "cruelty free", "argan oil"],
     "options": {"size": ["8 fl oz", "12 fl oz", "16 fl oz", "32 fl oz"], "scent": ["lavender", "coconut", "mint", "unscented"]},
     "price": (6, 35)},
    {"category": "beauty", "query": "face moisturizer", "nouns": ["face", "moisturizer"],
     "path": ["Beauty & Personal Care", "Skin Care", "Face", "Moisturizers"],
     "attributes": ["fragrance free", "sensitive skin", "hyaluronic acid", "oil free", "anti aging", "cruelty free"],
     "options": {"size": ["1.7 oz", "2.5 oz", "4 oz"]}, "price": (9, 60)},
    {"category": "beauty", "query": "lipstick", "nouns": ["lipstick"],
     "path": ["Beauty & Personal Care", "Makeup", "Lips", "Lipstick"],
     "attributes": ["long lasting", "matte finish", "cruelty free", "highly pigmented", "vegan"],
     "options": {"color": ["ruby red", "nude", "berry", "coral", "plum", "pink"]}, "price": (5, 30)},
    {"category": "beauty", "query": "nail polish", "nouns": ["nail", "polish"],
     "path": ["Beauty & Personal Care", "Foot, Hand & Nail Care", "Nail Art & Polish", "Nail Polish"],
     "attributes": ["quick drying", "non toxic", "long lasting", "easy to apply", "glossy finish"],
     "options": {"color": ["red", "navy blue", "glitter gold", "clear", "mint green"], "size": ["0.5 fl oz", "1 fl oz"]},
     "price": (4, 22)},
    # grocery
    {"category": "grocery", "query": "coffee beans", "nouns": ["coffee", "beans"],
     "path": ["Grocery & Gourmet Food", "Beverages", "Coffee", "Whole Coffee Beans"],
     "attributes": ["fair trade", "dark roast", "usda organic", "low acid", "gluten free"],
     "options": {"size": ["12 ounce", "2 pound", "5 pound"], "flavor": ["original", "vanilla", "hazelnut", "mocha"]},
     "price": (8, 45)},
    {"category": "grocery", "query": "protein bar", "nouns": ["protein", "bar"],
     "path": ["Grocery & Gourmet Food", "Snack Foods", "Bars", "Protein Bars"],
     "attributes": ["gluten free", "low sugar", "high protein", "non gmo", "keto friendly", "individually wrapped"],
     "options": {"flavor": ["chocolate chip", "peanut butter", "cookie dough", "salted caramel"], "size": ["12 count", "24 count"]},
     "price": (12, 48)},
    {"category": "grocery", "query": "green tea", "nouns": ["green", "tea"],
     "path": ["Grocery & Gourmet Food", "Beverages", "Tea", "Green Tea"],
     "attributes": ["usda organic", "caffeine free", "non gmo", "individually wrapped", "natural ingredients"],
     "options": {"flavor": ["jasmine", "lemon", "matcha", "mint"], "size": ["20 count", "50 count", "100 count"]},
     "price": (4, 28)},
    {"category": "grocery", "query": "olive oil", "nouns": ["olive", "oil"],
     "path": ["Grocery & Gourmet Food", "Pantry Staples", "Cooking Oils", "Olive Oil"],
     "attributes": ["extra virgin", "cold pressed", "non gmo", "usda organic", "kosher certified"],
     "options": {"size": ["16.9 fl oz", "25.3 fl oz", "1 liter"]}, "price": (7, 40)},
    {"category": "grocery", "query": "dark chocolate", "nouns": ["dark", "chocolate"],
     "path": ["Grocery & Gourmet Food", "Candy & Chocolate", "Chocolate", "Chocolate Bars"],
     "attributes": ["sugar free", "dairy free", "fair trade", "keto friendly", "gluten free"],
     "options": {"flavor": ["sea salt", "almond", "orange", "mint"], "size": ["3 pack", "6 pack", "12 pack"]},
     "price": (5, 35)},
    # fashion
    {"category": "fashion", "query": "running shoes", "nouns": ["running", "shoes"],
     "path": ["Clothing, Shoes & Jewelry", "Men", "Shoes", "Athletic"],
     "attributes": ["non slip", "rubber sole", "lightweight", "breathable mesh", "arch support"],
     "options": {"color": ["black", "white", "grey", "navy", "red"], "size": ["7", "8", "9", "10", "11", "12"]},
     "price": (25, 120)},
    {"category": "fashion", "query": "t-shirt", "nouns": ["t-shirt", "shirt"],
     "path": ["Clothing, Shoes & Jewelry", "Women", "Clothing", "Tops & Tees"],
     "attributes": ["machine wash", "short sleeve", "cotton spandex", "relaxed fit", "moisture wicking"],
     "options": {"color": ["black", "white", "heather grey", "olive", "pink"], "size": ["small", "medium", "large", "x-large"]},
     "price": (8, 40)},
    {"category": "fashion", "query": "winter jacket", "nouns": ["winter", "jacket"],
     "path": ["Clothing, Shoes & Jewelry", "Men", "Clothing", "Jackets & Coats"],
     "attributes": ["water resistant", "fleece lined", "zipper closure", "machine wash", "hooded"],
     "options": {"color": ["black", "army green", "navy", "khaki"], "size": ["medium", "large", "x-large", "xx-large"]},
     "price": (35, 160)},
    {"category": "fashion", "query": "yoga pants", "nouns": ["yoga", "pants"],
     "path": ["Clothing, Shoes & Jewelry", "Women", "Clothing", "Active", "Leggings"],
     "attributes": ["high waist", "tummy control", "quick drying", "butt lifting", "elastic waistband"],
     "options": {"color": ["black", "dark grey", "wine red", "navy blue"], "size": ["x-small", "small", "medium", "large"]},
     "price": (12, 55)},
    {"category": "fashion", "query": "wool socks", "nouns": ["wool", "socks"],
     "path": ["Clothing, Shoes & Jewelry", "Men", "Clothing", "Socks"],
     "attributes": ["moisture wicking", "cushioned sole", "machine wash", "anti odor"],
     "options": {"color": ["charcoal", "brown", "multicolor"], "size": ["medium", "large"]}, "price": (9, 38)},
    # electronics
    {"category": "electronics", "query": "wireless earbuds", "nouns": ["wireless", "earbuds"],
     "path": ["Electronics", "Headphones, Earbuds & Accessories", "Earbuds"],
     "attributes": ["noise cancelling", "long battery life", "water resistant", "fast charging", "bluetooth 5.0"],
     "options": {"color": ["black", "white", "blue"]}, "price": (15, 150)},
    {"category": "electronics", "query": "phone case", "nouns": ["phone", "case"],
     "path": ["Cell Phones & Accessories", "Cases, Holsters & Sleeves", "Basic Cases"],
     "attributes": ["shockproof", "wireless charging", "slim fit", "easy install", "scratch resistant"],
     "options": {"color": ["clear", "black", "midnight green", "lavender"], "style": ["iphone 13", "iphone 14", "galaxy s22"]},
     "price": (6, 35)},
    {"category": "electronics", "query": "usb c cable", "nouns": ["usb", "cable"],
     "path": ["Electronics", "Computers & Accessories", "Cables", "USB Cables"],
     "attributes": ["fast charging", "braided nylon", "high speed", "durable"],
     "options": {"size": ["3 ft", "6 ft", "10 ft"], "color": ["black", "white", "red"]}, "price": (5, 25)},
    {"category": "electronics", "query": "bluetooth speaker", "nouns": ["bluetooth", "speaker"],
     "path": ["Electronics", "Portable Audio & Video", "Portable Speakers"],
     "attributes": ["water resistant", "long battery life", "high definition", "easy to carry", "stereo sound"],
     "options": {"color": ["black", "blue", "red", "camo"]}, "price": (20, 140)},
    {"category": "electronics", "query": "hdmi cable", "nouns": ["hdmi", "cable"],
     "path": ["Electronics", "Television & Video", "Accessories", "Cables", "HDMI Cables"],
     "attributes": ["high speed", "gold plated", "4k resolution", "braided nylon"],
     "options": {"size": ["3 ft", "6 ft", "15 ft"], "style": ["1 pack", "2 pack"]}, "price": (6, 30)},
    # home and garden
    {"category": "home", "query": "bath towel", "nouns": ["bath", "towel"],
     "path": ["Home & Kitchen", "Bath", "Towels", "Bath Towels"],
     "attributes": ["quick drying", "super soft", "machine washable", "highly absorbent", "cotton"],
     "options": {"color": ["white", "grey", "navy", "beige", "teal"], "size": ["2 pack", "4 pack", "6 pack"]},
     "price": (15, 70)},
    {"category": "home", "query": "office chair", "nouns": ["office", "chair"],
     "path": ["Home & Kitchen", "Furniture", "Home Office Furniture", "Home Office Chairs"],
     "attributes": ["lumbar support", "easy assembly", "adjustable height", "mesh back", "heavy duty"],
     "options": {"color": ["black", "grey", "white"]}, "price": (60, 300)},
    {"category": "home", "query": "throw pillow cover", "nouns": ["throw", "pillow", "cover"],
     "path": ["Home & Kitchen", "Bedding", "Decorative Pillows, Inserts & Covers", "Throw Pillow Covers"],
     "attributes": ["machine washable", "zipper closure", "super soft", "living room", "double sided"],
     "options": {"color": ["mustard yellow", "sage green", "cream", "rust"], "size": ["18 x 18 inch", "20 x 20 inch"]},
     "price": (8, 40)},
    {"category": "home", "query": "led desk lamp", "nouns": ["led", "lamp"],
     "path": ["Tools & Home Improvement", "Lighting & Ceiling Fans", "Lamps & Shades", "Desk Lamps"],
     "attributes": ["dimmable", "eye caring", "usb charging port", "touch control", "energy saving"],
     "options": {"color": ["black", "white", "silver"]}, "price": (15, 80)},
    {"category": "home", "query": "garden hose", "nouns": ["garden", "hose"],
     "path": ["Patio, Lawn & Garden", "Watering Equipment", "Garden Hoses"],
     "attributes": ["heavy duty", "kink free", "leak proof", "lightweight", "expandable"],
     "options": {"size": ["25 ft", "50 ft", "100 ft"]}, "price": (18, 90)},
]

_EXTRAS = {
    "beauty": ["for women and men", "salon grade", "gift set", "for daily use"],
    "grocery": ["family size", "value pack", "gourmet", "snack pack"],
    "fashion": ["classic fit", "for everyday wear", "casual", "athletic"],
    "electronics": ["upgraded version", "2024 model", "with carrying pouch", "compatible with most devices"],
    "home": ["for bedroom and office", "modern design", "premium quality", "set"],
}
_SYLLABLES = ["zor", "vex", "lu", "ma", "ki", "tro", "na", "sol", "bri", "qua", "ve", "ra", "den", "ox", "pi", "fel"]
_REVIEW_BODIES = [
    "Works as described, would buy again.", "Good value for the price.", "Arrived quickly and well packed.",
    "Not quite what I expected.", "My second one, still happy with it.", "Quality could be better.",
]
_BULLETS = ["{A}: a {q} you can rely on.", "{A} - tested by {b} for everyday use.", "Why {b}? {A}, as promised.",
            "{A} design for home and travel."]
_OPTION_PHRASES = {
    "color": "in {v} color", "size": "in size {v}", "flavor": "with {v} flavor", "scent": "with {v} scent",
    "style": "in style {v}",
}
_OPENERS = ["i need", "i am looking for", "i want", "find me", "i would like", "get me"]


def _brand(rng: random.Random) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()


def _asin(rng: random.Random, taken: set[str]) -> str:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    while True:
        asin = "B0" + "".join(rng.choice(alphabet) for _ in range(8))
        if asin not in taken:
            taken.add(asin)
            return asin


def _product(kind: dict[str, Any], rng: random.Random, asin: str) -> dict[str, Any]:
    brand = _brand(rng)
    attributes = sorted(rng.sample(kind["attributes"], rng.randint(2, min(4, len(kind["attributes"])))))
    options = {}
    for group, pool in kind["options"].items():
        values = rng.sample(pool, rng.randint(2, min(5, len(pool))))
        options[group] = [v for v in pool if v in values]  # keep the pool's natural order (sizes ascending)
    extra = rng.choice(_EXTRAS[kind["category"]])
    type_name = kind["query"].title()
    title = f"{brand} {attributes[0].title()} {type_name} {extra.title()}"
    if len(attributes) > 1 and rng.random() < 0.5:
        title += f" - {attributes[1].title()}"
    low, high = kind["price"]
    price = round(rng.randint(low, high) - 0.01, 2)
    bullets = [rng.choice(_BULLETS).format(a=attribute, A=attribute.capitalize(), q=kind["query"], b=brand)
               for attribute in attributes]
    bullets.append(f"What you get: one {kind['query']} from {brand}, {extra}.")
    rng.shuffle(bullets)
    description = (
        f"The {brand} {kind['query']} is {', '.join(attributes[:-1])} and {attributes[-1]}. "
        f"Designed {extra}, it comes in {sum(len(v) for v in options.values())} variants."
        if len(attributes) > 1 else f"The {brand} {kind['query']} is {attributes[0]}."
    )
    reviews = [
        {"score": rng.randint(2, 5), "title": rng.choice(["Great", "Okay", "Nice", "Meh"]), "body": rng.choice(_REVIEW_BODIES)}
        for _ in range(rng.randint(0, 3))
    ]
    rating = round(sum(r["score"] for r in reviews) / len(reviews), 1) if reviews else "N.A."
    return {
        "asin": asin,
        "category": kind["category"],
        "query": kind["query"],
        "product_category": " › ".join(kind["path"]),
        "Title": title,
        # WebShop's type reward compares the nouns of the two titles (spaCy POS tags); we record them here.
        "nouns": [*kind["nouns"], brand.lower()],
        "Price": f"${price:.2f}",
        "price": price,
        "Rating": rating,
        "Attributes": attributes,
        "options": options,
        "BulletPoints": bullets,
        "Description": description,
        "Reviews": reviews,
    }


def _instruction(product: dict[str, Any], attributes: list[str], goal_options: dict[str, str],
                 price_upper: float, rng: random.Random) -> str:
    opener = rng.choice(_OPENERS)
    article = "an" if attributes[0][0] in "aeio" or attributes[0].startswith("un") else "a"
    text = f"{opener} {article} {attributes[0]} {product['query']}"
    if len(attributes) > 1:
        rest = attributes[1:]
        text += " that is " + (rest[0] if len(rest) == 1 else f"{', '.join(rest[:-1])} and {rest[-1]}")
    for group, value in goal_options.items():
        text += ", " + _OPTION_PHRASES.get(group, group + " {v}").format(v=value)
    return f"{text}, and price lower than {price_upper:.2f} dollars"


def _goal(product: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    attributes = rng.sample(product["Attributes"], rng.randint(1, min(3, len(product["Attributes"]))))
    goal_options = {group: rng.choice(values) for group, values in product["options"].items()}
    steps = [p for p in PRICE_STEPS if p > product["price"]][:4]
    price_upper = sorted(rng.sample(steps, 2))[1]
    return {
        "asin": product["asin"],
        "category": product["category"],
        "query": product["query"],
        "name": product["Title"],
        "nouns": list(product["nouns"]),
        "product_category": product["product_category"],
        "instruction_text": _instruction(product, attributes, goal_options, price_upper, rng),
        "attributes": attributes,
        "price_upper": price_upper,
        "goal_options": goal_options,
    }


def generate(seed: int = SHIPPED_SEED, products_per_type: int = PRODUCTS_PER_TYPE,
             goals_per_product: int = GOALS_PER_PRODUCT, eval_goals: int = EVAL_GOALS
             ) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """The catalogue and the goal splits ``{"eval": [...], "train": [...]}`` for ``seed``.

    The same arguments always give the same output (one ``random.Random(seed)`` drives everything).
    """
    rng = random.Random(seed)
    taken: set[str] = set()
    products = [_product(kind, rng, _asin(rng, taken)) for kind in PRODUCT_TYPES for _ in range(products_per_type)]
    rng.shuffle(products)
    goals = [_goal(product, rng) for product in products for _ in range(goals_per_product)]
    rng.shuffle(goals)
    return products, {"eval": goals[:eval_goals], "train": goals[eval_goals:]}


def write_data(out_dir: str | Path, seed: int = SHIPPED_SEED) -> list[Path]:
    """Write ``products.json`` and ``goals.json`` (the splits) for ``seed``; returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    products, goals = generate(seed)
    paths = [out / "products.json", out / "goals.json"]
    paths[0].write_text(json.dumps({"seed": seed, "products": products}, separators=(",", ":")) + "\n")
    paths[1].write_text(json.dumps({"seed": seed, **goals}, separators=(",", ":")) + "\n")
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Generate the embedded WebShop catalogue and goals.")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=SHIPPED_SEED)
    args = parser.parse_args(argv)
    for path in write_data(args.out, args.seed):
        print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
