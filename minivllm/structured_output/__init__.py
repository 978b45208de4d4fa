"""Structured outputs: output constrained by a JSON schema, regex, choice list or grammar.

What a request asks for is ``StructuredOutputsParams`` (``minivllm/structured_output_params.py``,
on the bottom row beside ``SamplingParams``). The scheduler holds the matchers
(``manager.py``) and sends each step's allowed-token bitmask with its SchedulerOutput;
the sampler applies it. The grammar library is xgrammar (``backend.py``).
"""

from minivllm.structured_output_params import GuidedDecodingParams, StructuredOutputsParams

__all__ = ["GuidedDecodingParams", "StructuredOutputsParams"]
