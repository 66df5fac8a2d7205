"""Content splits of the ``kg`` family: which question instances each split may draw.

The shared interface is :mod:`entropace.envs.splits` (seed ranges, fingerprints, hash buckets);
this module builds the ``kg`` pools over :data:`~entropace.envs.kg.questions.TEMPLATES`:

* **held-out entities**: every country, city, currency, time zone and US state whose name
  hashes into the held-out bucket (:data:`UNSEEN_ENTITY_FRACTION`, salt ``"kg/entity"``;
  continents, only 7, are never held out);
* **held-out relation paths**: whole templates, one per difficulty (:data:`UNSEEN_TEMPLATES`),
  whose chain of relations and operators no other template of that difficulty uses;
* ``test_unseen``: every instance of a held-out template, and every instance of the other
  templates whose question or gold answer names a held-out entity;
* the rest is split by its fingerprint (:func:`~entropace.envs.splits.fingerprint` of the first
  observation and the gold answer): ``test`` when it hashes into :data:`TEST_FRACTION`
  (salt ``"kg/test"``), ``train`` otherwise.

So no ``test`` or ``test_unseen`` fingerprint occurs in ``train``, no ``train`` instance names
a held-out entity in its question or answer, and no held-out template has a ``train`` instance.
Pools are computed once per process per template and difficulty (a few seconds per
difficulty: every instance is fingerprinted).
"""

from __future__ import annotations

from functools import cache

from entropace.envs.kg.graph import load_graph
from entropace.envs.kg.questions import TEMPLATES, Question, Template, instances
from entropace.envs.splits import Split, fingerprint, in_test_bucket

#: Share of the seen instances (by fingerprint) that form ``test``.
TEST_FRACTION = 0.1
#: Share of the entities (countries, cities, currencies, time zones, states) held out.
UNSEEN_ENTITY_FRACTION = 0.1
#: Entity types that can be held out (continents cannot: there are 7).
HELD_OUT_TYPES = frozenset({"country", "city", "currency", "time_zone", "state"})
#: difficulty -> the templates (relation paths) that only ``test_unseen`` draws.
UNSEEN_TEMPLATES: dict[str, tuple[str, ...]] = {
    "easy": ("country_time_zones",),  # country -> time zones
    "medium": ("city_currency",),  # city -> country -> currency
    "hard": ("count_big_cities_of_time_zone",),  # time zone -> cities -> filter -> count
}


def first_observation(q: Question) -> str:
    """What the agent sees at reset (:meth:`entropace.envs.kg.env.KGEnv.reset`)."""
    return f"Question: {q.text}\nEntities: [{', '.join(q.entities)}]"


def question_fingerprint(q: Question) -> str:
    """The instance's fingerprint: first observation plus gold answer."""
    return fingerprint(first_observation(q), q.gold_text)


@cache
def held_out_entity(name: str) -> bool:
    """Whether entity ``name`` is held out for ``test_unseen``."""
    kind = load_graph().types.get(name)
    return kind in HELD_OUT_TYPES and in_test_bucket(name, UNSEEN_ENTITY_FRACTION, "kg/entity")


def units(q: Question) -> frozenset[str]:
    """The entities an instance is made of: those in its question and its gold answer."""
    return frozenset(q.entities) | (q.gold_entities or frozenset())


def split_of_question(q: Question, difficulty: str) -> Split:
    """The split whose pool holds ``q`` (see the module docstring)."""
    if q.template in UNSEEN_TEMPLATES[difficulty] or any(held_out_entity(e) for e in units(q)):
        return "test_unseen"
    return "test" if in_test_bucket(question_fingerprint(q), TEST_FRACTION, "kg/test") else "train"


@cache
def _pools(template: Template, difficulty: str) -> dict[str, tuple[Question, ...]]:
    out: dict[str, list[Question]] = {"train": [], "test": [], "test_unseen": []}
    for q in instances(template):
        out[split_of_question(q, difficulty)].append(q)
    return {k: tuple(v) for k, v in out.items()}


def pool(template: Template, difficulty: str, split: Split) -> tuple[Question, ...]:
    """The instances of ``template`` (of ``difficulty``) that ``split`` draws, in a fixed order."""
    return _pools(template, difficulty)[split]


def templates_of(difficulty: str, split: Split) -> tuple[Template, ...]:
    """The templates of ``difficulty`` with at least one instance in ``split``."""
    return tuple(t for t in TEMPLATES[difficulty] if pool(t, difficulty, split))


def pool_sizes(difficulty: str) -> dict[str, dict[str, int]]:
    """split -> template name -> number of instances (for ``envs stats`` and the docs)."""
    return {
        split: {t.__name__: len(pool(t, difficulty, split)) for t in TEMPLATES[difficulty]}
        for split in ("train", "test", "test_unseen")
    }


def pool_counts(difficulty: str) -> dict[str, int]:
    """Pool sizes per split and the held-out units (``EnvSpec.pools`` / ``envs stats``)."""
    from entropace.envs.kg.graph import load_graph

    sizes = pool_sizes(difficulty)
    out = {f"instances {split}": sum(by.values()) for split, by in sizes.items()}
    graph = load_graph()
    out["held-out entities"] = sum(held_out_entity(e) for e in graph.types)
    out["held-out templates"] = len(UNSEEN_TEMPLATES[difficulty])
    out["templates"] = len(TEMPLATES[difficulty])
    return out
