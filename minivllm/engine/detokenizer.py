"""Incremental detokenization and stop strings, at a cost per token that does not grow.

Decoding one token at a time is wrong for most tokenizers: a token may be half of a UTF-8
character, and SentencePiece drops a word's leading space when the word starts the decoded
text. So we decode a short window twice, ``ids[prefix:read]`` and ``ids[prefix:]``, and emit
only what the second adds to the first, holding it back while it ends in an incomplete
character. The window starts in the prompt so the first output token gets its context.

Nothing here looks at the whole text: the decoded window is a few tokens, stop strings are
searched for in the new piece plus the last ``max_stop_len - 1`` characters before it (a stop
string may straddle two pieces), and :meth:`IncrementalDetokenizer.take` hands out the new
text, so a 30,000-token answer costs per token what a 30-token one does.
"""

from __future__ import annotations

from minivllm.sampling_params import SamplingParams

_CONTEXT_TOKENS = 5
_TRIM_AT = 1024  # drop token ids the decode window has left behind once this many pile up


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
        self._pending = ""  # decoded, not yet taken (a possible stop-string prefix waits here)
        self._tail = ""  # the text's last max_stop_len - 1 characters, taken or not

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special)

    def add_tokens(self, token_ids: list[int]) -> str | None:
        """Append new output tokens; return the stop string if the text now contains one
        (the text then ends before it, or after it with include_stop_str_in_output)."""
        ids = self.ids
        ids.extend(token_ids)
        before = self._decode(ids[self.prefix_offset : self.read_offset])
        after = self._decode(ids[self.prefix_offset :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return None  # nothing complete yet
        piece = after[len(before) :]
        self.prefix_offset, self.read_offset = self.read_offset, len(ids)
        if self.prefix_offset > _TRIM_AT:
            del ids[: self.prefix_offset]
            self.read_offset -= self.prefix_offset
            self.prefix_offset = 0
        if not self.stop:
            self._pending += piece
            return None
        window = self._tail + piece
        hits = [(at, s) for s in self.stop if (at := window.find(s)) != -1]
        if not hits:
            self._pending += piece
            self._tail = window[max(0, len(window) - self.max_stop_len + 1) :]
            return None
        at, s = min(hits)  # the stop string that appears first in the text wins
        cut = at + len(s) if self.include_stop else at
        # Everything after the cut is untaken: take() holds back the last max_stop_len - 1
        # characters (= the tail), and with include_stop the cut is inside the new piece.
        text = self._pending + piece
        self._pending = text[: len(text) - (len(window) - cut)]
        return s

    def take(self, finished: bool) -> str:
        """The text decoded since the last call, safe to show: while the request runs, the
        last ``max_stop_len - 1`` characters wait (they may begin a stop string)."""
        pending = self._pending
        if finished or not self.max_stop_len or self.include_stop:
            self._pending = ""
            return pending
        ready = len(pending) - (self.max_stop_len - 1)
        if ready <= 0:
            return ""
        self._pending = pending[ready:]
        return pending[:ready]
