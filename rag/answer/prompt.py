"""The grounded-answer prompt format, defined once: LoRA training, the pipeline and the QA eval
all import it from here.

A prompt is a chat: a fixed head (the system instruction and, in the ``fewshot`` profile, worked
demonstrations as earlier turns) and a user turn holding k numbered passages and the question.
The head comes first and never changes, so :class:`rag.generate.generator.Generator` computes its KV cache
once and the demonstrations cost nothing per question. The target answer is a short answer (a
phrase for a factual question, one or two sentences for a how-to) followed by the citation
marker(s) of the passage(s) it came from, e.g. ``Denver Broncos [2]``, or exactly
:data:`REFUSAL` when no passage holds the answer.

Profiles (chosen by measurement, docs/answering.md): ``plain`` is the instruction alone, the
format LoRA adapters were trained on; ``fewshot`` adds two demonstrations (a factual span, a
how-to sentence with code), which instruction-tuned models that ignore the instruction's format
(Qwen2.5-Coder-0.5B answered a bare ``[1]``) follow. A refusal demonstration was tried and
dropped: Qwen2.5-Coder-0.5B then refused 44% of answerable questions (docs/answering.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import TYPE_CHECKING

from rag.answer.evidence import flatten, plain_markup
from rag.types import page_label

if TYPE_CHECKING:
    from rag.types import Citation

REFUSAL = "The documents do not contain the answer."
DEFAULT_STOP = ("<|im_end|>",)  # decoding stops at the end of the assistant's turn (ChatML)
# An answer never starts a paragraph with "[": a small decoder that does is copying the
# prompt's next numbered excerpt ("\n\n[2] … Q2: Could not find header files …") into its
# answer, so the evidence reply stops there (rag.answer.compose.explained_reply).
EXCERPT_LABEL = "\n\n["

SYSTEM_PROMPT = (
    "You answer questions using only the numbered passages you are given. "
    "Give a short answer, then the number of each passage you used in square brackets, "
    "like [2]. If no passage contains the answer, reply exactly: " + REFUSAL
)

_MARKER = r"\[(\d+(?:\s*,\s*\d+)*)\]"
# A run of markers (``[1][3]``) not glued to a word, a call or another index: ``lines[1]``,
# ``f(x)[2]`` and ``a[0][1]`` are code, not citations.
CITATION_RUN = re.compile(r"(?<![\w)\]])(?:" + _MARKER.replace("(", "(?:", 1) + r")+")
CITATION = re.compile(_MARKER)


# Chat-template control tokens written out in a document (``<|im_start|>system``, ``<|im_end|>``,
# ``<|endoftext|>``, Llama's ``<|eot_id|>``): the tokenizer would turn them into the real special
# tokens, letting a passage close the user turn and open a system turn of its own.
_CONTROL_TOKEN = re.compile(r"<\|([A-Za-z0-9_]+)\|>")


def neutralise_control_tokens(text: str) -> str:
    """``<|name|>`` → ``<｜name｜>`` (full-width bars): the text still reads the same to a person,
    but no longer encodes to a special token, so passage text stays inside the passages block."""
    return _CONTROL_TOKEN.sub(lambda m: f"<\uff5c{m.group(1)}\uff5c>", text)


def format_passages(passages: Sequence[str]) -> str:
    """Number passages from 1: ``[1] text`` blocks separated by blank lines, each on one line
    but for the lines of its Markdown code fences (:func:`rag.answer.evidence.flatten`);
    control tokens that a document spells out are neutralised
    (:func:`neutralise_control_tokens`)."""
    return "\n\n".join(
        f"[{i}] {neutralise_control_tokens(flatten(p))}" for i, p in enumerate(passages, start=1)
    )


def user_message(question: str, passages: Sequence[str]) -> str:
    """The user turn: the numbered passages, then the question."""
    return f"Passages:\n\n{format_passages(passages)}\n\nQuestion: {question.strip()}"


# Demonstrations for the ``fewshot`` profile: (passages, question, answer). Written by hand on
# topics outside every evaluation set (SQuAD dev articles, the Python docs questions).
DEMOS: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (
        (
            "The Rhine rises in the Swiss Alps and flows 1,230 km to the North Sea.",
            "The Danube is Europe's second-longest river. It rises in the Black Forest in "
            "Germany and flows for about 2,850 km to the Black Sea.",
            "Vienna, Budapest and Belgrade all stand on the Danube.",
        ),
        "How long is the Danube?",
        "About 2,850 km [2]",
    ),
    (
        (
            "tar -czf archive.tar.gz DIR creates a gzip-compressed archive of DIR.",
            "To extract an archive, run tar -xf archive.tar; add -C DIR to extract into "
            "another folder. The -v flag lists each file as it is extracted.",
        ),
        "How do I unpack a tar file into a different directory?",
        "Run `tar -xf archive.tar -C DIR`, where `-C` names the folder to extract into [2].",
    ),
)

PROFILES = ("plain", "fewshot")

# The reader-first prompt (rag.answer.reader): the extractive reader has found the short answer
# in one passage; the decoder only writes the sentence around it, from that passage alone, so
# the prompt is a fraction of the k-passage one and the citation is right by construction.
SPAN_SYSTEM_PROMPT = (
    "You answer a question from one numbered passage. A reader has already found the short "
    "answer in it. Write one to three sentences that answer the question, contain the short "
    "answer word for word, use only facts from the passage, and end with [1]."
)


def span_user_message(question: str, passage: str, span: str) -> str:
    """The reader-first user turn: the one passage, the question and the reader's short answer."""
    return (
        f"Passages:\n\n{format_passages([passage])}\n\nQuestion: {question.strip()}\n"
        f"Short answer: {neutralise_control_tokens(' '.join(span.split()))}"
    )


def build_span_messages(question: str, passage: str, span: str) -> list[dict[str, str]]:
    """Chat messages of the reader-first prompt (fixed system turn first: prefix-cached)."""
    return [
        {"role": "system", "content": SPAN_SYSTEM_PROMPT},
        {"role": "user", "content": span_user_message(question, passage, span)},
    ]


def format_span_target(sentence: str) -> str:
    """Training target of the reader-first prompt: the sentence(s) answering the question,
    whitespace folded, ending with the one citation ``[1]`` (where decoding stops)."""
    return " ".join(sentence.split()) + " [1]"


def build_messages(
    question: str, passages: Sequence[str], profile: str = "plain"
) -> list[dict[str, str]]:
    """Chat messages for ``tokenizer.apply_chat_template``: the fixed head (system turn, plus
    demonstration turns for ``profile="fewshot"``) and the user turn."""
    if profile not in PROFILES:
        raise ValueError(f"prompt profile must be one of {', '.join(PROFILES)}, not {profile!r}")
    head = [{"role": "system", "content": SYSTEM_PROMPT}]
    if profile == "fewshot":
        for demo_passages, demo_question, demo_answer in DEMOS:
            head.append({"role": "user", "content": user_message(demo_question, demo_passages)})
            head.append({"role": "assistant", "content": demo_answer})
    return head + [{"role": "user", "content": user_message(question, passages)}]


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
    for run in CITATION_RUN.finditer(answer):
        for m in CITATION.finditer(run.group(0)):
            for num in (int(x) for x in m.group(1).split(",")):
                bucket = cited if 1 <= num <= n_passages else invalid
                if num not in bucket:
                    bucket.append(num)
    # Drop each marker run with the spaces before it; keep line breaks and indentation, so an
    # answer holding a code block or a list still renders as one.
    text = re.sub(r"[ \t]*" + CITATION_RUN.pattern, "", answer)
    text = re.sub(r"\n{3,}", "\n\n", text).strip()
    refused = is_refusal(answer)
    return ParsedAnswer(text=text, cited=[] if refused else cited, invalid=invalid, refused=refused)


def is_refusal(answer: str) -> bool:
    """True when the answer is (or starts with) the fixed refusal text."""
    norm = " ".join(answer.lower().split())
    return norm.startswith(REFUSAL.lower().rstrip("."))


# The evidence prompt (rag.answer.evidence): the encoder has kept the sentences of the retrieved
# passages that bear on the question; the decoder writes the answer from those excerpts: one to
# three sentences, each ending with the number of the excerpt it rests on, then a last line
# ``Short answer: ...`` holding the answer in a few words copied from the excerpts (a name,
# number, command or option). The explanation comes first so that the short answer is read off
# what the model has just written, not guessed before it. The short answer is what
# ``Answer.answer_span`` shows when it occurs in a passage (rag.pipeline); it is decoded as a
# continuation when the model ends its turn without it. Two demonstrations, written by hand on
# topics outside every evaluation set, sit in the cached prefix.
SHORT_ANSWER = "Short answer:"

EVIDENCE_SYSTEM_PROMPT = (
    "You answer questions about the user's documents using only the numbered excerpts you are "
    "given. Answer in one or two sentences that use only facts from the excerpts; end each "
    "sentence with the number of the excerpt it comes from in square brackets, like [2]. Then "
    f"write a last line that starts with '{SHORT_ANSWER}' followed by the answer in a few words "
    "copied from the excerpts (a name, number, command or option). If the excerpts do not "
    "answer the question, reply exactly: " + REFUSAL
)

EVIDENCE_DEMOS: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (
        (
            "The Rhine rises in the Swiss Alps and flows 1,230 km to the North Sea.",
            "The Danube is Europe's second-longest river. … It rises in the Black Forest in "
            "Germany and flows for about 2,850 km to the Black Sea.",
        ),
        "How long is the Danube?",
        "The Danube flows for about 2,850 km, from the Black Forest in Germany to the Black "
        f"Sea [2].\n{SHORT_ANSWER} 2,850 km",
    ),
    (
        (
            "tar -czf archive.tar.gz DIR creates a gzip-compressed archive of DIR.",
            "To extract an archive, run tar -xf archive.tar; add -C DIR to extract into "
            "another folder. … The -v flag lists each file as it is extracted.",
        ),
        "How do I unpack a tar file into a different directory?",
        "Run `tar -xf archive.tar` to extract the archive and add `-C DIR` to put its files "
        "into the folder DIR instead of the current one [2]."
        f"\n{SHORT_ANSWER} tar -xf archive.tar -C DIR",
    ),
)


def evidence_user_message(question: str, excerpts: Sequence[str]) -> str:
    """The evidence user turn: the numbered excerpts, then the question."""
    return f"Excerpts:\n\n{format_passages(excerpts)}\n\nQuestion: {question.strip()}"


def build_evidence_messages(question: str, excerpts: Sequence[str]) -> list[dict[str, str]]:
    """Chat messages of the evidence prompt: the fixed head (system turn and the two
    demonstrations, prefix-cached) and the user turn with the excerpts."""
    head = [{"role": "system", "content": EVIDENCE_SYSTEM_PROMPT}]
    for demo_excerpts, demo_question, demo_answer in EVIDENCE_DEMOS:
        head.append(
            {"role": "user", "content": evidence_user_message(demo_question, demo_excerpts)}
        )
        head.append({"role": "assistant", "content": demo_answer})
    return head + [{"role": "user", "content": evidence_user_message(question, excerpts)}]


# The short-answer prompt of a factoid (rag.answer.compose.evidence_reply): the decoder reads
# the encoder's two best sentences and copies the answer out of them. On SQuAD train questions
# it was right more often than the short answer read off the decoder's own explanation of the
# 320-token excerpts (docs/answering.md): the small decoder picks the wrong sentence of many.
# Demonstrations written by hand on topics outside every evaluation set.
EXTRACT_SYSTEM_PROMPT = (
    "Answer the question with the shortest phrase copied word for word from the text: a name, "
    "a number, a date, a command, an option or a few words. Reply with the phrase only."
)

EXTRACT_DEMOS: tuple[tuple[str, str, str], ...] = (
    (
        "The tower was finished in March 1889 for the World's Fair, two years after work "
        "began. It is 330 metres tall.",
        "When was the tower completed?",
        "March 1889",
    ),
    (
        "The library's reading room was designed by the architect Sydney Smirke and opened "
        "to readers in 1857.",
        "Who designed the reading room?",
        "Sydney Smirke",
    ),
)


def build_extract_messages(question: str, sentences: Sequence[str]) -> list[dict[str, str]]:
    """Chat messages of the short-answer prompt: the fixed head (system turn and the
    demonstrations, prefix-cached) and the user turn with the sentences and the question."""
    out = [{"role": "system", "content": EXTRACT_SYSTEM_PROMPT}]
    for text, q, a in EXTRACT_DEMOS:
        out += [
            {"role": "user", "content": f"Text: {text}\nQuestion: {q}"},
            {"role": "assistant", "content": a},
        ]
    text = " ".join(sentences)
    return out + [{"role": "user", "content": f"Text: {text}\nQuestion: {question.strip()}"}]


@dataclass(frozen=True)
class ShortAnswer:
    """An evidence-prompt reply split into its explanation and its short answer."""

    short: str | None  # None when the reply has no usable short answer line
    rest: str  # the explanation: the reply without the short answer line


MAX_SHORT_ANSWER_WORDS = 16  # a "short answer" longer than this is a sentence, not a short answer


def clean_short_answer(text: str) -> str | None:
    """The short answer as given (its first line, citation markers, backticks, bold, quotes
    and a final full stop removed), or None when empty or longer than
    :data:`MAX_SHORT_ANSWER_WORDS` words."""
    first = text.strip().split("\n", 1)[0]
    clean = CITATION_RUN.sub("", first).strip().strip("`*_\"' ").rstrip(".").strip()
    if not clean or len(clean.split()) > MAX_SHORT_ANSWER_WORDS:
        return None
    return clean


def split_short_answer(reply: str) -> ShortAnswer:
    """The explanation and the short answer of an evidence-prompt reply: the text before the
    first line that starts with :data:`SHORT_ANSWER`, and that line's answer
    (:func:`clean_short_answer`); a refusal has none."""
    text = reply.strip()
    m = re.search(r"(?im)^[ \t*_]*" + re.escape(SHORT_ANSWER) + r"[*_]*", text)
    if m is None or is_refusal(text):
        return ShortAnswer(None, text)
    return ShortAnswer(clean_short_answer(text[m.end() :]), text[: m.start()].strip())


QUOTES_HEADER = "From the documents:"  # the line above the quotes of an evidence reply


MAX_SOURCE_CHARS = 90  # a quote's source label longer than this is cut
# an AsciiDoc block attribute line ("[NOTE]", "[source,c]") a chunker took for a heading
_BLOCK_ATTRIBUTE = re.compile(r"\[[^\]]*\]")


def quote_source(heading_path: Sequence[str], path: str, page: int = 0) -> str:
    """Where a quote is from, as a reader finds it: the page's title and the section's
    heading (the first and the last of ``heading_path``, markup shown plain), else the file's
    name; then ``, p. N`` for a PDF's page (``page``), which a reader turns to. Why: a manual's
    sentence often names its subject only in the heading above it ("This module logs kernel
    printk messages over UDP" under "Netconsole"), so a quote without it does not say what to
    use."""
    heads = [" ".join(plain_markup(h).split()).rstrip(":") for h in heading_path]
    heads = [h for h in heads if h and not _BLOCK_ATTRIBUTE.fullmatch(h)]
    if heads:
        label = heads[0] if len(heads) == 1 else f"{heads[0]} › {heads[-1]}"
    else:
        label = PurePath(path).name
    where = page_label(page)
    if len(label) <= MAX_SOURCE_CHARS:
        return label + where
    cut = label[: MAX_SOURCE_CHARS - 1]
    return cut + ("`…" if cut.count("`") % 2 else "…") + where  # a code span cut is closed


def quotes_block(
    quotes: list[tuple[int, str]], markers: bool = True, citations: Sequence[Citation] = ()
) -> str:
    """The text that follows a reply for ``quotes``: a blank line, :data:`QUOTES_HEADER`, then
    one line per quote, with where it is from (:func:`quote_source`, for a quote whose passage
    is among ``citations``) and its citation marker (``markers``) after it."""
    if not quotes:
        return ""
    where = {c.number: quote_source(c.heading_path, c.display_path, c.page) for c in citations}
    lines = [
        f'- "{text}"' + (f" ({where[n]})" if n in where else "") + (f" [{n}]" if markers else "")
        for n, text in quotes
    ]
    return "\n\n" + "\n".join([QUOTES_HEADER, *lines])
