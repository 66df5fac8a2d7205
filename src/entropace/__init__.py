"""entropace: entropy-aware policy optimisation for multi-task RL of LLM agents.

Subpackages:
    algos        pure tensor functions (token statistics, polarity, advantages, losses)
    control      stateful controllers (EPPO entropy pacer, PAPO polarity controller, BAPO)
    diagnostics  pace-mismatch and polarity diagnostics
    envs         multi-turn text environments (db, kg, reasoning, os, household, shop)
    rollout      batched multi-turn generation
    train        the trainer
    report       plots and summaries of runs
    integrations TRL / verl plug-ins
"""

__version__ = "0.1.0"
