"""The decisions around an answer: relevance and answerability before decoding, the refusal
gate, citation verification and its support rule, and the follow-up query rewrite; the grounded
prompt and citation markers (:mod:`rag.answer.prompt`) and the answer text as markdown that
cannot make a viewer fetch (:mod:`rag.answer.markup`)."""
