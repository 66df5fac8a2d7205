"""Knowledge-graph question answering with tools (AgentBench-KG style) over GeoNames.

The agent reads a multi-hop question and the entities it mentions, then calls one tool per turn
(:mod:`entropace.envs.kg.tools`) until it calls ``answer``. The answer is checked set-wise
(order-insensitive) against the gold entity set, or as a number; reward 1 on success, 0 else.
The episode ends at the answer (right or wrong) or at ``max_turns``.

Every step's info carries ``exact_match`` (1.0 for the exact gold set, the success criterion)
and ``f1`` (:func:`answer_f1`, AgentBench-KG's score), both 0.0 until the agent answers.

Options for AgentBench-KG's behaviour (``src/server/tasks/knowledgegraph/task.py`` and
``api.py`` of github:THUDM/AgentBench; all off by default so existing runs are unchanged):

* ``hide_members``: observations name a new variable's type only (``variable #3, which are
  instances of country``), never its members, count or value;
* ``final_answer``: the text ``Final Answer: #N`` answers with variable ``#N`` (AgentBench's
  regex ``(?:Find|Final) Answer: #(\\d+)`` on the reply before any ``Observation:``); it takes
  precedence over an ``Action:`` line, as in AgentBench v0.2's text protocol;
* ``reward``: ``"exact_match"`` (AgentBench's training reward ``int(is_correct)``) or ``"f1"``.
"""

from __future__ import annotations

import random
import re
from typing import Any

from entropace.envs.base import Policy, StepResult, action_too_long, check_difficulty
from entropace.envs.kg.graph import load_graph
from entropace.envs.kg.questions import Question
from entropace.envs.kg.splits import first_observation, pool, templates_of
from entropace.envs.kg.tools import ToolSession
from entropace.envs.splits import SplitUnavailable, split_of

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

#: The system prompt with ``hide_members``: the same tools, an example without member lists.
SYSTEM_PROMPT_HIDDEN = (
    SYSTEM_PROMPT.split("Results are stored")[0].replace(
        "the attributes of x (with their values for up to 3 entities)", "the attributes of x"
    )
    + """Results are stored in variables #0, #1, ... in order; the observation names each new \
variable and its type, not its members. Entity names are case-insensitive but must otherwise \
be exact.

Example:
Question: Which countries bordering Spain use the currency Euro (EUR)?
Action: get_neighbors(Spain, location.country.neighbours)
Observation: variable #0, which are instances of country
Action: get_neighbors(Euro (EUR), finance.currency.countries)
Observation: variable #1, which are instances of country
Action: intersection(#0, #1)
Observation: variable #2, which are instances of country
Action: answer(#2)"""
)

#: Appended to the system prompt with ``final_answer`` (AgentBench-KG's instruction).
FINAL_ANSWER_NOTE = (
    "\nYou may also end with a line 'Final Answer: #id', where id is the variable you determine "
    "to be the final answer (e.g. 'Final Answer: #3')."
)

#: AgentBench-KG's final-answer pattern (``task.py``: ``re.findall(r'(?:Find|Final) Answer: #(\d+)'``).
FINAL_ANSWER = re.compile(r"(?:Find|Final) Answer: #(\d+)")
#: Values of the ``reward`` option.
REWARDS = ("exact_match", "f1")


def answer_f1(predicted: frozenset[str], gold: frozenset[str]) -> float:
    """AgentBench-KG's F1 of a predicted answer set against the gold set.

    ``TP = |P & G|``, ``precision = TP / |P|``, ``recall = TP / |G|``,
    ``F1 = 2 * precision * recall / (precision + recall)``, and 0 when ``TP == 0`` (as
    ``KnowledgeGraph._calculate_f1`` in AgentBench's ``knowledgegraph/task.py``).
    """
    tp = len(predicted & gold)
    if tp == 0:
        return 0.0
    precision = tp / len(predicted)
    recall = tp / len(gold)
    return 2 * precision * recall / (precision + recall)


def _check_flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"kg: option {name} must be a bool (true/false), got {value!r}")
    return value


class KGEnv:
    """The ``kg`` family.

    Args:
        difficulty: ``easy`` (1-2 tool calls: capital, neighbours, currency users, counts),
            ``medium`` (2-3: intersections, argmax, counts), ``hard`` (3-4: chains of
            neighbours, argmax/argmin, filters and counts).
        hide_members: AgentBench's observations (type of a new variable only).
        final_answer: accept AgentBench's ``Final Answer: #N``.
        reward: ``"exact_match"`` (1.0 for the exact gold set, else 0.0) or ``"f1"``
            (:func:`answer_f1`); success is the exact match either way.
    """

    name = NAME

    def __init__(
        self,
        difficulty: str = "easy",
        hide_members: bool = False,
        final_answer: bool = False,
        reward: str = "exact_match",
    ) -> None:
        self.difficulty = check_difficulty(difficulty)
        self.hide_members = _check_flag("hide_members", hide_members)
        self.final_answer = _check_flag("final_answer", final_answer)
        if reward not in REWARDS:
            raise ValueError(f"kg: reward must be one of {list(REWARDS)}, got {reward!r}")
        self.reward = reward
        self.system_prompt = (SYSTEM_PROMPT_HIDDEN if hide_members else SYSTEM_PROMPT) + (
            FINAL_ANSWER_NOTE if final_answer else ""
        )
        self.max_turns = MAX_TURNS[difficulty]
        self.graph = load_graph()
        self.question: Question | None = None
        self.session: ToolSession | None = None

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        """Draw the instance of ``seed`` from its split's pool (:mod:`entropace.envs.kg.splits`):
        a template uniformly among those with instances in the split, then one instance."""
        split = split_of(seed)
        templates = templates_of(self.difficulty, split)
        if not templates:  # pragma: no cover - every split has instances at every difficulty
            raise SplitUnavailable(f"kg: no {self.difficulty} instances in split {split!r}")
        rng = random.Random(seed)
        template = rng.choice(templates)
        self.question = rng.choice(pool(template, self.difficulty, split))
        self.session = ToolSession(self.graph, hide_members=self.hide_members)
        q = self.question
        info = {
            "task": NAME,
            "seed": seed,
            "split": split,
            "difficulty": self.difficulty,
            "gold": q.gold_text,
            "template": q.template,
            "hops": q.hops,
        }
        return first_observation(q), info

    def step(self, action: str) -> StepResult:
        if self.session is None or self.question is None:
            raise RuntimeError("kg: step() called before reset()")
        too_long = action_too_long(action)
        if too_long is not None:
            return too_long, 0.0, False, False, _info(parse_error=True)
        final = self._final_answer(action) if self.final_answer else None
        if final is not None:
            return self.final(variable_index(final))
        return self._score(self.session.run(action))

    def final(self, index: int) -> StepResult:
        """AgentBench's ``Final Answer: #index``: answer with variable ``#index``.

        As AgentBench FC (``src/server/tasks/knowledgegraph/task.py`` lines 109-126 at commit
        578c5e9: ``variables_list[var_idx]`` raises ``IndexError``, the sample ends as
        ``AGENT_VALIDATION_FAILED``), an index with no variable ends the episode, reward 0;
        ``info["invalid_answer"]`` is True then.
        """
        if self.session is None or self.question is None:
            raise RuntimeError("kg: step() called before reset()")
        if not 0 <= index < len(self.session.variables):
            info = _info()
            info["invalid_answer"] = True
            have = len(self.session.variables)
            return (
                f"Variable #{index} does not exist ({have} variable{'s' if have != 1 else ''}). "
                "The episode is over.",
                0.0,
                True,
                False,
                info,
            )
        return self._score(self.session.answer(f"#{index}"))

    def _score(self, out: Any) -> StepResult:
        """The step result of a tool outcome: the observation, or the verdict of an answer."""
        if not out.answered:
            return out.observation, 0.0, False, False, _info(parse_error=out.parse_error)
        q = self.question
        if q.gold_number is not None:
            got = out.answer_number
            exact = got is not None and abs(got - q.gold_number) < 1e-9
            f1 = float(exact)  # a number answer is the one-element set {number}
            shown = "no number" if got is None else f"{got:g}"
        else:
            got_set = out.answer_entities
            exact = got_set is not None and got_set == q.gold_entities
            f1 = 0.0 if got_set is None else answer_f1(got_set, q.gold_entities or frozenset())
            shown = "a number" if got_set is None else f"{len(got_set)} entities"
        info = _info(success=exact, f1=f1)
        verdict = "Correct" if exact else f"Wrong ({shown})"
        reward = f1 if self.reward == "f1" else float(exact)
        return f"{verdict}. The episode is over.", reward, True, False, info

    @staticmethod
    def _final_answer(action: str) -> str | None:
        """The variable id of AgentBench's ``Final Answer: #N`` in ``action``, or None.

        As AgentBench: only the text before the first ``Observation:`` counts, ``\\_`` reads as
        ``_``, the first match wins, and leading zeros do not matter (``int(...)``).
        """
        text = action.split("Observation:", 1)[0].replace("\\_", "_")
        match = FINAL_ANSWER.search(text)
        return None if match is None else (match.group(1).lstrip("0") or "0")


def variable_index(digits: str) -> int:
    """The variable id of ``Final Answer: #<digits>`` as AgentBench's ``int(...)`` reads it;
    more than 9 digits (no such variable, and past Python's int-parsing limit) gives -1."""
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= 9 else -1


def _info(*, success: bool = False, parse_error: bool = False, f1: float = 0.0) -> dict[str, Any]:
    """A step's info: ``success``, ``parse_error``, ``exact_match`` and ``f1``."""
    return {
        "success": success,
        "parse_error": parse_error,
        "exact_match": float(success),
        "f1": f1,
    }


def oracle(env: Any) -> Policy:
    """Plays the instance's plan (the gold tool calls, then ``answer``) through ``step``.

    With ``final_answer`` on it ends with AgentBench's ``Final Answer: #N`` instead of
    ``Action: answer(#N)``, so that path is exercised too.
    """
    question = env.question
    if question is None:
        raise RuntimeError("kg oracle: call env.reset(seed) first")
    steps = list(question.plan)
    last = re.fullmatch(r"Action: answer\((#\d+)\)", steps[-1])
    if getattr(env, "final_answer", False) and last is not None:
        steps[-1] = f"Thought: {last.group(1)} is the answer.\nFinal Answer: {last.group(1)}"
    plan = iter(steps)

    def policy(observation: str) -> str:
        return next(plan, "Action: answer(#0)")

    return policy
