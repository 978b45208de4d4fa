"""Quantized layers sharded over two ranks give the single-rank tokens.

GPTQ with act-order is the hard case: row-parallel ranks keep every group's
scales and zeros (their rows may use any group), column-parallel ranks take
their slice of packed zeros, and fused q/k/v members land on each rank's rows.
(One case only: two worker processes cost tens of seconds on a loaded machine.)
"""

from __future__ import annotations

from tests.hf_reference import hf_greedy
from tests.quantization.test_parity import MAX_TOKENS, assert_matches, run


def test_tp2_gptq_act_order_matches_transformers_on_dequantized_weights(quantized_pair):
    quant_dir, dequant_dir = quantized_pair("gptq-g32-desc-act")
    prompts, outputs = run(quant_dir, tensor_parallel_size=2)
    assert_matches(outputs, hf_greedy(dequant_dir, prompts, MAX_TOKENS))
