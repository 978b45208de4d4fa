"""Conversations -> prompts through a chat template; shared by ``LLM.chat`` and the server.

A conversation is a list of ``{"role", "content"}`` messages; ``content`` is a
string or a list of ``{"type": "text", "text": ...}`` parts (joined by newlines;
other part types are refused). The template's text already holds any BOS it
wants, so it is tokenized without adding special tokens.
"""

from __future__ import annotations

from typing import Any, Sequence

from transformers import PreTrainedTokenizerBase

from minivllm.inputs import TokensPrompt

Conversation = list[dict[str, Any]]

NO_TEMPLATE = (
    "chat_template: this model's tokenizer has no chat template; pass chat_template=<a Jinja template> "
    "(vLLM: --chat-template), or use generate()"
)


def is_single_conversation(messages: Any) -> bool:
    """True for one conversation (a list of message dicts), False for a list of them."""
    return isinstance(messages, (list, tuple)) and (not messages or isinstance(messages[0], dict))


def render_chat(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[dict[str, Any]],
    *,
    chat_template: str | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    tools: list[dict[str, Any]] | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> TokensPrompt:
    """The prompt (text and ids) the template makes of ``messages``; ValueError naming the problem."""
    template = chat_template or getattr(tokenizer, "chat_template", None)
    if not template:
        raise ValueError(NO_TEMPLATE)
    if add_generation_prompt and continue_final_message:
        raise ValueError("continue_final_message: cannot be combined with add_generation_prompt=True")
    conversation = [_message(i, m) for i, m in enumerate(messages)]
    if not conversation:
        raise ValueError("messages: is empty; give at least one message")
    if continue_final_message and conversation[-1]["role"] != "assistant":
        raise ValueError("continue_final_message: the last message must have role 'assistant'")
    try:
        text = tokenizer.apply_chat_template(
            conversation,
            chat_template=template,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tokenize=False,
            **(chat_template_kwargs or {}),
        )
    except Exception as err:  # noqa: BLE001 - a template error is the caller's problem
        raise ValueError(f"messages: the chat template failed: {err}") from None
    return TokensPrompt(prompt=text, prompt_token_ids=tokenizer.encode(text, add_special_tokens=False, verbose=False))


def _message(i: int, message: Any) -> dict[str, Any]:
    if not isinstance(message, dict) or "role" not in message:
        raise ValueError(f"messages[{i}]: must be a dict with 'role' and 'content'")
    out = dict(message)
    content = out.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ValueError(f"messages[{i}].content: only text parts are supported, got {kind!r}")
            texts.append(part["text"])
        out["content"] = "\n".join(texts)
    return out
