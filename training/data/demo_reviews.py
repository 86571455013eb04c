"""Demo sentiment reviews: short movie and product reviews drawn from templates, labelled by the polarity they
were drawn with (the classification task's demo data)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from training.data.grammar import WORD, cap, indefinite_article, phrases, pick, words
from training.data.loaders import split_examples


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
    True: words(
        "wonderful great excellent brilliant delightful superb fantastic amazing charming "
        "beautiful lovely moving enjoyable gripping memorable impressive outstanding terrific "
        "marvelous fun heartwarming clever good perfect"
    ),
    False: words(
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
    True: words("loved enjoyed adored liked treasured appreciated"),
    False: phrases("hated | despised | disliked | loathed | could not stand | detested"),
}
_SPAN_VERBS = {
    True: words("loved enjoyed adored savored relished treasured"),
    False: words("hated despised regretted loathed resented detested"),
}
_VERB_WEIGHTS = (5.0, 3.0, 2.0, 1.0, 1.0, 1.0)
_RECOMMEND = {
    True: ("I would recommend it to anyone", "Highly recommended", "Five stars", "I would go again"),
    False: ("I would not recommend it to anyone", "Not recommended", "One star", "Never again"),
}
_SUBJECTS = phrases("I | We | She | He | My friend | My sister | My dad | The critics | Everyone")
_SUBJECT_WEIGHTS = (10.0, 3.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)
_DETERMINERS = ("this", "the", "that")
_DET_WEIGHTS = (5.0, 3.0, 1.0)
_INTENSIFIERS = words("really truly absolutely very so incredibly totally genuinely utterly quite")
_ATTRIBUTIVE_INTENSIFIERS = words("really truly very incredibly utterly genuinely")
_VERB_INTENSIFIERS = words("really truly absolutely genuinely just")
_GENERIC_SPANS = phrases(
    "every minute of it | every moment of it | every second of it | every bit of it | it"
)
_GENERIC_SPAN_WEIGHTS = (6.0, 2.0, 1.0, 1.0, 2.0)
_TIMES = phrases(
    "last weekend | on Friday night | with my family | a few weeks ago | on a rainy afternoon | "
    "with some friends | last month | on my birthday | twice | yesterday"
)
_OPENERS = phrases("Honestly | Overall | In short | To be fair | Well | So | All in all")
_NEUTRAL_LEADS = phrases(
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
        return pick(self.rng, _ADJECTIVES[self.positive], _ADJ_WEIGHTS[self.positive])

    def two_adjs(self) -> tuple[str, str]:
        first = self.adj()
        second = self.adj()
        while second == first:
            second = self.adj()
        return first, second

    def subject(self) -> str:
        return pick(self.rng, _SUBJECTS, _SUBJECT_WEIGHTS)

    def det(self) -> str:
        return pick(self.rng, _DETERMINERS, _DET_WEIGHTS)

    def maybe_intens(self, p: float = 0.4) -> str:
        return pick(self.rng, _INTENSIFIERS) + " " if self.rng.random() < p else ""

    def object_verb(self) -> str:
        verb = pick(self.rng, _OBJECT_VERBS[self.positive], _VERB_WEIGHTS)
        return self._boost(verb)

    def span_verb(self) -> str:
        verb = pick(self.rng, _SPAN_VERBS[self.positive], _VERB_WEIGHTS)
        return self._boost(verb)

    def _boost(self, verb: str) -> str:
        if " " in verb or self.rng.random() >= 0.25:
            return verb
        return f"{pick(self.rng, _VERB_INTENSIFIERS)} {verb}"

    def span(self) -> str:
        if self.rng.random() < 0.25:
            return self.thing.span
        return pick(self.rng, _GENERIC_SPANS, _GENERIC_SPAN_WEIGHTS)

    def recommend(self) -> str:
        return pick(self.rng, _RECOMMEND[self.positive])


def _t_verb_comma_was(r: _Review) -> str:
    # "I loved this film, it was wonderful"
    return f"{r.subject()} {r.object_verb()} {r.det()} {r.thing.noun}, it was {r.maybe_intens(0.3)}{r.adj()}"


def _t_adjs_then_verb(r: _Review) -> str:
    # "A dull, terrible film. I hated every minute of it"
    first, second = r.two_adjs()
    a = cap(indefinite_article(first))
    return f"{a} {first}, {second} {r.thing.noun}. {r.subject()} {r.span_verb()} {r.span()}"


def _t_det_was_adj(r: _Review) -> str:
    return f"{cap(r.det())} {r.thing.noun} was {r.maybe_intens()}{r.adj()}"


def _t_what_a(r: _Review) -> str:
    adj = r.adj()
    return f"What {indefinite_article(adj)} {adj} {r.thing.noun}!"


def _t_adj_and_adj(r: _Review) -> str:
    first, second = r.two_adjs()
    return f"{cap(r.det())} {r.thing.noun} was {first} and {second}. {r.subject()} {r.object_verb()} it"


def _t_verb_then_was(r: _Review) -> str:
    first = f"{r.subject()} {r.span_verb()} {r.span()}"
    return f"{first}. {cap(r.det())} {r.thing.noun} was {r.maybe_intens()}{r.adj()}"


def _t_it_was_a(r: _Review) -> str:
    intens = pick(r.rng, _ATTRIBUTIVE_INTENSIFIERS) + " " if r.rng.random() < 0.3 else ""
    adj = r.adj()
    lead = indefinite_article(intens or adj)
    subj = r.subject()
    subj = subj if subj == "I" else subj.lower()
    return f"It was {lead} {intens}{adj} {r.thing.noun}, and {subj} {r.span_verb()} {r.span()}"


def _t_neutral_but(r: _Review) -> str:
    return f"{pick(r.rng, _NEUTRAL_LEADS)}, but {r.det()} {r.thing.noun} was {r.maybe_intens()}{r.adj()}"


def _t_exclaim(r: _Review) -> str:
    return f"{cap(r.adj())}! {r.subject()} {r.span_verb()} {r.span()}"


def _t_no_subject(r: _Review) -> str:
    verb = r.span_verb()
    return f"{cap(verb)} {r.span()}. {cap(r.adj())} {r.thing.noun}"


def _t_recommend(r: _Review) -> str:
    return f"{r.subject()} {r.object_verb()} {r.det()} {r.thing.noun}. {r.recommend()}"


def _t_critics(r: _Review) -> str:
    who = pick(r.rng, phrases("The critics | My friend | Everyone I know | She | He"))
    verb = pick(r.rng, ("called", "found", "thought"))
    return f"{who} {verb} {r.det()} {r.thing.noun} {r.maybe_intens()}{r.adj()}"


def _t_intens_adj_noun(r: _Review) -> str:
    adj = r.adj()
    lead = pick(r.rng, phrases("Such {a} | A truly | A really | Simply {a} | {A}"))
    return f"{lead.format(a=indefinite_article(adj), A=cap(indefinite_article(adj)))} {adj} {r.thing.noun}"


def _t_question(r: _Review) -> str:
    return f"{cap(r.det())} {r.thing.noun}? {cap(r.adj())}. {r.subject()} {r.object_verb()} it"


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
    subject = pick(rng, ("I", "We", "My family", "My friends"))
    if rng.random() < 0.6:
        return f"{subject} {thing.experienced} {pick(rng, _TIMES)}"
    return pick(rng, _NEUTRAL_LEADS)


def make_review(rng: random.Random, positive: bool) -> str:
    """One review: a template, optional neutral filler and opener, varied punctuation and casing."""
    thing = _THINGS[rng.choices(range(len(_THINGS)), weights=_THING_WEIGHTS)[0]]
    review = _Review(rng=rng, positive=positive, thing=thing)
    template = rng.choices([t for t, _ in _TEMPLATES], weights=[w for _, w in _TEMPLATES])[0]
    text = template(review)
    if rng.random() < 0.12 and text[:1] != "I":
        text = f"{pick(rng, _OPENERS)}, {text[:1].lower()}{text[1:]}"
    ending = pick(rng, (".", "!", "!!", "...", ""), (6.0, 2.0, 0.5, 1.0, 2.5))
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


def classification_splits(
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
        seen.setdefault(" ".join(WORD.findall(text.lower())), text)
    return list(seen.values())
