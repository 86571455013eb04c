"""Seeded demo data for every task, so the pipeline runs end to end on a fresh machine.

Everything is drawn from template grammars with `random.Random` instances seeded from `seed`
(never the global RNG), so a seed always gives byte-identical files. The files use the same
formats as the real data sets (JSON lines, SQuAD v1.1, plain text) and load with `loaders`.
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.data.loaders import split_examples
from training.data.writers import write_json, write_jsonl, write_lines

# --------------------------------------------------------------------------- file layout


@dataclass(frozen=True)
class DemoFiles:
    """Where `write_demo_data` put each task's train and eval split."""

    root: Path
    classification_train: Path
    classification_eval: Path
    qa_train: Path
    qa_eval: Path
    text_train: Path
    text_eval: Path


def write_demo_data(
    out_dir: Path,
    seed: int = 0,
    n_classification: int = 4000,
    n_qa: int = 1500,
    n_text_lines: int = 4000,
    eval_fraction: float = 0.1,
) -> DemoFiles:
    """Write all demo splits under `out_dir`; counts are totals over train plus eval."""
    if not 0.0 <= eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
    root = Path(out_dir)
    files = DemoFiles(
        root=root,
        classification_train=root / "classification" / "train.jsonl",
        classification_eval=root / "classification" / "eval.jsonl",
        qa_train=root / "qa" / "train.json",
        qa_eval=root / "qa" / "eval.json",
        text_train=root / "text" / "train.txt",
        text_eval=root / "text" / "eval.txt",
    )
    train, evals = _classification_splits(_rng(seed, "classification"), n_classification, eval_fraction, seed)
    write_jsonl(files.classification_train, train)
    write_jsonl(files.classification_eval, evals)
    articles = _qa_articles(_rng(seed, "qa"), n_qa)
    qa_train, qa_eval = split_examples(articles, eval_fraction, seed)
    write_json(files.qa_train, {"version": "1.1", "data": qa_train})
    write_json(files.qa_eval, {"version": "1.1", "data": qa_eval})
    text_train, text_eval = split_examples(_text_lines(_rng(seed, "text"), n_text_lines), eval_fraction, seed)
    write_lines(files.text_train, text_train)
    write_lines(files.text_eval, text_eval)
    return files


def _rng(seed: int, stream: str) -> random.Random:
    """One independent stream per task, so changing one task's size leaves the others unchanged."""
    return random.Random(f"distilserve-demo:{seed}:{stream}")


# --------------------------------------------------------------------------- shared helpers

_WORD = re.compile(r"[a-z]+")


def _words(text: str) -> tuple[str, ...]:
    """Word lists written as one string keep the lexicons compact and easy to extend."""
    return tuple(text.split())


def _phrases(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split("|"))


def _pick(rng: random.Random, options: Sequence[str], weights: Sequence[float] | None = None) -> str:
    return rng.choices(options, weights=weights)[0] if weights else rng.choice(options)


def _article(word: str) -> str:
    """English indefinite article; the lexicons below avoid words where spelling misleads."""
    return "an" if word[:1].lower() in "aeiou" else "a"


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


# --------------------------------------------------------------------------- sentiment reviews


@dataclass(frozen=True)
class _Thing:
    """A reviewable noun with the neutral verb phrase used to say one experienced it."""

    noun: str
    experienced: str  # "watched it", "stayed there", ...
    span: str  # a noun-specific "every minute of it"


_THINGS = (
    _Thing("film", "watched it", "every scene of it"),
    _Thing("movie", "watched it", "every scene of it"),
    _Thing("show", "watched it", "every episode of it"),
    _Thing("series", "watched it", "every episode of it"),
    _Thing("documentary", "watched it", "every minute of it"),
    _Thing("book", "read it", "every page of it"),
    _Thing("novel", "read it", "every chapter of it"),
    _Thing("album", "listened to it", "every song on it"),
    _Thing("record", "listened to it", "every track on it"),
    _Thing("song", "listened to it", "every second of it"),
    _Thing("restaurant", "went there", "every course"),
    _Thing("meal", "ate it", "every bite of it"),
    _Thing("dinner", "had it", "every bite of it"),
    _Thing("cafe", "went there", "every visit"),
    _Thing("game", "played it", "every level of it"),
    _Thing("play", "saw it", "every act of it"),
    _Thing("musical", "saw it", "every number in it"),
    _Thing("concert", "went to it", "every song"),
    _Thing("performance", "saw it", "every moment of it"),
    _Thing("hotel", "stayed there", "every night there"),
    _Thing("trip", "went on it", "every day of it"),
    _Thing("exhibition", "visited it", "every room of it"),
    _Thing("course", "took it", "every lesson"),
    _Thing("phone", "used it", "every day with it"),
    _Thing("podcast", "listened to it", "every episode of it"),
)
# "film" is weighted up: it is the noun the smoke-test sentences use.
_THING_WEIGHTS = tuple(4.0 if t.noun in ("film", "movie") else 1.0 for t in _THINGS)

_ADJECTIVES = {
    True: _words(
        "wonderful great excellent brilliant delightful superb fantastic amazing charming "
        "beautiful lovely moving enjoyable gripping memorable impressive outstanding terrific "
        "marvelous fun heartwarming clever good perfect"
    ),
    False: _words(
        "dull terrible awful boring bad dreadful horrible disappointing tedious poor mediocre "
        "painful bland lifeless forgettable clumsy messy annoying weak pointless dire miserable "
        "frustrating lousy"
    ),
}
_ADJ_WEIGHTS = {
    True: tuple(4.0 if a in ("wonderful", "great") else 1.0 for a in _ADJECTIVES[True]),
    False: tuple(4.0 if a in ("dull", "terrible") else 1.0 for a in _ADJECTIVES[False]),
}
# Verbs that take an object ("this film") and verbs that take a span ("every minute of it").
_OBJECT_VERBS = {
    True: _words("loved enjoyed adored liked treasured appreciated"),
    False: _phrases("hated | despised | disliked | loathed | could not stand | detested"),
}
_SPAN_VERBS = {
    True: _words("loved enjoyed adored savored relished treasured"),
    False: _words("hated despised regretted loathed resented detested"),
}
_VERB_WEIGHTS = (5.0, 3.0, 2.0, 1.0, 1.0, 1.0)
_RECOMMEND = {
    True: ("I would recommend it to anyone", "Highly recommended", "Five stars", "I would go again"),
    False: ("I would not recommend it to anyone", "Not recommended", "One star", "Never again"),
}
_SUBJECTS = _phrases("I | We | She | He | My friend | My sister | My dad | The critics | Everyone")
_SUBJECT_WEIGHTS = (10.0, 3.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)
_DETERMINERS = ("this", "the", "that")
_DET_WEIGHTS = (5.0, 3.0, 1.0)
_INTENSIFIERS = _words("really truly absolutely very so incredibly totally genuinely utterly quite")
_ATTRIBUTIVE_INTENSIFIERS = _words("really truly very incredibly utterly genuinely")
_VERB_INTENSIFIERS = _words("really truly absolutely genuinely just")
_GENERIC_SPANS = _phrases(
    "every minute of it | every moment of it | every second of it | every bit of it | it"
)
_GENERIC_SPAN_WEIGHTS = (6.0, 2.0, 1.0, 1.0, 2.0)
_TIMES = _phrases(
    "last weekend | on Friday night | with my family | a few weeks ago | on a rainy afternoon | "
    "with some friends | last month | on my birthday | twice | yesterday"
)
_OPENERS = _phrases("Honestly | Overall | In short | To be fair | Well | So | All in all")
_NEUTRAL_LEADS = _phrases(
    "I did not know what to expect | I went in with no expectations | I had heard a lot about it "
    "| It was my first time | The first few minutes were quiet"
)


@dataclass(frozen=True)
class _Review:
    """Random lexical choices for one review; templates combine them into sentences."""

    rng: random.Random
    positive: bool
    thing: _Thing

    def adj(self) -> str:
        return _pick(self.rng, _ADJECTIVES[self.positive], _ADJ_WEIGHTS[self.positive])

    def two_adjs(self) -> tuple[str, str]:
        first = self.adj()
        second = self.adj()
        while second == first:
            second = self.adj()
        return first, second

    def subject(self) -> str:
        return _pick(self.rng, _SUBJECTS, _SUBJECT_WEIGHTS)

    def det(self) -> str:
        return _pick(self.rng, _DETERMINERS, _DET_WEIGHTS)

    def maybe_intens(self, p: float = 0.4) -> str:
        return _pick(self.rng, _INTENSIFIERS) + " " if self.rng.random() < p else ""

    def object_verb(self) -> str:
        verb = _pick(self.rng, _OBJECT_VERBS[self.positive], _VERB_WEIGHTS)
        return self._boost(verb)

    def span_verb(self) -> str:
        verb = _pick(self.rng, _SPAN_VERBS[self.positive], _VERB_WEIGHTS)
        return self._boost(verb)

    def _boost(self, verb: str) -> str:
        if " " in verb or self.rng.random() >= 0.25:
            return verb
        return f"{_pick(self.rng, _VERB_INTENSIFIERS)} {verb}"

    def span(self) -> str:
        if self.rng.random() < 0.25:
            return self.thing.span
        return _pick(self.rng, _GENERIC_SPANS, _GENERIC_SPAN_WEIGHTS)

    def recommend(self) -> str:
        return _pick(self.rng, _RECOMMEND[self.positive])


def _t_verb_comma_was(r: _Review) -> str:
    # "I loved this film, it was wonderful"
    return f"{r.subject()} {r.object_verb()} {r.det()} {r.thing.noun}, it was {r.maybe_intens(0.3)}{r.adj()}"


def _t_adjs_then_verb(r: _Review) -> str:
    # "A dull, terrible film. I hated every minute of it"
    first, second = r.two_adjs()
    return (
        f"{_cap(_article(first))} {first}, {second} {r.thing.noun}. {r.subject()} {r.span_verb()} {r.span()}"
    )


def _t_det_was_adj(r: _Review) -> str:
    return f"{_cap(r.det())} {r.thing.noun} was {r.maybe_intens()}{r.adj()}"


def _t_what_a(r: _Review) -> str:
    adj = r.adj()
    return f"What {_article(adj)} {adj} {r.thing.noun}!"


def _t_adj_and_adj(r: _Review) -> str:
    first, second = r.two_adjs()
    return f"{_cap(r.det())} {r.thing.noun} was {first} and {second}. {r.subject()} {r.object_verb()} it"


def _t_verb_then_was(r: _Review) -> str:
    first = f"{r.subject()} {r.span_verb()} {r.span()}"
    return f"{first}. {_cap(r.det())} {r.thing.noun} was {r.maybe_intens()}{r.adj()}"


def _t_it_was_a(r: _Review) -> str:
    intens = _pick(r.rng, _ATTRIBUTIVE_INTENSIFIERS) + " " if r.rng.random() < 0.3 else ""
    adj = r.adj()
    lead = _article(intens or adj)
    subj = r.subject()
    subj = subj if subj == "I" else subj.lower()
    return f"It was {lead} {intens}{adj} {r.thing.noun}, and {subj} {r.span_verb()} {r.span()}"


def _t_neutral_but(r: _Review) -> str:
    return f"{_pick(r.rng, _NEUTRAL_LEADS)}, but {r.det()} {r.thing.noun} was {r.maybe_intens()}{r.adj()}"


def _t_exclaim(r: _Review) -> str:
    return f"{_cap(r.adj())}! {r.subject()} {r.span_verb()} {r.span()}"


def _t_no_subject(r: _Review) -> str:
    verb = r.span_verb()
    return f"{_cap(verb)} {r.span()}. {_cap(r.adj())} {r.thing.noun}"


def _t_recommend(r: _Review) -> str:
    return f"{r.subject()} {r.object_verb()} {r.det()} {r.thing.noun}. {r.recommend()}"


def _t_critics(r: _Review) -> str:
    who = _pick(r.rng, _phrases("The critics | My friend | Everyone I know | She | He"))
    verb = _pick(r.rng, ("called", "found", "thought"))
    return f"{who} {verb} {r.det()} {r.thing.noun} {r.maybe_intens()}{r.adj()}"


def _t_intens_adj_noun(r: _Review) -> str:
    adj = r.adj()
    lead = _pick(r.rng, _phrases("Such {a} | A truly | A really | Simply {a} | {A}"))
    return f"{lead.format(a=_article(adj), A=_cap(_article(adj)))} {adj} {r.thing.noun}"


def _t_question(r: _Review) -> str:
    return f"{_cap(r.det())} {r.thing.noun}? {_cap(r.adj())}. {r.subject()} {r.object_verb()} it"


_TEMPLATES: tuple[tuple[Callable[[_Review], str], float], ...] = (
    (_t_verb_comma_was, 4.0),
    (_t_adjs_then_verb, 4.0),
    (_t_det_was_adj, 2.0),
    (_t_what_a, 1.0),
    (_t_adj_and_adj, 2.0),
    (_t_verb_then_was, 2.0),
    (_t_it_was_a, 2.0),
    (_t_neutral_but, 1.0),
    (_t_exclaim, 1.0),
    (_t_no_subject, 1.0),
    (_t_recommend, 2.0),
    (_t_critics, 1.0),
    (_t_intens_adj_noun, 1.0),
    (_t_question, 1.0),
)


def _filler(rng: random.Random, thing: _Thing) -> str:
    """A sentiment-free clause, so the label has to come from the review words, not the length."""
    subject = _pick(rng, ("I", "We", "My family", "My friends"))
    if rng.random() < 0.6:
        return f"{subject} {thing.experienced} {_pick(rng, _TIMES)}"
    return _pick(rng, _NEUTRAL_LEADS)


def make_review(rng: random.Random, positive: bool) -> str:
    """One review: a template, optional neutral filler and opener, varied punctuation and casing."""
    thing = _THINGS[rng.choices(range(len(_THINGS)), weights=_THING_WEIGHTS)[0]]
    review = _Review(rng=rng, positive=positive, thing=thing)
    template = rng.choices([t for t, _ in _TEMPLATES], weights=[w for _, w in _TEMPLATES])[0]
    text = template(review)
    if rng.random() < 0.12 and text[:1] != "I":
        text = f"{_pick(rng, _OPENERS)}, {text[:1].lower()}{text[1:]}"
    ending = _pick(rng, (".", "!", "!!", "...", ""), (6.0, 2.0, 0.5, 1.0, 2.5))
    if not text.endswith("!"):
        text += ending
    roll = rng.random()
    if roll < 0.15:
        sep = "." if text[-1:] not in ".!" else ""
        text = f"{text}{sep} {_filler(rng, thing)}."
    elif roll < 0.25:
        text = f"{_filler(rng, thing)}. {text}"
    casing = rng.random()
    if casing < 0.1:
        text = text.lower()
    elif casing < 0.12:
        text = text.upper()
    return text


def _classification_splits(
    rng: random.Random, n: int, eval_fraction: float, seed: int
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Unique reviews, split per class so both train and eval are balanced."""
    n_pos = (n + 1) // 2
    per_label = {
        "positive": _unique_reviews(rng, True, n_pos),
        "negative": _unique_reviews(rng, False, n - n_pos),
    }
    train: list[dict[str, str]] = []
    evals: list[dict[str, str]] = []
    for label, texts in per_label.items():
        part_train, part_eval = split_examples(texts, eval_fraction, seed)
        train += [{"text": t, "label": label} for t in part_train]
        evals += [{"text": t, "label": label} for t in part_eval]
    rng.shuffle(train)
    rng.shuffle(evals)
    return train, evals


def _unique_reviews(rng: random.Random, positive: bool, n: int) -> list[str]:
    """Texts distinct even after lowercasing and dropping punctuation, so eval holds no train sentence."""
    seen: dict[str, str] = {}
    attempts = 0
    while len(seen) < n:
        attempts += 1
        if attempts > 50 * n + 1000:
            raise ValueError(f"the review grammar cannot produce {n} distinct reviews")
        text = make_review(rng, positive)
        seen.setdefault(" ".join(_WORD.findall(text.lower())), text)
    return list(seen.values())


# --------------------------------------------------------------------------- QA facts

_SYLLABLES = _words(
    "bel cor dan fal gor hal kes lor mar nol pen quil ros sal tor val wen zan bri del mir ost tam vin"
)
_SURNAME_ENDS = _words("a o en ing son ley ard ez ov ini ston berg")
_CITY_ENDS = _words("ford ton burg ville mouth haven field port dale bridge")
_FIRST_NAMES = {
    "She": _words("Anna Maria Clara Elena Sofia Laura Nina Ruth Iris Helen Mara Vera"),
    "He": _words("Peter Jonas Victor Daniel Oskar Tomas Felix Hugo Simon Leon Karl Emil"),
}
_COUNTRIES = _words("Norland Estavia Merovia Calandra Ostria Belmara Quessia Tarvonia")
_PROFESSIONS = _words(
    "architect engineer chemist painter journalist teacher surgeon pilot composer lawyer botanist"
    " historian photographer carpenter economist"
)
_FIELDS = _words(
    "physics law medicine music architecture history economics chemistry philosophy mathematics "
    "biology literature"
)
_INDUSTRIES = _words(
    "software shipping textile aerospace publishing food energy robotics furniture insurance mining toy"
)
_COMPANY_ENDS = _words("Industries Systems Works Holdings Labs Group Motors Foods Press")
_PRODUCT_KINDS = _words("bicycle phone tractor camera lamp engine printer kettle radio")
_PRIZES = _phrases(
    "Golden Compass Prize | Silver Quill Award | Northern Star Medal | Harbor Prize | Laurel Award"
)
_KNOWN_FOR = _phrases(
    "annual lantern festival | glass factories | old harbor | botanical gardens | stone bridges |"
    " wine | cathedral | night market | clock tower | salt mines | jazz clubs | spring regatta"
)


class _Names:
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
        return _cap(_pick(self.rng, _SYLLABLES) + _pick(self.rng, _SYLLABLES))

    def person(self) -> tuple[str, str]:
        """A full name and its subject pronoun."""
        pronoun = _pick(self.rng, ("She", "He"))
        first = _pick(self.rng, _FIRST_NAMES[pronoun])
        return self._fresh(lambda: f"{first} {self._stem()}{_pick(self.rng, _SURNAME_ENDS)}"), pronoun

    def city(self) -> str:
        return self._fresh(lambda: self._stem() + _pick(self.rng, _CITY_ENDS))

    def company(self) -> str:
        return self._fresh(
            lambda: f"{self._stem()}{_pick(self.rng, _SURNAME_ENDS)} {_pick(self.rng, _COMPANY_ENDS)}"
        )

    def thing(self, kinds: Sequence[str]) -> str:
        return self._fresh(lambda: f"{self._stem()} {self.rng.randint(2, 9)} {_pick(self.rng, kinds)}")

    def river(self) -> str:
        return self._fresh(lambda: f"{self._stem()} River")

    def book(self) -> str:
        words = _words("Light River Winter Glass Harbor Stone Garden Silence Road Tower")
        return self._fresh(lambda: f"The {_pick(self.rng, words)} of {self._stem()}")


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


def _person_facts(rng: random.Random, names: _Names) -> list[_Fact]:
    born = int(_year(rng, 1850, 1960))
    job = _pick(rng, _PROFESSIONS)
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
            {"job": job, "art": _article(job)},
            ((("What was the profession of {name}?", "What did {name} work as?"), "job"),),
        ),
        _Fact(
            "{subj} studied {field} at the University of {uni}.",
            {"field": _pick(rng, _FIELDS), "uni": names.city()},
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
                "industry": (industry := _pick(rng, _INDUSTRIES)),
                "art_industry": _article(industry),
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
            {"prize": _pick(rng, _PRIZES), "pyear": str(born + rng.randint(30, 60))},
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


def _company_facts(rng: random.Random, names: _Names) -> list[_Fact]:
    industry = _pick(rng, _INDUSTRIES)
    return [
        _Fact(
            "{subj} is {art} {industry} company headquartered in {city}.",
            {"industry": industry, "art": _article(industry), "city": names.city()},
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
            {"country": _pick(rng, _COUNTRIES)},
            ((("Where did {name} open its first foreign office?",), "country"),),
        ),
    ]


def _city_facts(rng: random.Random, names: _Names) -> list[_Fact]:
    return [
        _Fact(
            "{subj} is a city in {country}.",
            {"country": _pick(rng, _COUNTRIES)},
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
            {"known": _pick(rng, _KNOWN_FOR)},
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


def _qa_article(rng: random.Random, names: _Names, index: int) -> dict[str, Any]:
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
            question = _pick(rng, phrasings).format(name=name, **fact.values)
            answer = {"text": fact.values[slot], "answer_start": pos + offsets[slot]}
            qas.append({"id": f"{qid}-{len(qas)}", "question": question, "answers": [answer]})
        sentences.append(sentence)
        pos += len(sentence) + 1
    return {"context": " ".join(sentences), "qas": qas}


def _qa_articles(rng: random.Random, n_questions: int) -> list[dict[str, Any]]:
    """Articles until exactly `n_questions` questions exist (the last article is trimmed)."""
    names = _Names(rng)
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


def _fact_paragraph(rng: random.Random, names: _Names | None = None) -> str:
    """A QA-style context as plain prose, for the language-modelling text."""
    article = _qa_article(rng, names or _Names(rng), 0)
    return " ".join(p["context"] for p in article["paragraphs"])


# --------------------------------------------------------------------------- plain sentences

_ANIMALS = _words("dog cat horse bird fox rabbit cow goat")
_PEOPLE = _words("teacher farmer child doctor neighbor baker student driver")
_PLACES = _words("river market station school park library garden harbor village cinema")
_MOTIONS = _words("walked ran drove went hurried wandered cycled")
_WHEN = _phrases(
    "in the morning | at noon | in the evening | at night | on Sunday | after lunch | every day |"
    " for a minute | every minute"
)
_ERRANDS = _phrases(
    "read a book | wrote a letter | watched a film | found a map | carried a basket of apples | "
    "made a cup of tea | bought a newspaper | sang a song | painted a picture | fixed a bicycle"
)
_MODIFIERS = _words("tired happy young old quiet busy clever small")
_ANIMAL_MOTIONS = _words("walked ran went hurried wandered")


def _simple_sentence(rng: random.Random) -> str:
    """Short declarative sentences, so the LM text is not only reviews and biographies."""
    modifier = _pick(rng, _MODIFIERS) + " " if rng.random() < 0.5 else ""
    person = rng.random() < 0.6
    who = f"the {modifier}{_pick(rng, _PEOPLE if person else _ANIMALS)}"
    moved = _pick(rng, _MOTIONS if person else _ANIMAL_MOTIONS)
    place = f"the {_pick(rng, _PLACES)}"
    shape = rng.randrange(5)
    if shape == 0:
        text = f"{who} {moved} to {place} {_pick(rng, _WHEN)}"
    elif shape == 1 and person:
        text = f"{who} {_pick(rng, _ERRANDS)} at {place}"
    elif shape == 2:
        weather = _pick(rng, ("cold", "warm", "quiet", "late", "early"))
        text = f"it was {weather} when {who} reached {place}"
    elif shape == 3:
        text = f"every {_pick(rng, ('morning', 'evening', 'week'))}, {who} {moved} to {place}"
    elif person:
        text = f"{who} {_pick(rng, _ERRANDS)} and then {moved} home"
    else:
        text = f"{who} {moved} past {place} and then lay down"
    return _cap(text) + "."


def _text_lines(rng: random.Random, n: int) -> list[str]:
    """Lines mixing reviews, fact paragraphs and simple sentences, in the proportions MLM/CLM need."""
    names = _Names(rng)
    lines: list[str] = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.4:
            count = rng.randint(1, 3)
            lines.append(" ".join(make_review(rng, rng.random() < 0.5) for _ in range(count)))
        elif kind < 0.7:
            lines.append(_fact_paragraph(rng, names))
        else:
            lines.append(" ".join(_simple_sentence(rng) for _ in range(rng.randint(2, 4))))
    return lines
