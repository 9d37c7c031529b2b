"""Documentation markup (reST, markdown) → readable text, for the answers of
:mod:`training.data.doc_qa_data`: inline markup cleaned (:func:`clean_inline`) and a section's lead
sentences picked (:func:`lead_sentences`) from its first plain-prose paragraph.

Only the *answer* is cleaned: the passages stay the raw chunks the pipeline retrieves, markup
and all, so the model learns to read them as they come.
"""

from __future__ import annotations

import re

MAX_LEAD_WORDS = 60  # a second sentence is added only while the answer stays this short

_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9(`\"'])")
_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+<>:._])\1{2,}\s*$")
_SKIP_LINE = re.compile(r"^(\.\.|:[\w -]+:(\s|$)|[+|#><]|=+\s+=|[-*+$]\s|\d+[.)]\s|```|~~~)")

# ---------------------------------------------------------------------------- markup → plain text


def _role(m: re.Match) -> str:
    name, inner = m.group(1).lower(), m.group(2).strip()
    if name in (":pep:", ":rfc:"):
        return f"{name.strip(':').upper()} {inner.split('#')[0]}"
    titled = re.match(r"^(.*?)\s*<[^<>]+>$", inner, flags=re.S)
    if titled and titled.group(1):
        return titled.group(1)
    inner = inner.lstrip("!")
    return inner[1:].rsplit(".", 1)[-1] if inner.startswith("~") else inner


def _outside_code(text: str, fn) -> str:
    """Apply ``fn`` to the parts of ``text`` outside single-backtick code spans."""
    parts = re.split(r"(`[^`]+`)", text)
    return "".join(p if i % 2 else fn(p) for i, p in enumerate(parts))


def _unmark(text: str, rst: bool) -> str:
    """Links, substitutions, footnote references and emphasis of code-free text → plain text."""
    if rst:
        text = re.sub(r"\|([^|\s][^|]*)\|_{0,2}", r"\1", text)
        text = re.sub(r"\s*\[[#*\w-]*\]_", "", text)
        text = text.replace("\\ ", "").replace("\\*", "*").replace("\\", "")
        text = re.sub(r"(?<=[A-Za-z0-9])_(?=[\s.,;:)]|$)", "", text)  # ``name_`` references
    else:
        text = re.sub(r"!\[[^\]]*\]\([^)]*\)", "", text)
        text = re.sub(r"\[([^\]]+)\]\([^)]*\)", r"\1", text)
        text = re.sub(r"(?<!\w)__(\S.*?)__(?!\w)", r"\1", text)
        text = re.sub(r"(?<!\w)_(\S[^_]*?)_(?!\w)", r"\1", text)
    text = re.sub(r"\*\*(\S.*?)\*\*", r"\1", text)
    text = re.sub(r"(?<![\w*])\*(\S[^*]*?)\*(?![\w*])", r"\1", text)
    return re.sub(r"(?<=\w) +(?=[).,;:!?]+(\s|$))", "", text)  # space left by a removed reference


def clean_inline(text: str, rst: bool = True) -> str:
    """Inline markup of one paragraph → readable text: reST roles → their text (``~a.b`` → ``b``,
    ``title <target>`` → ``title``), double-backtick literals → single-backtick code (left
    untouched inside), links, substitutions, footnote references and emphasis unmarked; markdown
    links → their text, images dropped. Whitespace is collapsed."""
    text = " ".join(text.split())
    if rst:
        text = re.sub(r"(:(?:[\w.+-]+:)+)`([^`]+)`", _role, text)
        text = re.sub(r"`([^`<]+?)\s*<[^<>`]+>`__?", r"\1", text)
        text = re.sub(r"(?<!`)`([^`]+)`__?(?!`)", r"\1", text)
        text = re.sub(r"(\S)\s*::$", r"\1:", text)
    text = re.sub(r"``(.+?)``", lambda m: "`" + m.group(1).replace("`", "") + "`", text)
    return " ".join(_outside_code(text, lambda t: _unmark(t, rst)).split())


def _prose_paragraphs(body: str) -> list[str]:
    """Blank-line separated paragraphs that are plain prose: none indented (directive bodies,
    literal blocks, quotes), none opening as a directive, comment, field list, table, list,
    heading, quote, fence or HTML tag, none containing an underline."""
    out = []
    for para in re.split(r"\n\s*\n", body):
        lines = para.strip("\n").split("\n")
        if not lines[0].strip() or lines[0][:1].isspace() or _SKIP_LINE.match(lines[0]):
            continue
        if any(_UNDERLINE.match(ln) or ln[:1].isspace() for ln in lines[1:]):
            continue  # a heading, or a definition list / directive with an indented body
        out.append(para)
    return out


def lead_sentences(text: str, rst: bool, passage_words: int) -> str:
    """The first one or two complete sentences of the first prose paragraph of a section's
    ``text`` (from its heading line on) that lies within the passage window (the first
    ``passage_words`` words; 0 = all), cleaned of markup; "" if none.
    A sentence must end in ``.``, ``!`` or ``?`` (so a cut-off one never counts); paragraphs whose
    first sentence has under five words are passed over, and a section whose first real
    paragraph introduces a code block or list (``...:``) or continues one (lower-case start)
    gives no lead at all: what follows depends on the code."""
    ends = [m.end() for m in re.finditer(r"\S+", text)] if passage_words else []
    if len(ends) > passage_words:
        text = text[: ends[passage_words - 1]]
    body = text.split("\n", 1)[1] if "\n" in text else ""
    if body and _UNDERLINE.match(body.split("\n", 1)[0]):
        body = body.split("\n", 1)[1] if "\n" in body else ""
    for para in _prose_paragraphs(body):
        sents = _SENTENCE.split(clean_inline(para, rst))
        if len(sents[0].split()) < 5:
            continue  # a label such as "Source code: Lib/os.py"
        if not sents[0].endswith((".", "!", "?")) or not re.match(r"[A-Z0-9`\"'(]", sents[0]):
            return ""  # opens with an intro to a code block or list, or continues one
        lead, nxt = sents[0], sents[1] if len(sents) > 1 else ""
        if nxt.endswith((".", "!", "?")) and len(f"{lead} {nxt}".split()) <= MAX_LEAD_WORDS:
            lead = f"{lead} {nxt}"
        return lead
    return ""


def lead_sentence_raw(text: str, rst: bool, passage_words: int) -> str:
    """The raw (markup kept) first sentence of the lead :func:`lead_sentences` finds in a
    section's ``text``: the words an extractive reader should point at, as they stand in the
    passage. "" when there is no lead or its raw end cannot be matched to the cleaned one."""
    lead = lead_sentences(text, rst, passage_words)
    if not lead:
        return ""
    first = _SENTENCE.split(lead)[0]
    for para in _prose_paragraphs(text.split("\n", 1)[1] if "\n" in text else ""):
        for m in re.finditer(r"[.!?](?=\s|$)", para):
            raw = para[: m.end()]
            if clean_inline(raw, rst) == first:
                return raw.strip()
            if len(clean_inline(raw, rst)) > len(first):
                break
    return ""
