"""Section 7, distillation: ``distill`` (soft labels and temperature).
"""
