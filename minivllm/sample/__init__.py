"""Sampling: the one place that turns logits into a request's distribution and draws from it.

``sampler.py`` owns the target distribution -- ``min_tokens`` masking, temperature, top-k,
top-p, greedy rows -- and every random number a request's tokens depend on (seeded per request,
in separate streams for the target and a draft model). The model runner samples with it, and
speculative decoding (``minivllm/spec_decode/``) builds its target and draft distributions and
its random numbers through the same public methods, so a new logits setting changes both alike.
"""
