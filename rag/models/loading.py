"""One lock for every model load in the process.

Why: transformers 5's ``from_pretrained`` swaps process-wide attributes while it loads
(``transformers.initialization.no_tie_weights`` replaces ``PreTrainedModel.tie_weights``,
``no_init_weights`` torch's init functions) and restores what it found afterwards. Two loads in
two threads interleave those swaps: one model is left untied (its LM head on the meta device, or
missing from the state dict) and a swap can outlive both loads, so every later load in the
process is untied too. The serving processes load lazily from request threads (a pipeline per
index, a reranker, the query rewriter), and the test suite saw exactly this once
('decoder.weight' missing / "Cannot copy out of meta tensor"). Every load in ``rag`` holds
:data:`MODEL_LOAD_LOCK`; it is re-entrant, so a load that converts a GGUF file first may nest.
"""

from __future__ import annotations

import threading

MODEL_LOAD_LOCK = threading.RLock()
