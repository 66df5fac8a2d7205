"""entropace.control"""
