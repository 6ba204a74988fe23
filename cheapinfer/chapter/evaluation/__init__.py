"""Section 5, does quantization hurt?: ``evaluation`` (agreement and the table), ``perplexity``, ``battery`` (the factual
battery). Their statistics (the battery's interval and paired test, the agreement's independence) are
:mod:`cheapinfer.chapter.stats`.
"""
