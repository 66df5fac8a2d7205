"""entropace.report"""
