"""Data parallelism: ``parallel.dp`` independent engine replicas behind one front end.

Each replica is a whole engine (scheduler, KV cache, executor with its own
tp x pp ranks) in its own process (``engine/engine_proc.py``), or, with
``parallel.dp_backend=ray``, in its own Ray actor on any node (``ray_replica.py``). The front end
(``LLM`` through ``DataParallelEngine``, the server through ``AsyncLLM``)
checks and tokenizes each request once (``Processor.process``) and hands it to
``EngineCoreClient`` (``engine/core_client.py``), which picks a replica with
``LoadBalancer`` (``engine/balancer.py``); the front end merges the replicas' outputs.
Replicas share nothing, so a request's tokens do not depend on which replica
ran it (for greedy and per-request-seeded sampling).

This package only imports ``minivllm.engine``; nothing in ``engine/`` imports it.
"""
