"""Data parallelism: ``parallel.dp`` independent engine replicas behind one front end.

Each replica is a whole engine (scheduler, KV cache, executor with its own
tp x pp ranks) in its own process (``engine/engine_proc.py``); the front end
(``LLM`` through ``DataParallelEngine``, the server through ``AsyncLLM``)
tokenizes, picks a replica for each request with ``LoadBalancer``, and merges
the replicas' outputs. Replicas share nothing, so a request's tokens do not
depend on which replica ran it (for greedy and per-request-seeded sampling).
"""
