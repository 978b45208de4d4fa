"""task=bench: offline throughput, the transformers baseline, the roofline and sweep summaries."""
