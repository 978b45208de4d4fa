"""Conversations -> prompts through a chat template; shared by ``LLM.chat`` and the server.

A conversation is a list of ``{"role", "content"}`` messages; ``content`` is a
string or a list of ``{"type": "text", "text": ...}`` parts (joined by newlines)
and ``{"type": "image_url", "image_url": {"url": ...}}`` parts (OpenAI's; other
part types are refused). A message with images keeps its parts as a list, each
image as ``{"type": "image"}``, which a multimodal chat template renders as the
model's image token; the images themselves (loaded by ``MediaConnector``: data
URLs, allowed local files, http(s)) go with the prompt as ``multi_modal_data``.
The template's text already holds any BOS it wants, so it is tokenized without
adding special tokens.
"""

from __future__ import annotations

from typing import Any, Sequence

from transformers import PreTrainedTokenizerBase

from minivllm.inputs import TokensPrompt
from minivllm.multimodal.media import MediaConnector

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
    media: MediaConnector | None = None,
) -> TokensPrompt:
    """The prompt (text and ids, and its images as ``multi_modal_data``) the template makes of
    ``messages``; ValueError naming the problem. ``media`` loads image URLs (None: default rules)."""
    template = chat_template or getattr(tokenizer, "chat_template", None)
    if not template:
        raise ValueError(NO_TEMPLATE)
    if add_generation_prompt and continue_final_message:
        raise ValueError("continue_final_message: cannot be combined with add_generation_prompt=True")
    images: list[Any] = []
    conversation = [_message(i, m, images, media or MediaConnector()) for i, m in enumerate(messages)]
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
    prompt = TokensPrompt(prompt=text, prompt_token_ids=tokenizer.encode(text, add_special_tokens=False, verbose=False))
    if images:
        prompt["multi_modal_data"] = {"image": images}
    return prompt


def image_urls(messages: Sequence[Any]) -> list[tuple[Any, str]]:
    """``(url, field)`` of every ``image_url`` part of ``messages``, in the order ``render_chat``
    loads them: what a server counts, checks and fetches before rendering."""
    found = []
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        for j, part in enumerate(content if isinstance(content, list) else []):
            if isinstance(part, dict) and part.get("type") == "image_url":
                found.append((_image_url(part), f"messages[{i}].content[{j}].image_url"))
    return found


def _image_url(part: dict[str, Any]) -> Any:
    url = part.get("image_url")
    return url.get("url") if isinstance(url, dict) else url


def _message(i: int, message: Any, images: list[Any], media: MediaConnector) -> dict[str, Any]:
    """The message as the template sees it; its images are appended to ``images``."""
    if not isinstance(message, dict) or "role" not in message:
        raise ValueError(f"messages[{i}]: must be a dict with 'role' and 'content'")
    out = dict(message)
    content = out.get("content")
    if isinstance(content, list):
        parts = [_part(i, j, part, images, media) for j, part in enumerate(content)]
        if any(p["type"] == "image" for p in parts):
            out["content"] = parts
        else:
            out["content"] = "\n".join(p["text"] for p in parts)
    return out


def _part(i: int, j: int, part: Any, images: list[Any], media: MediaConnector) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
    if kind == "text" and isinstance(part.get("text"), str):
        return {"type": "text", "text": part["text"]}
    if kind == "image_url":
        images.append(media.load_image(_image_url(part), f"messages[{i}].content[{j}].image_url"))
        return {"type": "image"}
    raise ValueError(f"messages[{i}].content[{j}]: only text and image_url parts are supported, got {kind!r}")
