"""Chat-template token bookkeeping for multi-turn rollouts.

In the ``sequence`` layout the policy must be conditioned on exactly the token ids that later form the
training row. Re-tokenising the whole conversation each turn can merge tokens differently at message
boundaries, so instead the history is grown by appending, after each sampled response, the template's
"end of assistant turn + next user message + generation prompt" tokens. Those pieces are cut from the
model's own chat template once, with sentinels, so any template works.

Text from outside the model (observations, retrieved passages, guidance) is only ever text: a special token's
string inside it (``"<|im_end|>"``) is encoded as ordinary pieces, never as the special token, so it cannot close
the turn or open a system turn; and a lone surrogate (invalid Unicode, which the tokenizer refuses) is replaced by
U+FFFD and counted in ``ChatFormat.replaced_characters``. Text without either is encoded exactly as before.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from ..models import require_chat_template

_USER = "\x00TASPO_USER\x00"
_ASSISTANT = "\x00TASPO_ASSISTANT\x00"
_SURROGATE = re.compile("[\ud800-\udfff]")

logger = logging.getLogger(__name__)


def replace_invalid_unicode(text: str) -> tuple[str, int]:
    """``text`` with each lone surrogate (which no UTF-8 encoder accepts) replaced by U+FFFD, and how many."""
    return _SURROGATE.subn("\ufffd", text)


def _special_strings(tokenizer: Any) -> set[str]:
    """Every special token's text: the named ones and the added tokens marked special (``<repo_name>`` ...)."""
    strings = {str(t) for t in getattr(tokenizer, "all_special_tokens", [])}
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    strings |= {str(t.content) for t in decoder.values() if getattr(t, "special", False)}
    return {s for s in strings if s}


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
        special = sorted(_special_strings(tokenizer), key=len, reverse=True)
        self._special = re.compile("|".join(map(re.escape, special))) if special else None
        self.replaced_characters = 0
        """Lone surrogates replaced by U+FFFD in the text encoded so far."""

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
        return self._encode_turn(self._first_prefix, user_text, self._first_suffix)

    def continuation_ids(self, user_text: str, stop_text: str = "") -> list[int]:
        """Tokens to append after a sampled response so the next user message and generation prompt follow.

        ``stop_text`` is the text of the stop token the response ended with ("" if it was cut off by the
        length limit). That token is already in the history, so the template's own copy is dropped; a cut-off
        response gets the template's end-of-turn text appended instead.
        """
        prefix = self._between_prefix
        if stop_text and prefix.startswith(stop_text):
            prefix = prefix[len(stop_text) :]
        return self._encode_turn(prefix, user_text, self._between_suffix)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _encode_turn(self, prefix: str, user_text: str, suffix: str) -> list[int]:
        """The ids of ``prefix + user_text + suffix`` where only the template's own special tokens are special.

        The tokenizer already cuts text at special tokens and encodes each piece between them on its own, so the
        piece around the user text (the template's text after its last special token, the user text, the
        template's text before its next one) is encoded with ``split_special_tokens=True`` and the template's ends
        as usual. Text that holds no special token's string takes the one-call path, the ids it always had.
        """
        user_text = self._valid_unicode(user_text)
        cut_prefix = max((m.end() for m in self._special.finditer(prefix)), default=0) if self._special else 0
        found = self._special.search(suffix) if self._special else None
        cut_suffix = found.start() if found else len(suffix)
        middle = f"{prefix[cut_prefix:]}{user_text}{suffix[:cut_suffix]}"
        if self._special is None or not self._special.search(middle):
            return self.encode(f"{prefix}{user_text}{suffix}")
        inner = self.tokenizer(middle, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        return self.encode(prefix[:cut_prefix]) + inner + self.encode(suffix[cut_suffix:])

    def _valid_unicode(self, text: str) -> str:
        text, replaced = replace_invalid_unicode(text)
        if replaced:
            if not self.replaced_characters:
                logger.warning(
                    "text for the model held %d invalid Unicode characters (lone surrogates), replaced by U+FFFD; "
                    "the count so far is logged as env/replaced_characters", replaced,
                )
            self.replaced_characters += replaced
        return text
