"""Incremental detokenization and stop strings.

Decoding one token at a time is wrong for most tokenizers: a token may be half of a UTF-8
character, and SentencePiece drops a word's leading space when the word starts the decoded
text. So we decode a short window twice, ``ids[prefix:read]`` and ``ids[prefix:]``, and emit
only what the second adds to the first, holding it back while it ends in an incomplete
character. The window starts in the prompt so the first output token gets its context.
"""

from __future__ import annotations

from minivllm.sampling_params import SamplingParams

_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_token_ids: list[int], params: SamplingParams):
        self.tokenizer = tokenizer
        self.skip_special = params.skip_special_tokens
        self.stop = params.stop
        self.include_stop = params.include_stop_str_in_output
        self.max_stop_len = max((len(s) for s in self.stop), default=0)
        self.ids = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special)

    def add_tokens(self, token_ids: list[int]) -> str | None:
        """Append new output tokens; return the stop string if the text now contains one
        (the text is then cut before it, or after it with include_stop_str_in_output)."""
        self.ids.extend(token_ids)
        before = self._decode(self.ids[self.prefix_offset : self.read_offset])
        after = self._decode(self.ids[self.prefix_offset :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return None  # nothing complete yet
        delta = after[len(before) :]
        old_len = len(self.text)
        self.text += delta
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        if not self.stop:
            return None
        search_from = max(0, old_len - self.max_stop_len + 1)
        hits = [(at, s) for s in self.stop if (at := self.text.find(s, search_from)) != -1]
        if not hits:
            return None
        at, s = min(hits)  # the stop string that appears first in the text wins
        self.text = self.text[: at + len(s)] if self.include_stop else self.text[:at]
        return s

    def visible_text(self, finished: bool) -> str:
        """Text safe to show while streaming: hold back a possible stop-string prefix."""
        if finished or not self.max_stop_len or self.include_stop:
            return self.text
        return self.text[: max(0, len(self.text) - self.max_stop_len + 1)]
