"""LLM.chat against apply_chat_template + generate; LLM.beam_search against transformers'
beam search (sequences and scores) on two test models."""

from __future__ import annotations

import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from minivllm import LLM, SamplingParams
from minivllm.sampling_params import BeamSearchParams

TEMPLATE = (
    "{% if tools %}tools: {{ tools | map(attribute='function.name') | join(',') }}{{ '\\n' }}{% endif %}"
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}"
    "{% if not loop.last or add_generation_prompt %}{{ '\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}{% if shout %}!{% endif %}"
)
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "def f(x):"}]


@pytest.fixture(scope="module")
def chat_dir(llama_dir, tmp_path_factory):
    """The Llama checkpoint with a chat template in its tokenizer."""
    out = tmp_path_factory.mktemp("llama-chat") / "ckpt"
    shutil.copytree(llama_dir, out)
    tok = AutoTokenizer.from_pretrained(out)
    tok.chat_template = TEMPLATE
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def llm(chat_dir):
    torch.set_num_threads(1)
    return LLM(str(chat_dir), dtype="float32", block_size=4, disable_log_stats=True, num_gpu_blocks_override=128)


def test_chat_equals_the_template_then_generate(llm):
    tok = llm.get_tokenizer()
    text = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    want = llm.generate({"prompt_token_ids": tok.encode(text, add_special_tokens=False)}, GREEDY, use_tqdm=False)
    got = llm.chat(CHAT, GREEDY, use_tqdm=False)
    assert len(got) == 1 and got[0].prompt == text
    assert got[0].outputs[0].token_ids == want[0].outputs[0].token_ids


def test_chat_takes_a_list_of_conversations(llm):
    other = [{"role": "user", "content": [{"type": "text", "text": "import os"}]}]
    both = llm.chat([CHAT, other], GREEDY, use_tqdm=False)
    alone = [llm.chat(c, GREEDY, use_tqdm=False)[0] for c in (CHAT, other)]
    assert [o.outputs[0].token_ids for o in both] == [o.outputs[0].token_ids for o in alone]
    assert both[1].prompt == "user: import os\nassistant:"


def test_chat_tools_kwargs_and_continue_final_message(llm):
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {}}}]
    out = llm.chat(CHAT, GREEDY, tools=tools, chat_template_kwargs={"shout": True}, use_tqdm=False)[0]
    assert out.prompt.startswith("tools: get_time\n") and out.prompt.endswith("assistant:!")
    partial = CHAT + [{"role": "assistant", "content": "return"}]
    cont = llm.chat(partial, GREEDY, add_generation_prompt=False, continue_final_message=True, use_tqdm=False)[0]
    assert cont.prompt.endswith("assistant: return")
    with pytest.raises(ValueError, match="continue_final_message"):
        llm.chat(partial, GREEDY, continue_final_message=True, use_tqdm=False)


def test_chat_without_a_template_is_a_clear_error_unless_one_is_given(llama_dir):
    plain = LLM(str(llama_dir), dtype="float32", disable_log_stats=True, num_gpu_blocks_override=128)
    with pytest.raises(ValueError, match="no chat template"):
        plain.chat(CHAT, GREEDY, use_tqdm=False)
    out = plain.chat(CHAT, GREEDY, chat_template=TEMPLATE, use_tqdm=False)[0]
    assert out.prompt.endswith("user: def f(x):\nassistant:")


@pytest.fixture(scope="module", params=["llama_dir", "opt_dir"])
def beam_models(request):
    torch.set_num_threads(1)
    path = request.getfixturevalue(request.param)
    llm = LLM(str(path), dtype="float32", block_size=4, disable_log_stats=True, num_gpu_blocks_override=128)
    return llm, AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.mark.parametrize(("width", "length_penalty"), [(1, 1.0), (2, 0.5), (4, 1.0)])
def test_beam_search_matches_transformers(beam_models, width, length_penalty):
    llm, hf = beam_models
    tok = llm.get_tokenizer()
    prompts = [tok.encode("def fibonacci(n):"), tok.encode("import os\nclass A:")]
    params = BeamSearchParams(beam_width=width, max_tokens=7, length_penalty=length_penalty)
    outs = llm.beam_search([{"prompt_token_ids": p} for p in prompts], params)
    for ids, out in zip(prompts, outs):
        assert len(out.sequences) == width
        with torch.no_grad():
            ref = hf.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                num_beams=width,
                num_return_sequences=width,
                do_sample=False,
                max_new_tokens=7,
                length_penalty=length_penalty,
                output_scores=True,
                output_logits=True,
                return_dict_in_generate=True,
                pad_token_id=0,
            )
        best = out.sequences[0]
        if width == 1:  # transformers runs greedy search: score it the same way
            logprobs = [torch.log_softmax(s[0], -1)[t].item() for s, t in zip(ref.logits, ref.sequences[0, len(ids) :])]
            ref_scores = [sum(logprobs) / len(logprobs) ** length_penalty]
        else:
            ref_scores = ref.sequences_scores.tolist()
        for seq, ref_seq, ref_score in zip(out.sequences, ref.sequences.tolist(), ref_scores):
            assert seq.tokens == ref_seq
            assert seq.score == pytest.approx(ref_score, abs=1e-4)
        assert best.text == tok.decode(best.tokens, skip_special_tokens=True)


def test_beam_search_over_the_context_is_a_context_window_error(llm):
    max_len = llm.llm_engine.cfg.max_model_len
    params = BeamSearchParams(beam_width=2, max_tokens=max_len)
    expected = rf"^The decoder prompt \(length 3\) plus max_tokens={max_len} is longer than the maximum model length of {max_len}\."
    with pytest.raises(ValueError, match=expected):
        llm.beam_search([{"prompt_token_ids": [5, 6, 7]}], params)
