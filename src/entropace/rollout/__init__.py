"""entropace.rollout"""
