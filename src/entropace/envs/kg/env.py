"""Knowledge-graph question answering with tools (AgentBench-KG style) over GeoNames.

The agent reads a multi-hop question and the entities it mentions, then calls one tool per turn
(:mod:`entropace.envs.kg.tools`) until it calls ``answer``. The answer is checked set-wise
(order-insensitive) against the gold entity set, or as a number; reward 1 on success, 0 else.
The episode ends at the answer (right or wrong) or at ``max_turns``.
"""

from __future__ import annotations

import random
from typing import Any

from entropace.envs.base import Policy, StepResult, action_too_long, check_difficulty
from entropace.envs.kg.graph import load_graph
from entropace.envs.kg.questions import TEMPLATES, Question, instances
from entropace.envs.kg.tools import ToolSession

NAME = "kg"

#: Turn budget per difficulty (the oracle needs 2 / 3-4 / 4-5 actions).
MAX_TURNS: dict[str, int] = {"easy": 8, "medium": 10, "hard": 15}

SYSTEM_PROMPT = """You answer questions about world geography by querying a knowledge graph \
with tools. Each turn, think briefly if you like, then end your reply with exactly one line:
Action: tool(arguments)

Tools (x is an exact entity name or a variable like #0; #a and #b are variables):
- get_relations(x): the relations you can follow from x.
- get_neighbors(x, relation): the entities linked to x by relation; stored as a new variable.
- intersection(#a, #b): the entities in both variables; stored as a new variable.
- get_attributes(x): the attributes of x (with their values for up to 3 entities).
- argmax(#a, attribute) / argmin(#a, attribute): the member with the largest / smallest \
numeric attribute (e.g. population); stored as a new variable.
- filter(#a, attribute, op, value): the members with attribute op value (op is one of \
> >= < <= = !=); stored as a new variable.
- count(#a): the number of members; stored as a new variable.
- answer(#a) or answer(value): your final answer (a variable, an entity name or a number). \
It ends the episode.
Results are stored in variables #0, #1, ... in order; the observation tells you each new \
variable. Entity names are case-insensitive but must otherwise be exact.

Example:
Question: Which countries bordering Spain use the currency Euro (EUR)?
Action: get_neighbors(Spain, location.country.neighbours)
Observation: Variable #0, which are instances of country (5 entities): [Andorra, France, \
Gibraltar, Morocco, Portugal]
Action: get_neighbors(Euro (EUR), finance.currency.countries)
Observation: Variable #1, ...
Action: intersection(#0, #1)
Observation: Variable #2, which are instances of country (3 entities): [Andorra, France, \
Portugal]
Action: answer(#2)"""


class KGEnv:
    """The ``kg`` family.

    Args:
        difficulty: ``easy`` (1-2 tool calls: capital, neighbours, currency users, counts),
            ``medium`` (2-3: intersections, argmax, counts), ``hard`` (3-4: chains of
            neighbours, argmax/argmin, filters and counts).
    """

    name = NAME
    system_prompt = SYSTEM_PROMPT

    def __init__(self, difficulty: str = "easy") -> None:
        self.difficulty = check_difficulty(difficulty)
        self.max_turns = MAX_TURNS[difficulty]
        self.graph = load_graph()
        self.question: Question | None = None
        self.session: ToolSession | None = None

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        if not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        rng = random.Random(seed)
        template = rng.choice(TEMPLATES[self.difficulty])
        self.question = rng.choice(instances(template))
        self.session = ToolSession(self.graph)
        q = self.question
        obs = f"Question: {q.text}\nEntities: [{', '.join(q.entities)}]"
        info = {
            "task": NAME,
            "seed": seed,
            "difficulty": self.difficulty,
            "gold": q.gold_text,
            "template": q.template,
            "hops": q.hops,
        }
        return obs, info

    def step(self, action: str) -> StepResult:
        if self.session is None or self.question is None:
            raise RuntimeError("kg: step() called before reset()")
        too_long = action_too_long(action)
        if too_long is not None:
            return too_long, 0.0, False, False, {"success": False, "parse_error": True}
        out = self.session.run(action)
        info: dict[str, Any] = {"success": False, "parse_error": out.parse_error}
        if not out.answered:
            return out.observation, 0.0, False, False, info
        q = self.question
        if q.gold_number is not None:
            got = out.answer_number
            success = got is not None and abs(got - q.gold_number) < 1e-9
            shown = "no number" if got is None else f"{got:g}"
        else:
            got_set = out.answer_entities
            success = got_set is not None and got_set == q.gold_entities
            shown = "a number" if got_set is None else f"{len(got_set)} entities"
        info["success"] = success
        verdict = "Correct" if success else f"Wrong ({shown})"
        return f"{verdict}. The episode is over.", float(success), True, False, info


def oracle(env: Any) -> Policy:
    """Plays the instance's plan (the gold tool calls, then ``answer``) through ``step``."""
    question = env.question
    if question is None:
        raise RuntimeError("kg oracle: call env.reset(seed) first")
    plan = iter(question.plan)

    def policy(observation: str) -> str:
        return next(plan, "Action: answer(#0)")

    return policy
