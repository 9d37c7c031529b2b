"""The grounded-answer prompt format, defined once: LoRA training, the pipeline and the QA eval
all import it from here.

A prompt is a chat: a fixed system instruction (first, so its KV cache can be reused across
questions) and a user turn holding k numbered passages and the question. The target answer is a
short answer followed by the citation marker(s) of the passage(s) it came from, e.g.
``Denver Broncos [2]``, or exactly :data:`REFUSAL` when no passage holds the answer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

REFUSAL = "The documents do not contain the answer."

SYSTEM_PROMPT = (
    "You answer questions using only the numbered passages you are given. "
    "Give a short answer, then the number of each passage you used in square brackets, "
    "like [2]. If no passage contains the answer, reply exactly: " + REFUSAL
)

_MARKER = r"\[(\d+(?:\s*,\s*\d+)*)\]"
# A run of markers (``[1][3]``) not glued to a word, a call or another index: ``lines[1]``,
# ``f(x)[2]`` and ``a[0][1]`` are code, not citations.
_CITATION_RUN = re.compile(r"(?<![\w)\]])(?:" + _MARKER.replace("(", "(?:", 1) + r")+")
_CITATION = re.compile(_MARKER)


def format_passages(passages: Sequence[str]) -> str:
    """Number passages from 1: ``[1] text`` blocks separated by blank lines."""
    return "\n\n".join(f"[{i}] {' '.join(p.split())}" for i, p in enumerate(passages, start=1))


def user_message(question: str, passages: Sequence[str]) -> str:
    """The user turn: the numbered passages, then the question."""
    return f"Passages:\n\n{format_passages(passages)}\n\nQuestion: {question.strip()}"


def build_messages(question: str, passages: Sequence[str]) -> list[dict[str, str]]:
    """Chat messages for ``tokenizer.apply_chat_template``: fixed system turn + user turn."""
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": user_message(question, passages)},
    ]


def format_target(answer: str, cited: Sequence[int]) -> str:
    """Training target: ``answer [i][j]``; the refusal when ``cited`` is empty."""
    if not cited:
        return REFUSAL
    return answer.strip() + " " + "".join(f"[{i}]" for i in cited)


@dataclass(frozen=True)
class ParsedAnswer:
    """An answer with its citation markers separated out.

    ``text`` has the markers removed; ``cited`` are the valid passage numbers in order of first
    appearance; ``invalid`` are numbers outside 1..n_passages (dropped and flagged, never shown as
    a source); ``refused`` is true when the answer is the refusal.
    """

    text: str
    cited: list[int]
    invalid: list[int]
    refused: bool


def parse_citations(answer: str, n_passages: int) -> ParsedAnswer:
    """Split citation markers (``[2]``, ``[1, 3]``) out of ``answer`` (line breaks are kept)."""
    cited: list[int] = []
    invalid: list[int] = []
    for run in _CITATION_RUN.finditer(answer):
        for m in _CITATION.finditer(run.group(0)):
            for num in (int(x) for x in m.group(1).split(",")):
                bucket = cited if 1 <= num <= n_passages else invalid
                if num not in bucket:
                    bucket.append(num)
    # Drop each marker run with the spaces before it; keep line breaks and indentation, so an
    # answer holding a code block or a list still renders as one.
    text = re.sub(r"[ \t]*" + _CITATION_RUN.pattern, "", answer)
    text = re.sub(r"\n{3,}", "\n\n", text).strip()
    refused = is_refusal(answer)
    return ParsedAnswer(text=text, cited=[] if refused else cited, invalid=invalid, refused=refused)


def is_refusal(answer: str) -> bool:
    """True when the answer is (or starts with) the fixed refusal text."""
    norm = " ".join(answer.lower().split())
    return norm.startswith(REFUSAL.lower().rstrip("."))
