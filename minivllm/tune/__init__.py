"""Auto-tuning of the engine's keys for a model, a device and a workload (docs/tuning.md).

``python -m minivllm -m +tune=serving``: Hydra's Optuna sweeper samples the keys,
each trial replays ``bench=serving`` (objective.py claims its device and scores it
against the latency targets), and ``TuneCallback`` (callback.py) writes best.yaml, the
trials table and the plots into the sweep folder (report.py). ``load_tuned`` turns a
best.yaml into a config.
"""

from minivllm.tune.report import load_tuned

__all__ = ["load_tuned"]
