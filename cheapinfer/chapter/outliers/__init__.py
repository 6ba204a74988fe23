"""Section 4, activation outliers: ``outliers`` (the residual stream's outlier dimensions and their levels).
"""
