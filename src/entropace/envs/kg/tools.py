"""The tools of the ``kg`` family (AgentBench-KG style) and their action parser.

An action is one tool call, on its own line after ``Action:`` (the last such line counts;
a bare one-line call is accepted too)::

    Action: get_neighbors(France, location.country.neighbours)

Tools (``x`` is an entity name or a variable ``#k``; ``#a``/``#b`` are variables):

====================================  ===========================================================
``get_relations(x)``                  relations leaving ``x`` (for a variable: of any member)
``get_neighbors(x, relation)``        entities reached from ``x`` by ``relation`` -> new variable
``intersection(#a, #b)``              entities in both -> new variable
``get_attributes(x)``                 attribute names (with values for up to 3 entities)
``argmax(#a, attribute)``             the member with the largest value -> new variable
``argmin(#a, attribute)``             the member with the smallest value -> new variable
``filter(#a, attribute, op, value)``  members with ``attribute op value`` (op: > >= < <= = !=)
``count(#a)``                         number of members -> new (number) variable
``answer(#a)`` / ``answer(value)``    final answer: a variable, an entity name or a number
====================================  ===========================================================

Every call that returns entities (or a number) stores it in the next variable ``#0, #1, ...``
and the observation says so, with a truncated list of members. With ``hide_members`` (the
``kg`` option of that name) the observation is AgentBench-KG's instead: ``variable #k, which are
instances of T`` or ``variable #k, which is a number`` only (no members, no count, no value:
AgentBench ``src/server/tasks/knowledgegraph/api.py``, ``get_neighbors``/``count``, lines 106 and
144 at commit 578c5e9), and ``get_relations`` / ``get_attributes`` give the bare list
``[a, b, ...]`` (api.py lines 86 and 173; attribute names only). :attr:`ToolSession.last_ok`
tells whether the last call succeeded (AgentBench words a failed call
``Error processing tool call: ...``, ``knowledgegraph/task.py`` line 193).
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from entropace.envs.kg.graph import KnowledgeGraph

#: Tool name -> number of arguments.
ARITY: dict[str, int] = {
    "get_relations": 1,
    "get_neighbors": 2,
    "intersection": 2,
    "get_attributes": 1,
    "argmax": 2,
    "argmin": 2,
    "filter": 4,
    "count": 1,
    "answer": 1,
}
#: Largest number of members listed in an observation.
MAX_LISTED = 20
#: Longest observation (characters).
MAX_OBSERVATION = 3000

_CALL = re.compile(r"`*\s*([A-Za-z_]+)\s*\((.*)\)\s*`*\.?\s*", re.DOTALL)
_VAR = re.compile(r"#(\d{1,6})")
_OPS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "=": operator.eq,
    "==": operator.eq,
    "!=": operator.ne,
}


@dataclass(frozen=True)
class Call:
    """A parsed tool call: ``tool(args[0], args[1], ...)``, arguments stripped of quotes."""

    tool: str
    args: tuple[str, ...]

    def render(self) -> str:
        """The action string of this call (parses back to the same call)."""
        return f"Action: {self.tool}({', '.join(self.args)})"


def _short(text: str, n: int = 60) -> str:
    text = text.replace("\n", " ")
    return repr(text if len(text) <= n else text[:n] + "...")


def _clean(arg: str) -> str:
    arg = arg.strip()
    if len(arg) >= 2 and arg[0] == arg[-1] and arg[0] in "'\"`":
        arg = arg[1:-1].strip()
    return arg


def parse_action(text: str) -> Call | str:
    """Parse an action; returns the :class:`Call` or an error message (never raises)."""
    lines = text.splitlines()
    marked = [ln for ln in lines if ln.strip().lower().startswith("action:")]
    if marked:
        body = marked[-1].strip()[len("action:") :].strip()
    elif len(lines) == 1:
        body = lines[0].strip()
    else:
        return (
            "No action found. End your reply with one line 'Action: tool(arguments)', "
            "e.g. 'Action: get_relations(France)'."
        )
    if len(body) > 1000:
        return "The action is too long (over 1000 characters)."
    match = _CALL.fullmatch(body)
    if match is None:
        return f"Could not parse {_short(body)} as a call 'tool(arguments)'. Tools: {', '.join(ARITY)}."
    tool, inner = match.group(1).lower(), match.group(2)
    if tool not in ARITY:
        return f"Unknown tool {_short(tool)}. Tools: {', '.join(ARITY)}."
    arity = ARITY[tool]
    # Entity names may contain commas, the other arguments never do: split from the right,
    # except for filter, whose last argument is a number that may have thousands separators.
    parts = inner.split(",", arity - 1) if tool == "filter" else inner.rsplit(",", arity - 1)
    args = tuple(_clean(a) for a in parts) if arity > 1 else (_clean(inner),)
    if len(args) != arity or any(not a for a in args):
        return f"{tool} takes {arity} non-empty argument(s); got {_short(inner)}."
    return Call(tool, args)


@dataclass(frozen=True)
class Variable:
    """A stored result: a set of entities (sorted) or a number."""

    entities: tuple[str, ...] = ()
    number: float | None = None


@dataclass
class Outcome:
    """What one action did: the observation, whether it was unparseable, the final answer."""

    observation: str
    parse_error: bool = False
    answered: bool = False
    answer_entities: frozenset[str] | None = None
    answer_number: float | None = None
    #: the call did what it asked (a listing, a new variable or an answer), not an error
    ok: bool = False


@dataclass
class ToolSession:
    """The variables of one episode and the tool implementations over ``graph``."""

    graph: KnowledgeGraph
    variables: list[Variable] = field(default_factory=list)
    #: AgentBench's observations: a new variable's type only, never its members or value.
    hide_members: bool = False
    #: whether the last :meth:`run` succeeded (False after an error message)
    last_ok: bool = False

    # ------------------------------------------------------------------ helpers
    def _store(self, var: Variable, what: str) -> str:
        self.variables.append(var)
        k = len(self.variables) - 1
        if var.number is not None:
            if self.hide_members:
                return f"variable #{k}, which is a number"
            return f"{what}\nVariable #{k}, which is a number: {_fmt(var.number)}"
        kinds = {self.graph.types[e] for e in var.entities}
        kind = kinds.pop() if len(kinds) == 1 else "entity"
        if self.hide_members:
            return f"variable #{k}, which are instances of {kind}"
        shown = ", ".join(var.entities[:MAX_LISTED])
        more = (
            f", ... ({len(var.entities) - MAX_LISTED} more)"
            if len(var.entities) > MAX_LISTED
            else ""
        )
        return (
            f"{what}\nVariable #{k}, which are instances of {kind} "
            f"({len(var.entities)} entities): [{shown}{more}]"
        )

    def _variable(self, arg: str) -> Variable | str:
        m = _VAR.fullmatch(arg)
        if m is None:
            return f"{_short(arg)} is not a variable; variables look like #0, #1, ..."
        k = int(m.group(1))
        if k >= len(self.variables):
            have = f"#0..#{len(self.variables) - 1}" if self.variables else "none yet"
            return f"Variable #{k} does not exist (variables: {have})."
        return self.variables[k]

    def _entities(self, arg: str) -> tuple[str, ...] | str:
        """Entities named by ``arg``: a variable's members or one entity name."""
        if arg.startswith("#"):
            var = self._variable(arg)
            if isinstance(var, str):
                return var
            if var.number is not None:
                return f"{arg} is a number, not a set of entities."
            return var.entities
        entity = self.graph.lookup(arg)
        if entity is None:
            hint = self.graph.suggest(arg)
            did = f" Did you mean: {', '.join(hint)}?" if hint else ""
            return f"Unknown entity {_short(arg)}.{did} Use exact names from the question."
        return (entity,)

    def _numeric(self, entities: tuple[str, ...], attribute: str) -> dict[str, float] | str:
        values = {
            e: v
            for e in entities
            if isinstance(v := self.graph.attrs[e].get(attribute), int | float)
        }
        if not values:
            names = sorted({a for e in entities for a in self.graph.attrs[e]})
            return f"No member has a numeric attribute {_short(attribute)}; attributes: {names}."
        return values

    # ------------------------------------------------------------------ tools
    def get_relations(self, x: str) -> Outcome:
        ents = self._entities(x)
        if isinstance(ents, str):
            return Outcome(ents)
        rels = sorted({r for e in ents for r in self.graph.relations(e)})
        if self.hide_members:
            return Outcome(f"[{', '.join(rels)}]", ok=True)
        return Outcome(f"Relations of {_label(x, ents)}: [{', '.join(rels)}]", ok=True)

    def get_neighbors(self, x: str, relation: str) -> Outcome:
        ents = self._entities(x)
        if isinstance(ents, str):
            return Outcome(ents)
        rels = sorted({r for e in ents for r in self.graph.relations(e)})
        rel = relation.strip().lower()
        if rel not in rels:
            return Outcome(
                f"{_label(x, ents)} has no relation {_short(relation)}; relations: {rels}."
            )
        out = sorted({t for e in ents for t in self.graph.neighbors(e, rel)})
        if not out:
            return Outcome(f"get_neighbors({x}, {rel}) is empty; no variable was created.")
        return Outcome(
            self._store(Variable(tuple(out)), f"Neighbors of {_label(x, ents)} via {rel}."),
            ok=True,
        )

    def intersection(self, a: str, b: str) -> Outcome:
        va, vb = self._variable(a), self._variable(b)
        for v in (va, vb):
            if isinstance(v, str):
                return Outcome(v)
            if v.number is not None:
                return Outcome("intersection needs two entity variables, not numbers.")
        assert isinstance(va, Variable) and isinstance(vb, Variable)
        out = sorted(set(va.entities) & set(vb.entities))
        if not out:
            return Outcome(f"The intersection of {a} and {b} is empty; no variable was created.")
        return Outcome(self._store(Variable(tuple(out)), f"Intersection of {a} and {b}."), ok=True)

    def get_attributes(self, x: str) -> Outcome:
        ents = self._entities(x)
        if isinstance(ents, str):
            return Outcome(ents)
        if len(ents) <= 3 and not self.hide_members:
            parts = [
                f"{e}: "
                + ", ".join(f"{k}={_fmt(v)}" for k, v in sorted(self.graph.attrs[e].items()))
                for e in ents
            ]
            return Outcome("Attributes of " + "; ".join(parts), ok=True)
        names = sorted({a for e in ents for a in self.graph.attrs[e]})
        if self.hide_members:
            return Outcome(f"[{', '.join(names)}]", ok=True)
        return Outcome(f"Attributes of {_label(x, ents)}: [{', '.join(names)}]", ok=True)

    def _extreme(self, a: str, attribute: str, largest: bool) -> Outcome:
        var = self._variable(a)
        if isinstance(var, str) or var.number is not None:
            return Outcome(var if isinstance(var, str) else f"{a} is a number, not entities.")
        values = self._numeric(var.entities, attribute.strip().lower())
        if isinstance(values, str):
            return Outcome(values)
        pick = (max if largest else min)(sorted(values), key=values.__getitem__)
        what = f"{'argmax' if largest else 'argmin'} of {a} by {attribute.strip().lower()}."
        return Outcome(self._store(Variable((pick,)), what), ok=True)

    def argmax(self, a: str, attribute: str) -> Outcome:
        return self._extreme(a, attribute, largest=True)

    def argmin(self, a: str, attribute: str) -> Outcome:
        return self._extreme(a, attribute, largest=False)

    def filter(self, a: str, attribute: str, op: str, value: str) -> Outcome:
        var = self._variable(a)
        if isinstance(var, str) or var.number is not None:
            return Outcome(var if isinstance(var, str) else f"{a} is a number, not entities.")
        if op.strip() not in _OPS:
            return Outcome(f"Unknown comparison {_short(op)}; use one of {' '.join(_OPS)}.")
        threshold = parse_number(value)
        if threshold is None:
            return Outcome(f"{_short(value)} is not a number.")
        values = self._numeric(var.entities, attribute.strip().lower())
        if isinstance(values, str):
            return Outcome(values)
        cmp = _OPS[op.strip()]
        out = sorted(e for e, v in values.items() if cmp(v, threshold))
        if not out:
            return Outcome(
                f"No member of {a} has {attribute.strip()} {op.strip()} {value}; no variable was created."
            )
        return Outcome(self._store(Variable(tuple(out)), f"Filter of {a}."), ok=True)

    def count(self, a: str) -> Outcome:
        var = self._variable(a)
        if isinstance(var, str) or var.number is not None:
            return Outcome(var if isinstance(var, str) else f"{a} is already a number.")
        return Outcome(self._store(Variable(number=len(var.entities)), f"Count of {a}."), ok=True)

    def answer(self, x: str) -> Outcome:
        if x.startswith("#"):
            var = self._variable(x)
            if isinstance(var, str):
                return Outcome(var)
            if var.number is not None:
                return Outcome("", answered=True, answer_number=var.number, ok=True)
            return Outcome("", answered=True, answer_entities=frozenset(var.entities), ok=True)
        number = parse_number(x)
        if number is not None:
            return Outcome("", answered=True, answer_number=number, ok=True)
        entity = self.graph.lookup(x)
        return Outcome("", answered=True, answer_entities=frozenset({entity or x}), ok=True)

    # ------------------------------------------------------------------ dispatch
    def run(self, action: str) -> Outcome:
        """Parse and execute one action (never raises)."""
        call = parse_action(action)
        if isinstance(call, str):
            self.last_ok = False
            return Outcome(call, parse_error=True)
        out: Outcome = getattr(self, call.tool)(*call.args)
        self.last_ok = out.ok
        if len(out.observation) > MAX_OBSERVATION:
            out.observation = out.observation[:MAX_OBSERVATION] + " ... [truncated]"
        return out


def parse_number(text: str) -> float | None:
    """``"1,234"``, ``"1_000"``, ``"5"``, ``"2.5e6"`` -> float; None if not a finite number."""
    cleaned = text.strip().replace(",", "").replace("_", "")
    if len(cleaned) > 40:
        return None
    try:
        value = float(cleaned)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _fmt(value: object) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


def _label(arg: str, entities: tuple[str, ...]) -> str:
    return arg if arg.startswith("#") else entities[0]
