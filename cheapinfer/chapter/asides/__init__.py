"""Section 9, the asides: ``asides`` (fused attention without the n x n scores).
"""
