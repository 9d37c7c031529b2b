"""Answer generation: the decoder with its KV and prefix caches, stop rules, streaming, batched
decoding, speed options, the context budget and likelihood scores."""
