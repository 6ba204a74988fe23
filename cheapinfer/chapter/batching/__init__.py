"""Section 2, batching: ``batching`` (the batch curve and the scheduling model), ``batch_curve`` (the setting its claims
share and the curve's clocked quantities), ``knee`` (the search for the knee), ``workload`` (the book's workload and
the simulation), ``scheduler`` and ``paged_scheduler`` (the real runs), ``paging`` (the paged KV cache).
"""
