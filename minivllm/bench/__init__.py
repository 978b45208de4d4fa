"""task=bench and the measuring around it (docs/bench.md).

run.py            the timed run of a workload (throughput or serving) and its report
workloads.py      the requests: random, shared-prefix, jsonl, images
timing.py         where a step's time goes (StepTimer), the bandwidth floor, one kernel call
hf_baseline.py    the same requests through transformers' ``generate``
sweep.py          multirun: failed jobs recorded, the summary table and plot
kernel_groups.py  a profiled step's device time by kernel group (benchmarks/profile_decode.py)
soak.py           the HTTP server's soak and fault test (benchmarks/soak.py)
"""
