"""The decisions around an answer: relevance and answerability before decoding, the refusal
gate, citation verification and its support rule, and the follow-up query rewrite."""
