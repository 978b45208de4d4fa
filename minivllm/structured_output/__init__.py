"""Structured outputs: output constrained by a JSON schema, regex, choice list or grammar.

The scheduler holds the matchers (``manager.py``) and sends each step's
allowed-token bitmask with its SchedulerOutput; the sampler applies it
(``bitmask.py``). The grammar library is xgrammar (``backend.py``).
"""

from minivllm.structured_output.params import GuidedDecodingParams, StructuredOutputsParams

__all__ = ["GuidedDecodingParams", "StructuredOutputsParams"]
