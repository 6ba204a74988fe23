"""Section 1, the KV cache: ``kv`` (bytes, generation with and without the cache, timing helpers), ``kv_macs`` (the
attention's multiply-adds), ``kv_listing`` (the chapter's listing run as printed), ``kv_memory`` (what a cache holds
in memory), ``kv_evidence`` (a cached step used its cache).
"""
