"""The serving loop: model runner, sampler, detokenizer, engine, and the ``LLM`` front end."""
