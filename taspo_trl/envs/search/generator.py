"""A seeded generator of a fictional encyclopedia and the QA set that can only be answered from it.

Every name is made of invented syllables, so no answer can come from a model's memory: the policy has to search.
The world has countries, cities, rivers, companies and people linked by relations (a city lies in a country and
on a river, a company has a founder and a headquarters city, a person was born in a city and works for a
company). Each entity gets one short Wikipedia-style document that states only its *direct* relations, so a
multi-hop question ("In which city was the founder of X born?") really needs one search per hop.

Files written (``write_embedded_data``), all JSON lines:

- ``corpus.jsonl``: ``{"id", "contents"}`` with ``contents = '"Title"\\ntext'``, the layout of Search-R1's
  wiki-18 corpus, so the same file also works with Search-R1's own retrieval server.
- ``train.jsonl`` / ``test.jsonl``: ``{"id", "question", "golden_answers", "data_source", "hops"}`` in the
  FlashRAG/Search-R1 column layout; ``data_source`` is ``embedded_single`` or ``embedded_multi`` and ``hops``
  lists, per hop, the entity to search and the fact the search must reveal (used by the oracle policy).

Reproduce the shipped files with ``python -m taspo_trl.envs.search.generator --out taspo_trl/data/search``.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .data import MULTI_HOP, SINGLE_HOP

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "tr", "st", "th", "sh", "gl", "vr"]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ei", "ou", "ia"]
_CODAS = ["", "", "n", "r", "l", "s", "th", "m", "k", "nd", "rt"]
_OCCUPATIONS = ["painter", "engineer", "physician", "architect", "poet", "chemist", "historian", "composer", "sculptor", "astronomer", "lawyer", "botanist"]
_INDUSTRIES = ["shipbuilding", "textile", "software", "mining", "brewing", "publishing", "railway", "pharmaceutical", "glassmaking", "aviation"]
_REGIONS = ["the northern archipelago", "the eastern steppe", "the southern lowlands", "the western highlands", "the central plateau"]
_SEAS = ["Amber Sea", "Quiet Ocean", "Northern Gulf", "Salt Bay", "Cobalt Sea"]
_CURRENCIES = ["crown", "mark", "florin", "dinar", "thaler", "ducat"]


@dataclass
class World:
    """The fictional encyclopedia: entities with their attributes and relations (names are the keys)."""

    countries: dict[str, dict[str, Any]] = field(default_factory=dict)
    cities: dict[str, dict[str, Any]] = field(default_factory=dict)
    rivers: dict[str, dict[str, Any]] = field(default_factory=dict)
    companies: dict[str, dict[str, Any]] = field(default_factory=dict)
    people: dict[str, dict[str, Any]] = field(default_factory=dict)


class _Names:
    """Unique invented words: no two entities share a name token (first names of people excepted)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def word(self, syllables: tuple[int, int] = (2, 3)) -> str:
        while True:
            n = self.rng.randint(*syllables)
            parts = [self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) for _ in range(n)]
            word = ("".join(parts) + self.rng.choice(_CODAS)).capitalize()
            if word.lower() not in self.used and len(word) >= 4:
                self.used.add(word.lower())
                return word


def build_world(seed: int = 0, n_countries: int = 24, n_cities: int = 170, n_rivers: int = 40, n_companies: int = 180, n_people: int = 620) -> World:
    """The world for ``seed``; the same arguments always give the same world."""
    rng = random.Random(seed)
    names = _Names(rng)
    world = World()
    first_names = [names.word((1, 2)) for _ in range(60)]
    for _ in range(n_countries):
        world.countries[names.word()] = {
            "region": rng.choice(_REGIONS),
            "currency": rng.choice(_CURRENCIES),
            "language": names.word((2, 2)) + "ic",
            "capital": None,
        }
    country_names = list(world.countries)
    for _ in range(n_rivers):
        world.rivers[names.word()] = {"country": rng.choice(country_names), "sea": rng.choice(_SEAS), "length": rng.randint(80, 2400)}
    river_names = list(world.rivers)
    for i in range(n_cities):
        # The first cities go round the countries so every country has one (its capital).
        country = country_names[i] if i < len(country_names) else rng.choice(country_names)
        city = names.word()
        world.cities[city] = {"country": country, "river": rng.choice(river_names), "founded": rng.randint(600, 1750), "population": rng.randint(8, 900) * 1000}
        if world.countries[country]["capital"] is None:
            world.countries[country]["capital"] = city
    city_names = list(world.cities)
    people = []
    for _ in range(n_people):
        person = f"{rng.choice(first_names)} {names.word()}"
        people.append(person)
        world.people[person] = {
            "born": rng.randint(1820, 1990),
            "birthplace": rng.choice(city_names),
            "occupation": rng.choice(_OCCUPATIONS),
            "employer": None,
            "founded": None,
        }
    founders = rng.sample(people, n_companies)
    for founder in founders:
        company = names.word() + rng.choice(["", " Works", " Holdings", " Company", " Group"])
        year = min(max(world.people[founder]["born"] + rng.randint(20, 50), 1840), 2020)
        world.companies[company] = {"founder": founder, "headquarters": rng.choice(city_names), "industry": rng.choice(_INDUSTRIES), "founded": year}
        world.people[founder]["founded"] = company
    company_names = list(world.companies)
    for person in people:
        if world.people[person]["founded"] is None and rng.random() < 0.7:
            world.people[person]["employer"] = rng.choice(company_names)
    return world


def _documents(world: World) -> list[tuple[str, str]]:
    """(title, text) per entity. Each text names its subject several times, as encyclopedia entries do, which
    also keeps the entity's own page above the pages that merely mention it."""
    docs = []
    for name, c in world.countries.items():
        text = (f"{name} is a country in {c['region']}. The capital of {name} is {c['capital']}. "
                f"The official language of {name} is {c['language']} and its currency is the {c['currency']}.")
        docs.append((name, text))
    for name, c in world.cities.items():
        text = (f"{name} is a city in the country of {c['country']}. {name} lies on the {c['river']} river. "
                f"{name} was founded in {c['founded']} and has a population of about {c['population']:,}.")
        docs.append((name, text))
    for name, r in world.rivers.items():
        text = (f"The {name} is a river about {r['length']} km long. The {name} river rises in "
                f"{r['country']} and flows into the {r['sea']}.")
        docs.append((f"{name} (river)", text))
    for name, c in world.companies.items():
        text = (f"{name} is a {c['industry']} company founded in {c['founded']} by {c['founder']}. "
                f"The headquarters of {name} are in the city of {c['headquarters']}.")
        docs.append((name, text))
    for name, p in world.people.items():
        surname = name.split()[-1]
        text = f"{name} (born {p['born']}) is a {p['occupation']} who was born in {p['birthplace']}."
        if p["founded"]:
            text += f" In {world.companies[p['founded']]['founded']} {surname} founded the company {p['founded']}."
        if p["employer"]:
            text += f" {surname} works for {p['employer']}."
        docs.append((name, f"{text} {name} is known as a {p['occupation']}."))
    return docs


def _hop(entity: str, reveals: str) -> dict[str, str]:
    return {"search": entity, "reveals": reveals}


def _river(name: str) -> list[str]:
    return [name, f"{name} River"]


def _questions(world: World, rng: random.Random) -> list[dict[str, Any]]:
    """Every question the world supports, single-hop then multi-hop (the caller samples and splits them)."""
    w = world
    single: list[dict[str, Any]] = []
    multi: list[dict[str, Any]] = []
    for p, a in w.people.items():
        single.append({"question": f"In which city was {p} born?", "golden_answers": [a["birthplace"]], "hops": [_hop(p, a["birthplace"])]})
        single.append({"question": f"What is the occupation of {p}?", "golden_answers": [a["occupation"]], "hops": [_hop(p, a["occupation"])]})
        city = w.cities[a["birthplace"]]
        multi.append({"question": f"Which river flows through the city where {p} was born?", "golden_answers": _river(city["river"]),
                      "hops": [_hop(p, a["birthplace"]), _hop(a["birthplace"], city["river"])]})
        multi.append({"question": f"In which country was {p} born?", "golden_answers": [city["country"]],
                      "hops": [_hop(p, a["birthplace"]), _hop(a["birthplace"], city["country"])]})
        if a["employer"]:
            founder = w.companies[a["employer"]]["founder"]
            multi.append({"question": f"Who founded the company that {p} works for?", "golden_answers": [founder],
                          "hops": [_hop(p, a["employer"]), _hop(a["employer"], founder)]})
    for c, a in w.companies.items():
        single.append({"question": f"Who founded {c}?", "golden_answers": [a["founder"]], "hops": [_hop(c, a["founder"])]})
        single.append({"question": f"In which city is {c} headquartered?", "golden_answers": [a["headquarters"]], "hops": [_hop(c, a["headquarters"])]})
        single.append({"question": f"In what year was {c} founded?", "golden_answers": [str(a["founded"])], "hops": [_hop(c, str(a["founded"]))]})
        birthplace = w.people[a["founder"]]["birthplace"]
        multi.append({"question": f"In which city was the founder of {c} born?", "golden_answers": [birthplace],
                      "hops": [_hop(c, a["founder"]), _hop(a["founder"], birthplace)]})
        hq_country = w.cities[a["headquarters"]]["country"]
        multi.append({"question": f"In which country is the headquarters of {c}?", "golden_answers": [hq_country],
                      "hops": [_hop(c, a["headquarters"]), _hop(a["headquarters"], hq_country)]})
    for city, a in w.cities.items():
        single.append({"question": f"In which country is the city of {city}?", "golden_answers": [a["country"]], "hops": [_hop(city, a["country"])]})
        single.append({"question": f"Which river flows through {city}?", "golden_answers": _river(a["river"]), "hops": [_hop(city, a["river"])]})
        capital = w.countries[a["country"]]["capital"]
        if capital != city:
            multi.append({"question": f"What is the capital of the country in which {city} lies?", "golden_answers": [capital],
                          "hops": [_hop(city, a["country"]), _hop(a["country"], capital)]})
    for country, a in w.countries.items():
        single.append({"question": f"What is the capital of {country}?", "golden_answers": [a["capital"]], "hops": [_hop(country, a["capital"])]})
        single.append({"question": f"What is the currency of {country}?", "golden_answers": [a["currency"]], "hops": [_hop(country, a["currency"])]})
    for river, a in w.rivers.items():
        capital = w.countries[a["country"]]["capital"]
        multi.append({"question": f"What is the capital of the country where the {river} river rises?", "golden_answers": [capital],
                      "hops": [_hop(river, a["country"]), _hop(a["country"], capital)]})
    for q in single:
        q["data_source"] = SINGLE_HOP
    for q in multi:
        q["data_source"] = MULTI_HOP
    rng.shuffle(single)
    rng.shuffle(multi)
    return single + multi


def generate(seed: int = 0, n_single: int = 450, n_multi: int = 450, test_fraction: float = 0.25) -> dict[str, list[dict[str, Any]]]:
    """The corpus and the train/test questions for ``seed`` (deterministic)."""
    world = build_world(seed)
    rng = random.Random(seed + 1)
    questions = _questions(world, rng)
    single = [q for q in questions if q["data_source"] == SINGLE_HOP][:n_single]
    multi = [q for q in questions if q["data_source"] == MULTI_HOP][:n_multi]
    splits: dict[str, list[dict[str, Any]]] = {"train": [], "test": []}
    for family in (single, multi):
        n_test = round(len(family) * test_fraction)
        splits["test"] += family[:n_test]
        splits["train"] += family[n_test:]
    for split, rows in splits.items():
        for i, row in enumerate(rows):
            row["id"] = f"{split}-{i:04d}"
    corpus = [{"id": str(i), "contents": f'"{title}"\n{text}'} for i, (title, text) in enumerate(_documents(world))]
    return {"corpus": corpus, **splits}


def write_embedded_data(out: str | Path, seed: int = 0) -> dict[str, int]:
    """Write ``corpus.jsonl``, ``train.jsonl`` and ``test.jsonl`` under ``out``; returns the row counts."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    data = generate(seed)
    for name, rows in data.items():
        with open(out / f"{name}.jsonl", "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps({k: row[k] for k in sorted(row)}, ensure_ascii=True) + "\n" for row in rows)
    return {name: len(rows) for name, rows in data.items()}


def main(argv: list[str] | None = None) -> None:
    """CLI: regenerate the embedded Search-QA data."""
    parser = argparse.ArgumentParser(description="Generate the embedded fictional-encyclopedia Search-QA data.")
    parser.add_argument("--out", required=True, help="output directory (the shipped copy is taspo_trl/data/search)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(json.dumps(write_embedded_data(args.out, args.seed)))


if __name__ == "__main__":
    main()
