"""Section 8, the budget: ``budget`` (memory = weights + KV bytes per token x tokens + a reserve).
"""
