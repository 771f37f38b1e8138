"""Speculative decoding: propose cheap drafts, verify them with the target model in one pass.

=================  ===============================================================
``config.py``      ``speculative_config``, checked (pure Python)
``ngram.py``       n-gram / prompt-lookup drafts (no model)
``draft_model.py`` drafts from a smaller model that shares the target's tokenizer
``rejection.py``   the rejection rule that keeps the target's output distribution
``decoder.py``     the model runner's part: verify a step's drafts, propose the next ones
=================  ===============================================================

The scheduler verifies a request's drafts in the same forward pass as its next token
(``SchedulerOutput.spec_token_ids``) and rolls back what the target rejects
(``Scheduler._update_speculation``, ``KVCacheManager.trim``).
"""

from minivllm.spec_decode.config import METHODS, SpeculativeConfig

__all__ = ["METHODS", "SpeculativeConfig"]
