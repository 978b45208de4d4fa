"""Scheduling and KV-cache memory: what runs in each engine step, and where its KV lives."""
