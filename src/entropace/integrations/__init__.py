"""entropace.integrations"""
