"""Demo QA articles: invented people, companies and cities, paragraphs of facts about them, and the questions
those facts answer (SQuAD v1.1 shaped: each answer a span of its paragraph)."""

from __future__ import annotations

import random
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from training.data.grammar import cap, indefinite_article, phrases, pick, words

_SYLLABLES = words(
    "bel cor dan fal gor hal kes lor mar nol pen quil ros sal tor val wen zan bri del mir ost tam vin"
)
_SURNAME_ENDS = words("a o en ing son ley ard ez ov ini ston berg")
_CITY_ENDS = words("ford ton burg ville mouth haven field port dale bridge")
_FIRST_NAMES = {
    "She": words("Anna Maria Clara Elena Sofia Laura Nina Ruth Iris Helen Mara Vera"),
    "He": words("Peter Jonas Victor Daniel Oskar Tomas Felix Hugo Simon Leon Karl Emil"),
}
_COUNTRIES = words("Norland Estavia Merovia Calandra Ostria Belmara Quessia Tarvonia")
_PROFESSIONS = words(
    "architect engineer chemist painter journalist teacher surgeon pilot composer lawyer botanist"
    " historian photographer carpenter economist"
)
_FIELDS = words(
    "physics law medicine music architecture history economics chemistry philosophy mathematics "
    "biology literature"
)
_INDUSTRIES = words(
    "software shipping textile aerospace publishing food energy robotics furniture insurance mining toy"
)
_COMPANY_ENDS = words("Industries Systems Works Holdings Labs Group Motors Foods Press")
_PRODUCT_KINDS = words("bicycle phone tractor camera lamp engine printer kettle radio")
_PRIZES = phrases(
    "Golden Compass Prize | Silver Quill Award | Northern Star Medal | Harbor Prize | Laurel Award"
)
_KNOWN_FOR = phrases(
    "annual lantern festival | glass factories | old harbor | botanical gardens | stone bridges |"
    " wine | cathedral | night market | clock tower | salt mines | jazz clubs | spring regatta"
)


class Names:
    """Invented proper names, never repeated, so article titles are unique."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def _fresh(self, make: Callable[[], str]) -> str:
        for _ in range(1000):
            name = make()
            if name not in self.used:
                self.used.add(name)
                return name
        raise ValueError("ran out of distinct invented names")

    def _stem(self) -> str:
        return cap(pick(self.rng, _SYLLABLES) + pick(self.rng, _SYLLABLES))

    def person(self) -> tuple[str, str]:
        """A full name and its subject pronoun."""
        pronoun = pick(self.rng, ("She", "He"))
        first = pick(self.rng, _FIRST_NAMES[pronoun])
        return self._fresh(lambda: f"{first} {self._stem()}{pick(self.rng, _SURNAME_ENDS)}"), pronoun

    def city(self) -> str:
        return self._fresh(lambda: self._stem() + pick(self.rng, _CITY_ENDS))

    def company(self) -> str:
        return self._fresh(
            lambda: f"{self._stem()}{pick(self.rng, _SURNAME_ENDS)} {pick(self.rng, _COMPANY_ENDS)}"
        )

    def thing(self, kinds: Sequence[str]) -> str:
        return self._fresh(lambda: f"{self._stem()} {self.rng.randint(2, 9)} {pick(self.rng, kinds)}")

    def river(self) -> str:
        return self._fresh(lambda: f"{self._stem()} River")

    def book(self) -> str:
        titles = words("Light River Winter Glass Harbor Stone Garden Silence Road Tower")
        return self._fresh(lambda: f"The {pick(self.rng, titles)} of {self._stem()}")


@dataclass(frozen=True)
class _Fact:
    """One sentence template plus the questions whose answers are its slots."""

    template: str  # str.format template; "{subj}" is the name or a pronoun
    values: dict[str, str]
    questions: tuple[tuple[tuple[str, ...], str], ...]  # (question phrasings, answer slot)


def _render(template: str, values: dict[str, str]) -> tuple[str, dict[str, int]]:
    """Fill a template and remember where each slot landed, so answer offsets are exact."""
    parts: list[str] = []
    offsets: dict[str, int] = {}
    pos = 0
    for literal, field_name, _, _ in string.Formatter().parse(template):
        parts.append(literal)
        pos += len(literal)
        if field_name is not None:
            value = values[field_name]
            offsets.setdefault(field_name, pos)
            parts.append(value)
            pos += len(value)
    return "".join(parts), offsets


_LAST_YEAR = 2023  # invented lives end before the present


def _year(rng: random.Random, low: int = 1850, high: int = 1990) -> str:
    return str(rng.randint(low, high))


def _count(rng: random.Random, low: int, high: int, step: int) -> str:
    return f"{rng.randrange(low, high, step):,}"


def _person_facts(rng: random.Random, names: Names) -> list[_Fact]:
    born = int(_year(rng, 1850, 1960))
    job = pick(rng, _PROFESSIONS)
    return [
        _Fact(
            "{subj} was born in {year} in {city}.",
            {"year": str(born), "city": names.city()},
            (
                (("When was {name} born?", "In what year was {name} born?"), "year"),
                (("Where was {name} born?", "In which city was {name} born?"), "city"),
            ),
        ),
        _Fact(
            "{subj} worked as {art} {job} for many years.",
            {"job": job, "art": indefinite_article(job)},
            ((("What was the profession of {name}?", "What did {name} work as?"), "job"),),
        ),
        _Fact(
            "{subj} studied {field} at the University of {uni}.",
            {"field": pick(rng, _FIELDS), "uni": names.city()},
            (
                (("What did {name} study?", "Which subject did {name} study?"), "field"),
                (("At the university of which city did {name} study?",), "uni"),
            ),
        ),
        _Fact(
            "In {fyear}, {subj_lower} founded {company}, {art_industry} {industry} company.",
            {
                "fyear": str(born + rng.randint(22, 45)),
                "company": names.company(),
                "industry": (industry := pick(rng, _INDUSTRIES)),
                "art_industry": indefinite_article(industry),
            },
            (
                (("Which company did {name} found?", "What company was founded by {name}?"), "company"),
                (("When did {name} found {company}?", "In what year did {name} found {company}?"), "fyear"),
            ),
        ),
        _Fact(
            "{subj} was married to {spouse}.",
            {"spouse": names.person()[0]},
            ((("Who was {name} married to?", "Who was the spouse of {name}?"), "spouse"),),
        ),
        _Fact(
            "{subj} wrote a book called {book}.",
            {"book": names.book()},
            ((("What book did {name} write?", "What is the title of the book {name} wrote?"), "book"),),
        ),
        _Fact(
            "{subj} won the {prize} in {pyear}.",
            {"prize": pick(rng, _PRIZES), "pyear": str(born + rng.randint(30, 60))},
            (
                (("Which award did {name} win?", "What prize did {name} receive?"), "prize"),
                (("In what year did {name} win the {prize}?",), "pyear"),
            ),
        ),
        _Fact(
            "Later in life, {subj_lower} moved to {home}, where {pron_lower} lived until {death}.",
            {"home": names.city(), "death": str(born + rng.randint(61, min(95, _LAST_YEAR - born)))},
            (
                (
                    (
                        "Where did {name} move later in life?",
                        "In which city did {name} spend the last years?",
                    ),
                    "home",
                ),
            ),
        ),
    ]


def _company_facts(rng: random.Random, names: Names) -> list[_Fact]:
    industry = pick(rng, _INDUSTRIES)
    return [
        _Fact(
            "{subj} is {art} {industry} company headquartered in {city}.",
            {"industry": industry, "art": indefinite_article(industry), "city": names.city()},
            (
                (("Where is {name} headquartered?", "In which city is {name} based?"), "city"),
                (("What kind of company is {name}?", "What industry is {name} in?"), "industry"),
            ),
        ),
        _Fact(
            "{subj} was founded by {founder} in {year}.",
            {"founder": names.person()[0], "year": _year(rng, 1870, 2005)},
            (
                (("Who founded {name}?", "Who was the founder of {name}?"), "founder"),
                (("When was {name} founded?", "In what year was {name} founded?"), "year"),
            ),
        ),
        _Fact(
            "The company employs about {staff} people.",
            {"staff": _count(rng, 200, 90000, 100)},
            ((("How many people does {name} employ?", "How many employees does {name} have?"), "staff"),),
        ),
        _Fact(
            "Its best-known product is the {product}.",
            {"product": names.thing(_PRODUCT_KINDS)},
            (
                (
                    ("What is the best-known product of {name}?", "Which product is {name} best known for?"),
                    "product",
                ),
            ),
        ),
        _Fact(
            "The chief executive of {subj_lower_name} is {ceo}.",
            {"ceo": names.person()[0]},
            ((("Who is the chief executive of {name}?", "Who runs {name}?"), "ceo"),),
        ),
        _Fact(
            "{subj} opened its first foreign office in {country}.",
            {"country": pick(rng, _COUNTRIES)},
            ((("Where did {name} open its first foreign office?",), "country"),),
        ),
    ]


def _city_facts(rng: random.Random, names: Names) -> list[_Fact]:
    return [
        _Fact(
            "{subj} is a city in {country}.",
            {"country": pick(rng, _COUNTRIES)},
            ((("In which country is {name}?", "Which country is {name} located in?"), "country"),),
        ),
        _Fact(
            "{subj} has a population of about {population}.",
            {"population": _count(rng, 5000, 2000000, 500)},
            ((("What is the population of {name}?", "How many people live in {name}?"), "population"),),
        ),
        _Fact(
            "The city was founded in {year} on the banks of the {river}.",
            {"year": _year(rng, 900, 1800), "river": names.river()},
            (
                (("When was {name} founded?", "In what year was {name} founded?"), "year"),
                (("Which river does {name} lie on?", "On which river was {name} founded?"), "river"),
            ),
        ),
        _Fact(
            "{subj} is known for its {known}.",
            {"known": pick(rng, _KNOWN_FOR)},
            ((("What is {name} known for?", "What is {name} famous for?"), "known"),),
        ),
        _Fact(
            "The mayor of {subj_lower_name} is {mayor}.",
            {"mayor": names.person()[0]},
            ((("Who is the mayor of {name}?",), "mayor"),),
        ),
        _Fact(
            "Its largest employer is {employer}.",
            {"employer": names.company()},
            (
                (
                    (
                        "What is the largest employer in {name}?",
                        "Which company employs the most people in {name}?",
                    ),
                    "employer",
                ),
            ),
        ),
    ]


def _qa_article(rng: random.Random, names: Names, index: int) -> dict[str, Any]:
    """One SQuAD article about an invented person, company or city: paragraphs of facts plus questions."""
    kind = rng.choices(("person", "company", "city"), weights=(5.0, 3.0, 2.0))[0]
    if kind == "person":
        name, pronoun = names.person()
        facts = _person_facts(rng, names)
    elif kind == "company":
        name, pronoun = names.company(), "It"
        facts = _company_facts(rng, names)
    else:
        name, pronoun = names.city(), "It"
        facts = _city_facts(rng, names)
    # A random subset of facts, split into one or two paragraphs, each kept in template
    # (roughly chronological) order so the prose reads naturally.
    chosen = rng.sample(range(len(facts)), rng.randint(4, len(facts)))
    n_paragraphs = rng.choice((1, 2)) if len(chosen) >= 6 else 1
    cut = len(chosen) // n_paragraphs
    groups = [
        sorted(chosen[p * cut : (p + 1) * cut if p < n_paragraphs - 1 else None]) for p in range(n_paragraphs)
    ]
    paragraphs = [
        _qa_paragraph(rng, name, pronoun, [facts[i] for i in group], f"demo-{index:05d}-{p}")
        for p, group in enumerate(groups)
    ]
    return {"title": name, "paragraphs": paragraphs}


def _qa_paragraph(
    rng: random.Random, name: str, pronoun: str, facts: list[_Fact], qid: str
) -> dict[str, Any]:
    """Render facts into one context, tracking offsets, and ask one question per answer slot."""
    # Open with a sentence that names the subject, so pronouns and "Its ..." have a referent.
    opener = next((f for f in facts if f.template.startswith("{subj}")), facts[0])
    facts = [opener, *(f for f in facts if f is not opener)]
    sentences: list[str] = []
    qas: list[dict[str, Any]] = []
    pos = 0
    for i, fact in enumerate(facts):
        subj = name if i == 0 or rng.random() < 0.4 else pronoun
        values = {
            **fact.values,
            "subj": subj,
            "subj_lower": subj if subj == name else subj.lower(),
            "subj_lower_name": name,
            "pron_lower": pronoun.lower(),
        }
        sentence, offsets = _render(fact.template, values)
        for phrasings, slot in fact.questions:
            question = pick(rng, phrasings).format(name=name, **fact.values)
            answer = {"text": fact.values[slot], "answer_start": pos + offsets[slot]}
            qas.append({"id": f"{qid}-{len(qas)}", "question": question, "answers": [answer]})
        sentences.append(sentence)
        pos += len(sentence) + 1
    return {"context": " ".join(sentences), "qas": qas}


def qa_articles(rng: random.Random, n_questions: int) -> list[dict[str, Any]]:
    """Articles until exactly `n_questions` questions exist (the last article is trimmed)."""
    names = Names(rng)
    articles: list[dict[str, Any]] = []
    total = 0
    while total < n_questions:
        article = _qa_article(rng, names, len(articles))
        for paragraph in article["paragraphs"]:
            keep = max(0, min(len(paragraph["qas"]), n_questions - total))
            paragraph["qas"] = paragraph["qas"][:keep]
            total += keep
        article["paragraphs"] = [p for p in article["paragraphs"] if p["qas"]]
        articles.append(article)
    return articles


def fact_paragraph(rng: random.Random, names: Names | None = None) -> str:
    """A QA-style context as plain prose, for the language-modelling text."""
    article = _qa_article(rng, names or Names(rng), 0)
    return " ".join(p["context"] for p in article["paragraphs"])
