"""Chat-template token bookkeeping for multi-turn rollouts.

In the ``sequence`` layout the policy must be conditioned on exactly the token ids that later form the
training row. Re-tokenising the whole conversation each turn can merge tokens differently at message
boundaries, so instead the history is grown by appending, after each sampled response, the template's
"end of assistant turn + next user message + generation prompt" tokens. Those pieces are cut from the
model's own chat template once, with sentinels, so any template works.
"""

from __future__ import annotations

from typing import Any

from ..models import require_chat_template

_USER = "\x00TASPO_USER\x00"
_ASSISTANT = "\x00TASPO_ASSISTANT\x00"


class ChatFormat:
    """Renders first prompts and between-turn continuations with a tokenizer's chat template.

    ``tools`` (JSON schemas) are rendered by the template, as ``apply_chat_template(..., tools=...)`` does, for an
    environment whose actions are the model's own tool calls.
    """

    def __init__(self, tokenizer: Any, system_prompt: str | None = None, tools: list[dict[str, Any]] | None = None):
        require_chat_template(tokenizer, getattr(tokenizer, "name_or_path", "this model"))
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.tools = tools
        head = self._messages(_USER)
        first = self._render(head, add_generation_prompt=True)
        with_reply = self._render(head + [{"role": "assistant", "content": _ASSISTANT}], add_generation_prompt=False)
        two_turns = self._render(
            head + [{"role": "assistant", "content": _ASSISTANT}, {"role": "user", "content": _USER}],
            add_generation_prompt=True,
        )
        if _ASSISTANT not in with_reply or not two_turns.startswith(with_reply.split(_ASSISTANT)[0]):
            raise ValueError("The chat template does not render assistant turns verbatim; it cannot be used for rollouts.")
        # "<|im_end|>\n<|im_start|>user\n" ... "<|im_end|>\n<|im_start|>assistant\n" for ChatML templates.
        after_reply = two_turns.split(_ASSISTANT, 1)[1]
        self._between_prefix, self._between_suffix = after_reply.split(_USER, 1)
        self._first_prefix, self._first_suffix = first.split(_USER, 1)

    def _messages(self, user_text: str) -> list[dict[str, str]]:
        messages = [{"role": "user", "content": user_text}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    def _render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=self.tools, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def first_prompt_text(self, user_text: str) -> str:
        return f"{self._first_prefix}{user_text}{self._first_suffix}"

    def first_prompt_ids(self, user_text: str) -> list[int]:
        return self.encode(self.first_prompt_text(user_text))

    def continuation_ids(self, user_text: str, stop_text: str = "") -> list[int]:
        """Tokens to append after a sampled response so the next user message and generation prompt follow.

        ``stop_text`` is the text of the stop token the response ended with ("" if it was cut off by the
        length limit). That token is already in the history, so the template's own copy is dropped; a cut-off
        response gets the template's end-of-turn text appended instead.
        """
        prefix = self._between_prefix
        if stop_text and prefix.startswith(stop_text):
            prefix = prefix[len(stop_text) :]
        return self.encode(f"{prefix}{user_text}{self._between_suffix}")

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]
