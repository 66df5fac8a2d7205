"""entropace.train"""
