"""Section 6, speculative decoding: ``speculative`` (the arithmetic, the acceptance rules and the loop).
"""
