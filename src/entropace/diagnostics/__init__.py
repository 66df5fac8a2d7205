"""entropace.diagnostics"""
