"""entropace: entropy-aware policy optimisation for multi-task RL of LLM agents.

Subpackages:
    algos        pure tensor functions (token statistics, polarity, advantages, losses)
    control      stateful controllers (EPPO entropy pacer, PAPO polarity controller, BAPO)
    diagnostics  pace-mismatch and polarity diagnostics
    envs         multi-turn text environments (db, kg, reasoning, os, household, shop)
    rollout      batched multi-turn generation
    models       model loading (HF causal LMs, the embedded SmolLM2-135M, tiny test models)
    train        the trainer
    report       plots and summaries of runs
"""

__version__ = "0.1.0"
