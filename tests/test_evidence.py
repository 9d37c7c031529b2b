"""Evidence selection (rag.answer.evidence), the evidence prompt's short answer
(rag.answer.prompt.split_short_answer), locating it in a passage and attributing an uncited answer
(rag.answer.verify), and the pipeline's evidence path with its two-part reply."""

from __future__ import annotations

import re

import numpy as np
import pytest

from rag.answer.compose import Prepared, add_quotations, around, extract_short_answer
from rag.answer.evidence import (
    KIND_WEIGHT,
    LEXICAL_WEIGHT,
    RARE_WORDS_WEIGHT,
    Excerpt,
    answer_kind,
    asks_how,
    flatten,
    lead_units,
    lexical_shares,
    plain_markup,
    quotable,
    quotations,
    read_units,
    score_units,
    select,
    split_units,
    topic_words,
)
from rag.answer.prompt import (
    EXTRACT_SYSTEM_PROMPT,
    REFUSAL,
    build_evidence_messages,
    quote_source,
    quotes_block,
    split_short_answer,
)
from rag.answer.support import content_words
from rag.answer.verify import attribute, locate, locate_near
from rag.config import RAGConfig
from rag.pipeline import RAGPipeline
from rag.types import Answer, Chunk, Citation, Hit

VOCAB = [
    "tar", "extract", "folder", "archive", "danube", "river", "length", "km", "compress",
    "list", "flag", "python", "file", "line", "loop", "open", "read", "sort", "key",
]  # fmt: skip


def bag(text: str) -> np.ndarray:
    """A deterministic stand-in for an encoder: L2-normalised counts of VOCAB words."""
    words = re.findall(r"\w+", text.lower())
    v = np.array([sum(w.startswith(t) for w in words) for t in VOCAB], dtype=np.float32) + 1e-3
    return v / np.linalg.norm(v)


def embed(texts: list[str], kind: str) -> np.ndarray:
    return np.stack([bag(t) for t in texts])


def words(text: str) -> int:
    return len(text.split())


# ---------------------------------------------------------------------------- units


def test_units_split_prose_into_sentences_and_keep_code_and_list_items_whole():
    text = (
        "Open the file first. Then read it line by line.\n\n"
        "    with open(p) as f:\n        for line in f:\n            print(line)\n\n"
        "- read() returns everything\n- readline() returns one line\n"
    )
    units = [text[u.start : u.end] for u in split_units(text)]
    assert units[0] == "Open the file first."
    assert units[1] == "Then read it line by line."
    assert units[2].startswith("with open(p) as f:") and units[2].endswith("print(line)")
    assert units[3:] == ["- read() returns everything", "- readline() returns one line"]


TABLES = {  # text -> its units
    # a whole table between prose: the header a unit, the |---| rule none, a row not cut at
    # its full stop; a line of prose with pipes and a lone |...| line are no table
    "The settings. Each has a default.\n"
    "| setting | default | meaning |\n|---|:-:|---|\n"
    "| `k` | 5 | passages retrieved. Then read. |\n| `quotes` | 3 | quotes shown |\n"
    "After the table.\n\n"
    "Prose | with pipes | is not a table.\n| nor this |\n": [
        "The settings.",
        "Each has a default.",
        "| setting | default | meaning |",
        "| `k` | 5 | passages retrieved. Then read. |",
        "| `quotes` | 3 | quotes shown |",
        "After the table.",
        "Prose | with pipes | is not a table.\n| nor this |",
    ],
    # a long table is chunked: a chunk may start inside a row, with no header and no rule
    "the end of a row cut by the chunker |\n"
    "| `evidence_passages` | 10 | passages the encoder reads |\n"
    "| `quotes` | 3 | sentences quoted under an answer |": [
        "the end of a row cut by the chunker |",
        "| `evidence_passages` | 10 | passages the encoder reads |",
        "| `quotes` | 3 | sentences quoted under an answer |",
    ],
}


@pytest.mark.parametrize("text", list(TABLES), ids=["whole table", "chunk cut inside a table"])
def test_each_row_of_a_markdown_table_is_a_unit(text):
    """A row is one fact (a setting, its default): as prose the rows ran together into
    60-word pieces that began and ended inside other rows."""
    assert [text[u.start : u.end] for u in split_units(text)] == TABLES[text]


@pytest.mark.parametrize(
    "text",
    [
        "+-----+-----+\n| a   | b   |\n+=====+=====+\n| 1   | 2   |\n+-----+-----+",  # reST grid
        '[cols="1,1"]\n|===\n|a |b\n|1 |2\n|===',  # AsciiDoc
        "| a box of prose, one cell |\n| wrapped over two lines |",  # one cell: a box
    ],
)
def test_a_grid_table_an_asciidoc_table_or_a_box_is_not_taken_for_a_markdown_table(text):
    units = split_units(text)
    assert len(units) == 1 and text[units[0].start : units[0].end] == text


def test_an_indented_table_is_a_literal_block_left_whole():
    text = "Layout::\n\n    | a | b |\n    | c | d |"
    assert [text[u.start : u.end] for u in split_units(text)] == [
        "Layout::",
        "| a | b |\n    | c | d |",
    ]


def test_an_indented_table_with_a_rule_is_a_table_inside_a_list_item():
    """A pipe table indented under a list item (or a note) has its |---| rule: each row is a
    unit. As one literal block, the whole table came with the sentence that introduces it
    ("Chosen on …:") and filled the excerpts' budget: this project's guide lost the sentence
    that says what `make setup` does."""
    text = "- Chosen on dev questions:\n\n  | a | b |\n  |---|---|\n  | 1 | 2 |\n  | 3 | 4 |"
    units = split_units(text)
    assert [text[u.start : u.end] for u in units] == [
        "- Chosen on dev questions:",
        "| a | b |",
        "| 1 | 2 |",
        "| 3 | 4 |",
    ]
    assert [u.prose for u in units[1:]] == [False, False, False]


FENCES = {  # text -> its units, code marked "code:"
    # a fence's code with a blank line and a "?" in a string: one code unit, not three pieces
    # of prose; the sentence ending in ":" before it and the prose after it split as prose
    'To search from Python:\n\n```python\nfrom rag import search\n\nhits = search("Why? '
    'See the CLI.", k=3)\n```\n\nThat is all. It prints hits.': [
        "To search from Python:",
        'code:```python\nfrom rag import search\n\nhits = search("Why? See the CLI.", k=3)\n```',
        "That is all.",
        "It prints hits.",
    ],
    # a chunk that ends inside a block: its opening fence (an info string) runs to the end
    "Run both:\n\n~~~bash\nmake setup\n\nmake demo\n": [
        "Run both:",
        "code:~~~bash\nmake setup\n\nmake demo",
    ],
    # a chunk that starts inside a block: its first fence (bare) closes it
    "x = 1\n\nprint(x)\n```\n\nNow prose. More prose.": [
        "code:x = 1\n\nprint(x)\n```",
        "Now prose.",
        "More prose.",
    ],
}


@pytest.mark.parametrize("text", list(FENCES), ids=["whole", "cut at its end", "cut at its start"])
def test_a_markdown_code_fence_is_one_code_unit_blank_lines_and_all(text):
    """Split at its blank lines, a fence's code was read as prose sentences (and cut again at
    a "?" inside a string), and quoted in pieces under answers over Markdown manuals."""
    got = [("" if u.prose else "code:") + text[u.start : u.end] for u in split_units(text)]
    assert got == FENCES[text]


@pytest.mark.parametrize(
    "text",
    [
        "RCU\n~~~\n\nThe global RCU read lock is cheap.\n\nNAPI\n~~~~\n\nFrames come fast.",
        "Inode properties\n````````````````\n\nThe table. It lists them.",
        "~~~~~~~~\nManagers\n~~~~~~~~\n\nManagers share data.",  # an overline and its rule
    ],
    ids=["short tilde rules", "backtick rule", "overline"],
)
def test_a_rest_heading_rule_of_tildes_or_backticks_is_no_fence(text):
    """reST underlines headings with "~" and "`" too; taken for fences, the prose between two
    headings became one code unit (the Python and Linux manuals hold hundreds)."""
    assert all(u.prose for u in split_units(text))


def test_a_tilde_fence_closes_under_its_code():
    text = "Run:\n\n~~~\nmake setup\n~~~\n\nDone."
    units = split_units(text)
    assert [(text[u.start : u.end], u.prose) for u in units] == [
        ("Run:", True),
        ("~~~\nmake setup\n~~~", False),
        ("Done.", True),
    ]


def test_flatten_keeps_a_code_fences_lines_and_collapses_the_rest():
    text = (
        "To remove a document:\n\n```bash\npython -m rag.docs list\n\n"
        "python -m rag.docs remove old.pdf\n```\n\nThe   index keeps\nthe rest."
    )
    assert flatten(text) == (
        "To remove a document:\n```bash\npython -m rag.docs list\n"
        "python -m rag.docs remove old.pdf\n```\nThe index keeps the rest."
    )
    assert flatten("no   fence\nhere") == "no fence here"
    # cut at the start by the chunker: its indentation kept, the prose after on its own line
    assert flatten("def f():\n    return 1\n```\n\nAfter.") == "def f():\n    return 1\n```\nAfter."


def test_the_decoder_reads_a_code_fence_line_by_line():
    """Collapsed onto one line, a fence's commands came back in answers as one run-on line."""
    text = "Remove it:\n\n```bash\npython -m rag.docs list\npython -m rag.docs remove old.pdf\n```"
    excerpts = select("How do I remove a document?", [text], embed, 200, words)
    user = build_evidence_messages("How do I remove a document?", [e.text for e in excerpts])
    assert (
        "Remove it:\n```bash\npython -m rag.docs list\npython -m rag.docs remove old.pdf\n```"
        in (user[-1]["content"])
    )


def test_a_sentence_ending_in_a_colon_brings_the_fenced_code_it_introduces():
    text = "Start the server:\n\n```bash\npython -m rag.serve --index docs\n\n# then ask\n```"
    scored = score_units("How do I start the server?", [text], embed)
    code = "```bash\npython -m rag.serve --index docs\n# then ask\n```"  # its lines kept
    assert lead_units(scored, 1) == [(0, "Start the server: " + code)]


def test_a_definitions_term_joins_the_first_unit_of_its_description():
    """An AsciiDoc definition is indented under its term, a reST function's description under
    its directive: apart, the description never named what it describes ("This form is to
    view the changes you staged …") and a quote of it lacked the option the user asked for."""
    text = (
        "--cached [<commit>]::\n\n"
        "\tThis form is to view the changes you staged for the next\n"
        "\tcommit relative to the named <commit>.\n+\n"
        "If --merge-base is given, use the merge base. It is HEAD's.\n\n"
        "-p::\n--patch::\nInteractively choose hunks. This gives a chance to review.\n"
    )
    units = [text[u.start : u.end] for u in split_units(text)]
    assert units == [
        "--cached [<commit>]::\n\n\tThis form is to view the changes you staged for the next"
        "\n\tcommit relative to the named <commit>.",
        "If --merge-base is given, use the merge base.",  # after the "+": a paragraph
        "It is HEAD's.",
        "-p::\n--patch::\nInteractively choose hunks.",
        "This gives a chance to review.",
    ]
    assert quotable(units[0]) == (
        "--cached [<commit>]: This form is to view the changes you staged for the next commit"
        " relative to the named <commit>."
    )


def test_a_directives_signature_joins_its_indented_description():
    text = (
        ".. function:: addressof(obj)\n\n   Returns the address of the buffer.\n\n"
        ".. index:: single: buffer\n\nAn index entry renders nothing: never joined.\n\n"
        ".. Note::\n\nA paragraph after an empty note is not its content.\n"
    )
    shown = [quotable(text[u.start : u.end]) for u in split_units(text)]
    assert shown == [
        "addressof(obj) Returns the address of the buffer.",
        None,  # the index entry
        "An index entry renders nothing: never joined.",
        "Note:",
        "A paragraph after an empty note is not its content.",
    ]


@pytest.mark.parametrize(
    "intro", ["The Makefiles have five parts::", "Example::", "Run it::", "The output::"]
)
def test_a_paragraph_introducing_a_literal_block_is_no_term(intro):
    """reST's "...::" paragraph introduces a listing: it brings it when it scores (it ends
    in a colon), but the listing is not its description."""
    text = f"{intro}\n\n    make -C arch/x86 all.\n    make modules_install."
    assert [text[u.start : u.end] for u in split_units(text)] == [
        intro,
        "make -C arch/x86 all.\n    make modules_install.",
    ]


@pytest.mark.parametrize("literal", ["`make setup`", "``len()``"])
def test_a_sentence_may_start_with_an_inline_literal(literal):
    """Technical prose starts sentences with a command or a name in backquotes, often lower
    case: it is a new sentence, not the end of the one before."""
    text = f"Run `make demo` to try it. {literal} installs everything, e.g. `venv`, i.e. All."
    assert [text[u.start : u.end] for u in split_units(text)] == [
        "Run `make demo` to try it.",
        f"{literal} installs everything, e.g. `venv`, i.e. All.",
    ]


def test_a_long_sentence_is_cut_into_bounded_pieces():
    text = " ".join(f"w{i}" for i in range(150)) + "."
    units = split_units(text)
    assert len(units) == 3 and all(words(text[u.start : u.end]) <= 60 for u in units)
    assert text[units[0].start : units[-1].end] == text  # nothing lost


# ---------------------------------------------------------------------------- selection


PASSAGES = [
    "The Rhine is long. It flows to the North Sea. Boats carry coal on it.",
    "Many rivers cross Europe. The Danube river has a length of 2,850 km. It ends in the "
    "Black Sea. Vienna stands on it.",
    "Sort a list with sorted(). Use the key argument to sort by a field.",
]


def test_selection_keeps_the_answering_sentence_within_the_budget_in_document_order():
    excerpts = select("What is the length of the Danube river?", PASSAGES, embed, 20, words)
    texts = " ".join(e.text for e in excerpts)
    assert "The Danube river has a length of 2,850 km." in texts
    assert sum(words(e.text.replace("…", "")) for e in excerpts) <= 20 + 2
    assert "Sort a list" not in texts  # an unrelated passage contributes nothing here
    for e in excerpts:  # units of one passage stay in document order
        starts = [u.start for u in e.units]
        assert starts == sorted(starts)


def test_the_first_passage_always_contributes_and_gaps_are_marked():
    excerpts = select("What is the length of the Danube river?", PASSAGES, embed, 22, words)
    assert excerpts[0].passage == 0  # retrieval's best stays first
    danube = next(e for e in excerpts if e.passage == 1)
    assert danube.text.startswith("…")  # its first sentence was not kept


def test_a_unit_ending_with_a_colon_brings_what_it_introduces():
    passage = (
        "Archives are handy. To extract into a folder, run:\n\n    tar -xf a.tar -C folder\n\n"
        "Compression is optional."
    )
    (excerpt,) = select("extract tar folder", [passage], embed, 30, words)
    assert "run:" in excerpt.text and "tar -xf a.tar -C folder" in excerpt.text


def test_a_sentence_cut_off_by_a_code_block_brings_it():
    """Git's user manual: "… you can always return to the pre-merge state with", then the
    command in an AsciiDoc listing. A prose unit that stops mid-sentence before a code block or
    list is read and quoted with it; an ended sentence before a block, or a cut-off one before
    more prose, is not."""
    passage = (
        "If you get stuck, you can always extract the archive into a folder with\n\n"
        "-------------------------------------------------\n$ tar -xf a.tar -C folder\n"
        "-------------------------------------------------\n\n"
        "Archives are handy.\n\n    tar -tf a.tar\n\nLists are kept as they are"
    )
    units = split_units(passage)
    assert [u.prose for u in units] == [True, False, True, False, True]  # the listing is code
    (excerpt,) = select("extract archive folder", [passage], embed, 60, words)
    assert excerpt.ranked[0][1].startswith("If you get stuck") and "$ tar -xf" in excerpt.best
    assert all(not t.startswith("Archives are handy. ") for _, t in excerpt.ranked)


def test_a_question_is_no_answer_it_takes_its_answers_score_and_brings_it():
    """A unit that asks a question answers nothing: on the demo's own docs the excerpt that
    scored best for "What fraction of tokens does BERT mask?" was a quotation of that very
    question. Such a unit scores as the unit after it and brings it (an FAQ heading and its
    answer); a question with nothing after it in its passage is never chosen on its own."""
    quoted = 'The page lists the questions asked, such as "How long is the Danube river?".'
    faq = "How do I extract an archive into a folder? Run tar with the C flag and the folder."
    facts = "The Danube river has a length of 2,850 km."
    texts = lambda ex: " ".join(e.text for e in ex)  # noqa: E731
    got = select("How long is the Danube river?", [quoted, facts], embed, 14, words)
    assert "2,850 km" in texts(got) and "such as" not in texts(got)
    (excerpt,) = select("extract archive folder", [faq], embed, 30, words)
    assert "extract an archive into a folder?" in excerpt.text and "Run tar" in excerpt.text


def test_the_best_unit_of_an_excerpt_brings_what_it_introduces():
    passage = "To extract into a folder, run:\n\n    tar -xf a.tar -C folder\n\nThat is all."
    (excerpt,) = select("extract tar folder run", [passage], embed, 30, words)
    assert excerpt.best == "To extract into a folder, run: tar -xf a.tar -C folder"


DANUBE_KM = "The Danube river has a length of 2,850 km."


def test_lead_units_are_the_best_over_all_passages_without_questions():
    passages = [
        "Rivers are long. How long is the Danube river? It runs 2,850 km.",
        "The Danube river length is given in km:\n\n    2,850 km\n\nVienna stands on it.",
    ]
    scored = score_units("What is the length of the Danube river?", passages, embed)
    lead = lead_units(scored, 2)
    assert len(lead) == 2 and all("?" not in text for _, text in lead)  # a question is skipped
    best = max(range(len(scored.units)), key=lambda i: scored.scores[i])
    assert lead[0][1].startswith(scored.texts[best])  # best first
    # a unit ending in ":" brings what it introduces
    assert (1, "The Danube river length is given in km: 2,850 km") in lead
    assert lead_units(scored, 1) == lead[:1] and lead_units(score_units("x", [], embed), 2) == []
    twice = score_units("Danube length?", [DANUBE_KM, DANUBE_KM, "Vienna is on it."], embed)
    assert [t for _, t in lead_units(twice, 2)] == [DANUBE_KM, "Vienna is on it."]


@pytest.mark.parametrize(
    ("question", "holds", "lacks"),
    [
        ("How many yards was the field goal?", "He kicked it from 33 yards.", "He kicked it."),
        ("How long is the Danube river?", "It runs two thousand km.", "It runs east."),
        ("In what year was the treaty signed?", "It was signed in 1850.", "It was signed."),
        ("When did the war end?", "It ended in May.", "It ended badly."),
        ("In what century was it built?", "It was built in the 1600s.", "It was built."),
    ],
)
def test_a_number_or_date_question_asks_for_a_unit_holding_one(question, holds, lacks):
    kind = answer_kind(question)
    assert kind is not None and kind.search(holds) and not kind.search(lacks)


@pytest.mark.parametrize(
    "question",
    ["Who wrote the letter?", "How do I undo a commit?", "What is the index?", "Why did it fail?"],
)
def test_other_questions_have_no_answer_kind(question):
    assert answer_kind(question) is None


def test_a_question_word_few_units_hold_weighs_more_than_one_they_all_hold():
    question = content_words("Which leader did the Huguenots follow?")  # {follow, huguenot, leader}
    texts = [
        "The Huguenots had their own militia.",
        "Huguenot refugees settled in Berlin.",
        "Huguenots fled to the Dutch Republic.",
        "They would follow a leader: William of Orange.",
    ]
    assert np.allclose(lexical_shares(question, texts), [1 / 3, 1 / 3, 1 / 3, 2 / 3])  # plain
    shares = lexical_shares(question, texts, rarity=True)
    assert shares[3] > 0.6 > shares[0] == shares[1] == shares[2] > 0.0  # two rare words > one
    # "leader" (one unit) weighs more than "huguenot" (three): it is what tells them apart
    alone = lexical_shares(question, [*texts[:3], "The leader."], rarity=True)
    assert alone[3] > alone[0]
    assert lexical_shares(question, [*texts[:3], "Huguenots follow a leader."], rarity=True)[3] == 1
    assert np.allclose(lexical_shares(set(), texts, rarity=True), 0.0)
    assert lexical_shares(question, [], rarity=True).shape == (0,)


def test_a_factoids_question_words_are_weighted_by_rarity_and_a_how_questions_are_not():
    passages = ["The Huguenots had a militia. The Huguenots fled. They had a leader, William."]
    for question, rare in [
        ("Who was the Huguenots' leader?", True),
        ("How do I follow the Huguenots' leader?", False),
    ]:
        weight = RARE_WORDS_WEIGHT if rare else LEXICAL_WEIGHT
        q = topic_words(question) if rare else content_words(question)
        texts = score_units(question, passages, embed).texts
        expected = score_units(question, passages, embed, lexical_weight=0.0).scores
        expected = expected + weight * lexical_shares(q, texts, rarity=rare)
        scored = read_units(Encoder(), question, passages)
        assert np.allclose(scored.scores, expected, atol=1e-6)
        # the answerability check's score keeps the plain share it was fitted on
        plain = score_units(question, passages, embed).scores
        assert np.allclose(scored.scores if scored.plain is None else scored.plain, plain)
        assert (scored.plain is None) is not rare


def test_a_factoids_words_that_ask_for_the_answers_kind_earn_a_unit_nothing():
    question = "How many passages does the encoder read?"
    assert topic_words(question) == content_words("passages encoder read")
    assert topic_words("What year did the library open?") == content_words("library open")
    passages = ["Many have asked. The encoder reads ten passages."]
    scored = read_units(Encoder(), question, passages)
    bare = score_units(question, passages, embed, lexical_weight=0.0)
    assert scored.scores[0] == pytest.approx(bare.scores[0])  # "Many" is no word of its topic
    assert scored.scores[1] > bare.scores[1]


def test_a_unit_holding_the_asked_kind_scores_more_and_no_other(monkeypatch):
    passages = ["The Danube river runs east. The Danube river runs 2,850 km."]
    asked = score_units("How long does the Danube river run?", passages, embed)
    monkeypatch.setattr("rag.answer.evidence.KIND_WEIGHT", 0.0)
    plain = score_units("How long does the Danube river run?", passages, embed)
    # only the unit with a number gains, by KIND_WEIGHT
    assert np.allclose(asked.scores - plain.scores, [0.0, KIND_WEIGHT], atol=1e-6)


def test_units_read_in_context_use_those_vectors_and_embed_the_rest_alone():
    passages = ["The Danube river is long. It runs 2,850 km.", "Vienna stands on it."]
    asked: list[list[str]] = []

    def read(texts: list[str], spans: list[list[tuple[int, int]]]) -> list[list]:
        assert texts == passages and [len(s) for s in spans] == [2, 1]  # every unit, in order
        # the passage's words for its units ("It runs" reads as the Danube's), none for the last
        return [[bag(texts[0]), bag(texts[0])], [None]]

    def alone(texts: list[str], kind: str) -> np.ndarray:
        asked.append(list(texts))
        return embed(texts, kind)

    scored = score_units("Danube length km", passages, alone, lexical_weight=0.0, read=read)
    assert asked == [["Danube length km"], ["Vienna stands on it."]]  # the query, then the rest
    q = bag("Danube length km")
    expected = [bag(passages[0]) @ q, bag(passages[0]) @ q, bag(passages[1]) @ q]
    assert np.allclose(scored.scores, expected, atol=1e-6)
    plain = score_units("Danube length km", passages, embed, lexical_weight=0.0)
    assert plain.scores[1] < scored.scores[1]  # "It runs 2,850 km." alone misses "Danube"


# ---------------------------------------------------------------------------- quotes


def _excerpt(i: int, score: float, best: str) -> Excerpt:
    return Excerpt(i, best, (), ((score, best),))


def test_quotes_are_the_best_units_the_answer_does_not_say_best_first():
    excerpts = [
        _excerpt(0, 0.7, "Run tar -xf archive.tar -C folder to extract into a folder."),
        _excerpt(1, 0.9, "Use the -z flag for gzip-compressed archives."),
        _excerpt(2, 0.8, "Options"),  # a heading: too few content words to quote
        _excerpt(3, 0.6, "The -v flag lists every file as it is extracted."),
    ]
    answer = "To extract an archive into a folder, run tar -xf archive.tar -C folder."
    # the first excerpt is what the answer already says; the heading is no quote
    assert quotations(excerpts, answer, 3) == [
        (2, "Use the -z flag for gzip-compressed archives."),
        (4, "The -v flag lists every file as it is extracted."),
    ]
    assert quotations(excerpts, answer, 1) == [(2, "Use the -z flag for gzip-compressed archives.")]
    assert quotations(excerpts, answer, 0) == [] and quotations([], answer, 3) == []
    long = _excerpt(0, 0.5, " ".join(f"word{i}" for i in range(200)))
    ((_, cut),) = quotations([long], "", 1)
    assert cut.endswith(" …") and len(cut.split()) == 81


def test_a_quote_inside_another_is_shown_once_as_the_longer():
    """Overlapping chunks of Git's manual gave two quotes: "… with either the -a or -s flag to
    git tag:" and the same sentence with its example. A quote that another taken one holds is
    skipped, and a taken one that a later quote holds is replaced by it, in its place."""
    intro = "You create these annotated tags with either the -a or -s flag to git tag:"
    whole = f"{intro} $ git tag -s <tagname>"
    other = "Lightweight tags are created without the annotate option."
    first = [_excerpt(0, 0.9, intro), Excerpt(1, "", (), ((0.8, whole), (0.7, other)))]
    assert quotations(first, "", 3) == [(2, whole), (2, other)]
    second = [_excerpt(0, 0.9, whole), Excerpt(1, "", (), ((0.8, intro), (0.7, other)))]
    assert quotations(second, "", 3) == [(1, whole), (2, other)]
    # the count per excerpt follows the quote to its new excerpt
    also = "Annotated tags are meant for release while lightweight tags are private."
    third = [Excerpt(0, "", (), ((0.9, intro), (0.6, also))), first[1]]
    assert quotations(third, "", 3, per_excerpt=1) == [(2, whole), (1, also)]


def test_a_passage_cut_inside_a_sentence_is_quoted_after_an_ellipsis():
    """A chunk's overlap starts at any word: Git's FAQ was quoted as "which will replace the old
    commit by a new commit …", as if that were a whole sentence. A passage's first unit that
    starts with two lower-case words and ends a sentence is quoted after "… "; one that starts
    with an identifier, a term and its description or a title is not, nor is a later unit; the
    end of a sentence that another passage quotes whole is not quoted again."""
    cut = "which will replace the old commit with a new one. Run git log to check the commit."
    (excerpt,) = select("replace old commit check", [cut], embed, 40, words)
    assert {t for _, t in excerpt.ranked} == {
        "… which will replace the old commit with a new one.",
        "Run git log to check the commit.",
    }
    assert excerpt.text.startswith("which will")  # the decoder reads the passage as it is
    for start in (
        "pg_dump is a client application.",
        "lambda An anonymous function.",
        "bare repository: a repository that has no working tree.",
        "psql psql — PostgreSQL interactive terminal",
    ):
        (ex,) = select("client application anonymous function", [start], embed, 40, words)
        assert ex.best == start
    whole = "Run git commit --amend, which will replace the old commit with a new one."
    both = select("replace old commit check", [whole, cut], embed, 80, words)
    quotes = [q for _, q in quotations(both, "", 5)]
    assert whole in quotes and not any(q.startswith("…") for q in quotes)


def test_the_decoder_reads_no_listing_delimiters():
    """An AsciiDoc listing's "-----" lines, joined into the excerpt's text, were copied into
    an answer ("use the -s flag: ---------------- $ git tag -s <tagname> ---------------")."""
    text = "use the -s flag: ---------------- $ git tag -s <tagname> ----------------"
    assert plain_markup(text) == "use the -s flag: $ git tag -s <tagname>"
    kept = "| a | b | |---|---| x--y and ... stay"
    assert plain_markup(kept) == kept


def test_a_unit_the_answer_copies_is_still_quoted_when_it_names_an_option_the_answer_does_not():
    """Seen on a Git dev question: the 0.5B copied the description of `--cached` and named
    another command; the quote that names the option was left out as "already said"."""
    unit = "--cached: This form is to view the changes you staged for the next commit."
    excerpts = [_excerpt(0, 0.9, unit)]
    wrong = "Use `git status` to view the changes you staged for the next commit."
    assert quotations(excerpts, wrong, 3) == [(1, unit)]
    right = "Use `git diff --cached` to view the changes you staged for the next commit."
    assert quotations(excerpts, right, 3) == []


def test_quotes_leave_out_headings_rules_and_repeats():
    """Seen on the dev questions' answers: a reST heading quoted with its ===== line, the same
    sentence quoted twice from a page that two chunks (or two files) hold."""
    assert quotable("Transparent Hugepage Support ==========================") is None
    assert quotable("PEP 343: The 'with' statement ===============") is None
    # a section heading the unit starts with is left out: the quote's label names the section
    assert quotable("DESCRIPTION ----------- Manage reflog information.") == (
        "Manage reflog information."
    )
    assert quotable("NAME\n----\ngit-ls-files - Show information about files") == (
        "git-ls-files - Show information about files"
    )
    assert quotable("Undoing a merge\n===============\nIf you get stuck, go back.") == (
        "If you get stuck, go back."
    )
    # an underline shorter than its heading, or a reST title's " --- " dash, is no heading
    assert quotable("See the table ---- below for the options.") == (
        "See the table below for the options."
    )
    assert quotable("Some prose here. More text --------- and the rest.") == (
        "Some prose here. More text and the rest."
    )
    assert quotable(":mod:`re` --- Regular expression operations.").startswith("`re` Regular")
    assert quotable("------------ $ git bisect skip # cannot test ------------") == (
        "$ git bisect skip # cannot test"
    )
    assert (
        quotable("Use git reset --soft HEAD~1 to undo it.")
        == "Use git reset --soft HEAD~1 to undo it."
    )
    # Markdown headings (seen quoted on this project's own docs: "## Install and first run"),
    # but not a root prompt or a preprocessor line in a listing
    assert quotable("[[def_HEAD]]") is None  # an AsciiDoc anchor alone: nothing shown
    assert quotable("## Install and first run") is None
    assert quotable("# Getting started: chat with your own documents") is None
    for listing in (
        "# echo never > /sys/kernel/mm/transparent_hugepage/enabled",
        "# modprobe bonding",
        "#include <stdio.h>",
    ):
        assert quotable(listing) == listing
    # a comment that begins a code block keeps the code after it
    assert (
        quotable("# Pickle the data.\npickle.dump(data, f)")
        == "# Pickle the data. pickle.dump(data, f)"
    )
    same = "See the coding style document for the indentation width."
    excerpts = [
        _excerpt(0, 0.9, "Kernel Coding Style =========="),
        _excerpt(1, 0.8, same),
        _excerpt(2, 0.7, same),
        _excerpt(3, 0.6, "Tabs are eight characters wide, and so are indentations."),
    ]
    assert [n for n, _ in quotations(excerpts, "Indent with tabs.", 3)] == [2, 4]


@pytest.mark.parametrize(
    ("raw", "shown"),
    [  # seen in quotes of the Git manual (AsciiDoc) and the kernel docs (reST)
        (
            "[[def_detached_HEAD]]detached HEAD:: Normally the <<def_HEAD,HEAD>> stores a <<def_branch,branch>>.",
            "detached HEAD: Normally the HEAD stores a branch.",
        ),
        # a literal block's marker (reST) and a definition list's terms (AsciiDoc) show as a
        # colon; C++'s scope operator stays
        (
            "To free pagecache:: echo 1 > /proc/sys/vm/drop_caches",
            "To free pagecache: echo 1 > /proc/sys/vm/drop_caches",
        ),
        ("-v:: --verbose:: Report the names.", "-v: --verbose: Report the names."),
        ("Use std::vector here.", None),
        (
            "See linkgit:git-reset[1] and <<merge-strategies>>.",
            "See git-reset(1) and merge-strategies.",
        ),
        (
            "Use :c:func:`kmalloc()` as :ref:`the guide <mm-guide>` says, with ``GFP_KERNEL``.",
            "Use `kmalloc()` as `the guide` says, with `GFP_KERNEL`.",
        ),
        (
            "A :keyword:`!yield` makes :c:member:`~PyConfig.argv` differ (:pep:`343`).",
            "A `yield` makes `argv` differ (PEP 343).",
        ),
        # no markup: left as it is (a time, a command, a path)
        ("At 10:30 run `make` :: then echo 1 > /proc/sys/vm/drop_caches", None),
    ],
)
def test_quotes_show_inline_markup_as_rendered(raw, shown):
    assert plain_markup(raw) == (shown or raw)
    assert quotable(raw) == (shown or raw)


@pytest.mark.parametrize(
    "raw, quoted",
    [
        ("Run: ```bash python -m rag.docs list ```", "Run: `python -m rag.docs list`"),
        (
            "Two: ~~~ make setup ~~~ and ```sh make demo ``` then.",
            "Two: `make setup` and `make demo` then.",
        ),
        ("Cut: ```bash make setup make", "Cut: make setup make"),  # the chunk ends inside
        ("x = 1 print(x) ``` Now prose.", "x = 1 print(x) Now prose."),  # it starts inside
        ("Run: ```bash echo `date` ```", "Run: echo `date`"),  # backticks inside: unwrapped
    ],
)
def test_a_quoted_code_fence_shows_as_inline_code(raw, quoted):
    """A quote is one line, where a fence's markers read as stray backticks; the decoder
    reads the fence as written (a Markdown code fence is no reST literal)."""
    assert quotable(raw) == quoted
    assert plain_markup(raw) == raw


@pytest.mark.parametrize(
    ("unit", "shown"),
    [  # seen quoted under answers over the Python and kernel docs (reST)
        (
            ".. versionchanged:: 3.5\n   The output is now in the same order as the input.",
            "Changed in version 3.5: The output is now in the same order as the input.",
        ),
        (".. versionadded:: 3.11", "Added in version 3.11:"),
        (".. note:: Use ``run()`` instead.", "Note: Use `run()` instead."),
        (".. seealso:: Module :mod:`os`.", "See also: Module `os`."),
        (
            ".. function:: accumulate(iterable[, func, *, initial=None])",
            "accumulate(iterable[, func, *, initial=None])",
        ),
        (
            ".. module:: __main__\n   :synopsis: The environment where top-level code is run.",
            "__main__: The environment where top-level code is run.",
        ),
        # directives that render no prose: no quote
        (".. kernel-doc:: fs/debugfs/file.c\n   :export:", None),
        (".. index:: single: formatted string literal", None),
        (".. code-block:: c", None),
    ],
)
def test_a_quote_shows_a_rest_directive_as_rendered(unit, shown):
    assert quotable(unit) == shown


def test_an_excerpt_gives_its_next_unit_when_the_answer_says_its_best():
    """Seen on a Git dev question: the answer said "This is known as being in detached HEAD
    state", and the sentence after it, which says what that means, was never quoted."""
    said = "This is known as being in detached HEAD state."
    means = "It means simply that HEAD refers to a specific commit, not a named branch."
    detached = Excerpt(0, f"{said} {means}", (), ((0.9, said), (0.7, means)))
    switch = "Use git switch -c to make a branch there."
    other = Excerpt(1, switch, (), ((0.8, switch),))
    assert quotations([detached, other], said, 3) == [(2, other.text), (1, means)]
    # at most per_excerpt quotes from one excerpt, best first over all of them
    third = "You can look around and make experimental commits."
    many = Excerpt(0, "", (), ((0.9, means), (0.85, third), (0.82, DANUBE_KM)))
    assert quotations([many, other], "", 3) == [(1, means), (1, third), (2, other.text)]
    assert quotations([many, other], "", 3, per_excerpt=1) == [(1, means), (2, other.text)]


def test_two_quotes_of_one_excerpt_add_one_citation():
    means = "It means simply that HEAD refers to a specific commit, not a named branch."
    look = "You can look around and make experimental commits there."
    excerpt = Excerpt(0, f"{means} {look}", (), ((0.9, means), (0.8, look)))
    hits = [Hit(Chunk(id="a", text=excerpt.text, source="git-checkout.txt"), 1.0)]
    prep = Prepared("What does detached HEAD mean?", "", hits, [], {}, evidence=[excerpt])
    answer = Answer(text="HEAD is detached.")
    shown = add_quotations(answer, prep, 4)
    assert answer.quotes == [(1, means), (1, look)] and shown.count("[1]") == 2
    assert [c.number for c in answer.citations] == [1]


@pytest.mark.parametrize(
    ("heading_path", "path", "label"),
    [
        (
            ("Netconsole", "Introduction:"),
            "networking/netconsole.rst.txt",
            "Netconsole › Introduction",
        ),
        (("Linux Serial Console",), "admin-guide/serial-console.rst.txt", "Linux Serial Console"),
        (("A", "B", "C"), "x.md", "A › C"),  # the page and the section, not every level
        (("[NOTE]", "Tagging a version"), "user-manual.txt", "Tagging a version"),
        ((), "/data/pg/sql-explain.txt", "sql-explain.txt"),  # no headings: the file's name
        ((":mod:`re` --- Regular expressions",), "re.rst.txt", "`re` --- Regular expressions"),
        (("x" * 200,), "x.md", "x" * 89 + "…"),
        # cut inside a code span: the span is closed, so markdown stays sane
        (
            ("Serving", "`GET /v1/documents`, `DELETE " + "y" * 90 + "`"),
            "s.md",
            "Serving › `GET /v1/documents`, `DELETE " + "y" * 50 + "`…",
        ),
    ],
)
def test_a_quote_names_its_page_and_section(heading_path, path, label):
    assert quote_source(heading_path, path) == label


def test_quotes_block_labels_each_quote_by_its_citation():
    """The quote's subject is often only in the heading above it ("This module logs kernel
    printk messages over UDP" under "Netconsole"): each quote line names its passage's page and
    section, from the answer's citations; a quote whose number none names has no label."""
    cit = Citation(3, "/d/netconsole.rst", ("Netconsole", "Introduction:"), "", 0.5, "c3")
    quotes = [(3, "This module logs kernel printk messages over UDP."), (4, "Other.")]
    block = quotes_block(quotes, citations=[cit])
    assert block.splitlines()[-2:] == [
        '- "This module logs kernel printk messages over UDP." (Netconsole › Introduction) [3]',
        '- "Other." [4]',
    ]
    assert quotes_block(quotes, markers=False, citations=[cit]).endswith(
        '(Netconsole › Introduction)\n- "Other."'
    )
    assert "(" not in quotes_block(quotes)  # no citations given: quotes and markers only


def test_an_excerpt_ranks_its_units_with_what_they_introduce():
    passage = (
        "Archives are files. To extract into a folder, run:\n\n    tar -xf a.tar -C folder\n\n"
        "The folder must exist."
    )
    (excerpt,) = select("extract into folder run tar", [passage], embed, 60, words)
    texts = [t for _, t in excerpt.ranked]
    assert texts[0] == excerpt.best == "To extract into a folder, run: tar -xf a.tar -C folder"
    assert "tar -xf a.tar -C folder" not in texts[1:]  # the example comes once, with its ":"
    assert [s for s, _ in excerpt.ranked] == sorted((s for s, _ in excerpt.ranked), reverse=True)
    assert excerpt.score == excerpt.ranked[0][0] and len(texts) == 3


@pytest.mark.parametrize(
    "question",
    [
        "How do I undo my last commit?",
        "how can I list the files in an archive",
        "I started a merge and got conflicts. How do I cancel it?",
        "Why does the build fail?",
        "What does git gc do?",
        'My oops message says "Tainted: P". What does that mean?',
        "What is a fast-forward merge?",
        "What's the difference between fetch and pull?",
        "Which flag should I use inside an interrupt handler?",
        "Explain the prefix cache.",
    ],
)
def test_questions_that_ask_how_why_or_what_something_does_get_quotes(question):
    assert asks_how(question)


@pytest.mark.parametrize(
    "question",
    [
        "Who wrote a letter to the elector praising Luther?",
        "When did the Normans arrive?",
        "How many tokens does BERT mask?",
        "How long is the Danube river?",
        "How was the efficiency of a steam engine typically evaluated?",
        # a capital I that is a numeral, not the asker
        "When did Philip I convene an assembly?",
        "Who was the MVP of Super Bowl I and II?",
        "How many sports does Harvard compete in NCAA division I",
        "What is the clarity of liquid oxygen?",
        "What is a main tributary to the Rhine that goes through Northeastern France?",
        "In what state is oxygen shipped in bulk?",
    ],
)
def test_factoid_questions_keep_their_short_answer_alone(question):
    assert not asks_how(question)


def test_an_oversized_best_unit_is_clipped_to_the_budget():
    passage = "Danube river length " + " ".join(["km"] * 200) + "."
    (excerpt,) = select("Danube river length", [passage], embed, 12, words)
    assert words(excerpt.text) <= 13 and excerpt.text.endswith("…")


# ---------------------------------------------------------------------------- the reply


def test_short_answer_is_the_last_line_after_the_explanation():
    s = split_short_answer("Run it with -C to pick the folder [2].\nShort answer: `tar -xf a -C D`")
    assert (s.short, s.rest) == ("tar -xf a -C D", "Run it with -C to pick the folder [2].")
    assert split_short_answer("It flows 2,850 km [1].\n**Short answer:** 2,850 km.").short == (
        "2,850 km"
    )


def test_no_short_answer_without_the_line_for_a_sentence_or_a_refusal():
    assert split_short_answer("Tanzania borders Kenya [1].").short is None
    long_line = " ".join(["word"] * 20)
    assert split_short_answer(f"It is so [1].\nShort answer: {long_line}").short is None
    assert split_short_answer(f"{REFUSAL}\nShort answer: x").short is None


def test_locate_finds_the_phrase_across_case_and_whitespace_only_word_for_word():
    passage = "To extract, run tar -xf archive.tar\n  -C DIR into another folder."
    start, end = locate("TAR -XF archive.tar -c dir", passage)
    assert passage[start:end] == "tar -xf archive.tar\n  -C DIR"
    assert locate("2,850 km.", "It flows 2,850 km to the sea.") is not None
    assert locate("tar -xzf", passage) is None
    assert locate("act", "extract") is None  # whole words only
    # a dash for any dash, either apostrophe: "11-13th" as typed, "11–13th" as printed
    dated = "Built in the 11–13th century AD on Europe’s rivers."
    assert dated[slice(*locate("11-13th century AD", dated))] == "11–13th century AD"
    assert dated[slice(*locate("Europe's rivers", dated))] == "Europe’s rivers"
    assert locate("11 13th", dated) is None and locate("Europes", dated) is None


def test_locate_near_finds_the_documents_own_spelling_of_a_short_answer_and_nothing_far():
    text = "The Rhine is 1,232 kilometres (766 miles) long; Fermat numbers take the form 22n + 1."
    assert text[slice(*locate_near("1,232 kilometers", text))] == "1,232 kilometres"
    assert text[slice(*locate_near("2n + 1", text))] == "22n + 1"  # its end's full stop left
    assert text[slice(*locate_near("766 mile", text))] == "766 miles"  # the bracket left out
    assert locate_near("unknown", "It is known.") is None  # a word's negation is not near it
    assert locate_near("1,320 kilometres", text) is None  # another number is never near
    assert locate_near("1,232 kilometre", text) is not None  # near, as spelling goes ...
    assert locate_near("1,232 kilometre", text, min_ratio=0.99) is None  # ... the bar sets it
    assert locate_near("", text) is None and locate_near("Danube", text) is None


def test_attribute_names_the_passage_that_supports_the_answer_best():
    passages = ["Boats carry coal.", "The Danube is 2,850 km long.", "Danube facts."]
    assert attribute("The Danube is 2,850 km long.", passages, "How long is the Danube?") == 2
    assert attribute("Elephants are grey.", passages) is None


# ---------------------------------------------------------------------------- pipeline


class Encoder:
    def encode(self, texts, kind="document"):
        return embed(list(texts), kind)


class Retriever:
    encoder = Encoder()

    def __init__(self, hits):
        self.hits = hits

    def search(self, query, k=5, mode="hybrid"):
        return self.hits[:k]


class TwoPartDecoder:
    """Ends its turn after the explanation; the short answer comes when asked for it through
    the continuation, like the 0.5B; a factoid's short-answer prompt gets ``extracted``."""

    def __init__(self, explanation: str, short: str, extracted: str = ""):
        self.explanation, self.short, self.extracted = explanation, short, extracted
        self.calls: list[dict] = []

    def fit_passages(self, question, passages, max_new_tokens=256):
        return list(passages)

    def count_tokens(self, text):
        return words(text)

    def stream(self, messages, continuation="", stats=None, **kw):
        self.calls.append({"messages": messages, "continuation": continuation, **kw})
        text = (" " + self.short) if continuation else self.explanation
        if messages[0]["content"] == EXTRACT_SYSTEM_PROMPT:
            text = self.extracted
        if stats is not None:
            stats.update(new_tokens=len(text.split()), total_s=0.1, ttft_s=0.05)
        yield from [w if i == 0 else " " + w for i, w in enumerate(text.split(" "))]


def hit(i: int, text: str) -> Hit:
    return Hit(Chunk(f"id{i}", text, f"/docs/f{i}.md", ("Guide",), 100, 100 + len(text)), 0.9, i)


def evidence_pipeline(
    explanation: str, short: str, extracted: str = "", **settings: object
) -> tuple[RAGPipeline, TwoPartDecoder]:
    """The evidence path over PASSAGES; a factoid is explained like any question unless the
    test asks for ``factoid="extract"`` (the default's own tests below)."""
    hits = [hit(i + 1, p) for i, p in enumerate(PASSAGES)]
    gen = TwoPartDecoder(explanation, short, extracted)
    settings = {"factoid": "explain", **settings}
    cfg = RAGConfig.of(evidence_tokens=40, answerability_threshold=None, k=3, **settings)
    return RAGPipeline(cfg, retriever=Retriever(hits), generator=gen), gen


def test_the_short_answer_is_decoded_as_a_continuation_of_the_explanation():
    pipe, gen = evidence_pipeline("The Danube river is 2,850 km long [2].", "2,850 km")
    answer = pipe.answer("What is the length of the Danube river?")
    explanation = "The Danube river is 2,850 km long [2]."
    assert [c["continuation"] for c in gen.calls] == ["", f"{explanation}\nShort answer:"]
    assert "Short answer:" in gen.calls[0]["stop"]  # the visible reply ends at that line
    assert answer.text == "The Danube river is 2,850 km long.\nShort answer: 2,850 km"
    user = gen.calls[0]["messages"][-1]["content"]
    assert user.startswith("Excerpts:") and "Sort a list" not in user
    # [2] names the second excerpt, which is the Danube passage; the span is found in it
    assert [c.chunk_id for c in answer.citations] == ["id2"]
    span = answer.answer_span
    assert (span.text, span.number, span.origin) == ("2,850 km", 2, "decoder")
    assert PASSAGES[1][span.start : span.end] == "2,850 km"
    assert span.source_start == 100 + span.start
    streamed = list(pipe.stream("What is the length of the Danube river?"))
    assert "".join(streamed[:-1]) == f"{explanation}\nShort answer: 2,850 km"


def test_the_written_answer_stops_where_the_decoder_starts_copying_the_next_excerpt():
    """The 0.5B sometimes goes on with the prompt itself ("…:\n\n[2] … Q2: Could not find
    header files …", a Linux dev answer); an answer never starts a paragraph with "["."""
    pipe, gen = evidence_pipeline("Sort it with sorted() [1].", "sorted()")
    pipe.answer("How do I sort a list?")
    assert "\n\n[" in gen.calls[0]["stop"]


def test_a_short_answer_no_passage_holds_is_not_shown_and_an_uncited_answer_is_attributed():
    pipe, _ = evidence_pipeline("The Danube river has a length of 2,850 km.", "3,000 miles")
    answer = pipe.answer("What is the length of the Danube river?")
    assert answer.answer_span is None
    assert answer.text == "The Danube river has a length of 2,850 km."  # no ungrounded line
    assert answer.citations_completed and [c.chunk_id for c in answer.citations] == ["id2"]


def test_a_short_answer_that_only_repeats_the_question_is_not_shown():
    """Seen on the SQuAD train dev questions: "What did the SNP publicly opine about the oil
    revenues?" got the short answer "SNP" (8 of 100 answers named what was asked about)."""
    pipe, _ = evidence_pipeline("The Danube river is 2,850 km long [2].", "the Danube river")
    answer = pipe.answer("What is the length of the Danube river?")
    assert answer.answer_span is None and "Short answer" not in answer.text
    assert answer.text == "The Danube river is 2,850 km long."


DANUBE = "The Danube river has a length of 2,850 km."


def test_a_factoids_short_answer_is_copied_from_the_best_sentences_and_shown_with_its_own():
    """The default for a factoid: one short call over the encoder's best sentences; the reply
    is the sentence holding the short answer, cited, then the short answer line; nothing else
    is decoded and no quote follows."""
    question = "What is the length of the Danube river?"
    pipe, gen = evidence_pipeline("unused [1].", "unused", "2,850 km.", factoid="extract")
    streamed = list(pipe.stream(question))
    answer = streamed[-1]
    assert len(gen.calls) == 1 and gen.calls[0]["messages"][0]["content"] == EXTRACT_SYSTEM_PROMPT
    user = gen.calls[0]["messages"][-1]["content"]
    assert user.startswith("Text: ") and DANUBE in user and user.endswith(f"Question: {question}")
    assert gen.calls[0]["max_new_tokens"] <= 24 and "\n" in gen.calls[0]["stop"]
    assert answer.text == f"{DANUBE}\nShort answer: 2,850 km" and answer.quotes == []
    number = answer.citations[0].number
    assert [c.chunk_id for c in answer.citations] == ["id2"]  # the Danube passage, however ordered
    assert "".join(streamed[:-1]) == f"{DANUBE} [{number}]\nShort answer: 2,850 km"
    span = answer.answer_span
    assert (span.text, span.number, span.origin) == ("2,850 km", number, "decoder")
    assert answer.timings["new_tokens"] == 2  # the one short call's tokens


def test_the_short_answer_call_leaves_a_refusal_gates_cache_and_ban_to_the_other_prompt():
    gen = TwoPartDecoder("unused", "unused", "2,850 km")
    prep = Prepared("Danube length?", "Danube length?", [], [], {}, lead=[(2, DANUBE)])
    args = {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": 128}
    gated = {**args, "prompt_cache": object(), "ban": [[7]]}
    assert extract_short_answer(gen, prep, gated, {}) == ("2,850 km", 2, DANUBE)
    (call,) = gen.calls
    assert {k: v for k, v in call.items() if k in gated} == {**args, "max_new_tokens": 24}
    # a very long unit is read up to its first LEAD_WORDS words: the prompt stays bounded
    long = Prepared("q?", "q?", [], [], {}, lead=[(1, " ".join(["w"] * 5000) + " 2,850 km")])
    assert extract_short_answer(gen, long, args, {}) is None  # not in what it read
    assert len(gen.calls[-1]["messages"][-1]["content"].split()) < 200
    near = Prepared("q?", "q?", [], [], {}, lead=[(1, " ".join(["w"] * 100) + " 2,850 km")])
    _, _, shown = extract_short_answer(gen, near, args, {})
    assert shown.startswith("…") and shown.endswith("2,850 km") and len(shown.split()) <= 62
    # spelt its own way: the sentence's words are the short answer; never the question's own
    said = "It is 2,850 kilometres long."
    spelt = Prepared("How long?", "How long?", [], [], {}, lead=[(1, said)])
    gen.extracted = "2,850 kilometers"
    assert extract_short_answer(gen, spelt, args, {}) == ("2,850 kilometres", 1, said)
    asked = Prepared("Which kilometres?", "Which kilometres?", [], [], {}, lead=spelt.lead)
    gen.extracted = "kilometers"
    assert extract_short_answer(gen, asked, args, {}) is None


def test_a_factoid_decoder_copies_the_short_answer_and_only_for_factoids():
    """``factoid_generator`` (the 1.5B beside the default 0.5B) writes a factoid's short answer
    and nothing else; the answering decoder writes the rest, and a how-question never asks the
    factoid decoder for anything (it is not even loaded: the pipeline passes it lazily)."""
    hits = [hit(i + 1, p) for i, p in enumerate(PASSAGES)]
    gen, factoid = TwoPartDecoder("unused", "unused", "3"), TwoPartDecoder("x", "x", "2,850 km")
    cfg = RAGConfig.of(evidence_tokens=40, answerability_threshold=None, k=3)
    pipe = RAGPipeline(cfg, retriever=Retriever(hits), generator=gen, factoid_generator=factoid)
    answer = pipe.answer("What is the length of the Danube river?")
    assert answer.text == f"{DANUBE}\nShort answer: 2,850 km" and gen.calls == []
    assert [c["messages"][0]["content"] for c in factoid.calls] == [EXTRACT_SYSTEM_PROMPT]
    factoid.calls.clear()
    pipe.answer("How do I sort a list of records by a field?")
    assert factoid.calls == [] and gen.calls
    # passed-in decoders without a factoid one: the answering decoder copies factoids too
    alone = RAGPipeline(cfg, retriever=Retriever(hits), generator=gen)
    assert alone.factoid_generator is gen


def test_the_pipeline_loads_the_factoid_decoder_once_and_warms_it_at_load(monkeypatch):
    """Beside the default 0.5B with the 1.5B installed, the pipeline loads the 1.5B (no
    adapter) the first time it is asked for, and runs one token of the short-answer prompt
    then, so the first factoid's answer does not pay the engine's first call."""
    import rag.generate.load as load_module
    from rag.models import registry

    loaded = []

    def fake_load(settings, device="auto", adapter=None, *, short_replies=False):
        loaded.append((settings.decoder, adapter, short_replies))
        return TwoPartDecoder("x", "x", "1")

    monkeypatch.setattr(registry, "is_installed", lambda pkg: True)
    monkeypatch.setattr(load_module, "load_decoder", fake_load)
    pipe = RAGPipeline(RAGConfig.of(answerability_threshold=None))
    first = pipe.factoid_generator
    # loaded as a decoder of short replies (its engine's auto precision weighs it)
    assert pipe.factoid_generator is first and loaded == [("qwen2.5-coder-1.5b", "none", True)]
    (warm,) = first.calls
    assert warm["max_new_tokens"] == 1
    assert warm["messages"][0]["content"] == EXTRACT_SYSTEM_PROMPT
    same = RAGPipeline(RAGConfig.of(factoid_decoder="same"), generator=None)
    monkeypatch.setattr(RAGPipeline, "fallback_generator", property(lambda self: "fallback"))
    assert same.factoid_generator == "fallback"  # the answering decoder: nothing more loaded
    assert len(loaded) == 1


@pytest.mark.parametrize("at", [0, 3, 50, 97])
def test_a_long_sentence_is_cut_around_its_short_answer(at):
    words_ = [f"w{i}" for i in range(100)]
    words_[at : at + 2] = ["the", "answer,"]
    text = " ".join(words_)
    start = text.index("the answer")
    cut = around(text, start, start + len("the answer"), limit=10)
    assert "the answer," in cut and len(cut.replace("…", "").split()) == 10
    shown = cut.split()
    assert cut.startswith("…") == (words_[0] not in shown)
    assert cut.endswith("…") == (words_[-1] not in shown)
    assert cut.startswith("…") or cut.endswith("…")
    assert " ".join(w for w in cut.split() if w != "…") in text  # the document's own words
    assert around("a short one", 2, 7) == "a short one"


@pytest.mark.parametrize("extracted", ["3,000 miles", "the Danube river", "", REFUSAL, "the"])
def test_a_factoid_short_answer_no_best_sentence_holds_falls_back_to_the_explanation(extracted):
    """Words no best sentence holds, the question's own words, nothing or a refusal: the reply
    is then written as for any question (explanation, its short answer line), and the first
    call's tokens count too."""
    pipe, gen = evidence_pipeline(
        "The Danube river is 2,850 km long [2].", "2,850 km", extracted, factoid="extract"
    )
    answer = pipe.answer("What is the length of the Danube river?")
    assert [c["continuation"] != "" for c in gen.calls] == [False, False, True]
    assert answer.text == "The Danube river is 2,850 km long.\nShort answer: 2,850 km"
    explained = "The Danube river is 2,850 km long [2]."
    spent = len(extracted.split())
    assert answer.timings["new_tokens"] == spent + len(explained.split(" ")) + 2


def test_a_how_question_is_never_answered_by_the_short_answer_prompt():
    pipe, gen = evidence_pipeline("Use the key argument [1].", "key", "key", factoid="extract")
    pipe.answer("How do I sort a list of records by a field?")
    assert all(c["messages"][0]["content"] != EXTRACT_SYSTEM_PROMPT for c in gen.calls)
    with pytest.raises(Exception, match="--factoid must be one of extract, explain"):
        RAGConfig.of(factoid="spans")


def test_a_refusal_is_not_continued():
    pipe, gen = evidence_pipeline(REFUSAL, "unused")
    answer = pipe.answer("What is the length of the Danube river?")
    assert answer.refused and len(gen.calls) == 1 and answer.answer_span is None


def test_evidence_tokens_zero_gives_the_whole_passages():
    hits = [hit(i + 1, p) for i, p in enumerate(PASSAGES)]
    gen = TwoPartDecoder("x", "y")
    gen.stream = lambda messages, **kw: iter([gen.calls.append(messages) or "It is long [1]."])
    cfg = RAGConfig.of(evidence_tokens=0, answerability_threshold=None, k=3)
    RAGPipeline(cfg, retriever=Retriever(hits), generator=gen).answer("Danube length?")
    assert gen.calls[0][-1]["content"].startswith("Passages:")


def test_an_empty_reply_is_answered_by_the_best_sentence_of_the_first_excerpt():
    pipe, _ = evidence_pipeline("", "")
    answer = pipe.answer("What is the length of the Danube river?")
    assert not answer.refused and answer.text
    assert answer.text in PASSAGES[answer.citations[0].number - 1]


def test_a_how_question_gets_the_encoders_sentences_quoted_word_for_word_and_cited():
    """The quotes follow the reply in the stream (markers kept, so an API client sees them),
    end Answer.text (markers out, as the rest of it), and each is its passage's own words; the
    passage a quote comes from is cited; the decoder's raw reply is untouched."""
    reply = "Use the key argument [1]."
    pipe, gen = evidence_pipeline(reply, "key")
    question = "How do I sort a list of records by a field?"
    streamed = list(pipe.stream(question))
    answer = streamed[-1]
    text = "".join(streamed[:-1])
    assert answer.quotes, "a how-to question gets quotes"
    assert answer.raw_text.startswith(reply) and "From the documents:" not in answer.raw_text
    # no short answer: the explanation and the quotes answer a how-question, and one
    # continuation call fewer is decoded
    assert text.startswith(f"{reply}\n\nFrom the documents:\n- ")
    assert answer.answer_span is None and len(gen.calls) == 1
    cited = {c.number: c for c in answer.citations}
    for n, quote in answer.quotes:
        # where it is from (the hit's heading path: "Guide") between the quote and its marker
        assert (
            f'- "{quote}" (Guide) [{n}]' in text and f'- "{quote}" (Guide)\n' in answer.text + "\n"
        )
        assert f"[{n}]" not in answer.text
        assert quote in " ".join(answer.passages[n - 1].chunk.text.split())
        assert n in cited and cited[n].chunk_id == answer.passages[n - 1].chunk.id
        assert not set(quote.lower().split()) <= set(reply.lower().split())
    # a factoid keeps its short answer alone; quotes = 0 turns them off
    pipe, _ = evidence_pipeline("The Danube river is 2,850 km long [2].", "2,850 km")
    assert pipe.answer("What is the length of the Danube river?").quotes == []
    off, _ = evidence_pipeline(reply, "key", quotes=0)
    assert off.answer(question).quotes == []


def test_the_decoder_reads_the_excerpts_markup_as_rendered():
    """The decoder copied what it read: "are:: ramdisk_start=N", "See linkgit:git-reset[1]".
    It reads the excerpts as a reader sees them rendered (rag.answer.evidence.plain_markup);
    the passages, their citations and the check of the short answer keep the raw text."""
    passages = [
        "To free the page cache without a reboot, run as root:: echo 1 > /proc/sys/vm/drop_caches",
        "To undo a commit and keep its changes, see linkgit:git-reset[1] and ``--soft``.",
    ]
    gen = TwoPartDecoder("Write 1 to drop_caches [1].", "echo 1 > /proc/sys/vm/drop_caches")
    cfg = RAGConfig.of(
        evidence_tokens=80, answerability_threshold=None, k=2, quotes=0, factoid="explain"
    )
    hits = [hit(i + 1, p) for i, p in enumerate(passages)]
    answer = RAGPipeline(cfg, retriever=Retriever(hits), generator=gen).answer(
        "Which command frees the page cache without a reboot?"
    )
    prompt = gen.calls[0]["messages"][-1]["content"]
    assert "run as root: echo 1 > /proc/sys/vm/drop_caches" in prompt
    assert "::" not in prompt and "linkgit:" not in prompt
    assert "see git-reset(1) and `--soft`" in prompt
    assert answer.passages[0].chunk.text == passages[0]  # the passage keeps its text
    assert answer.answer_span.text == "echo 1 > /proc/sys/vm/drop_caches"


def test_a_refusal_gets_no_quotes():
    pipe, _ = evidence_pipeline(REFUSAL, "unused")
    answer = pipe.answer("How do I sort a list of records by a field?")
    assert answer.refused and answer.quotes == [] and answer.text == REFUSAL


def test_only_prose_is_read_in_context_a_table_row_code_or_list_item_is_embedded_alone():
    table = "Settings:\n\n| name | default |\n|---|---|\n| passages | 10 |\n| tokens | 320 |"
    code = "Run it:\n\n    make setup\n\n- one item\n- another item"
    units = [u for i, p in enumerate([table, code]) for u in split_units(p, i)]
    assert [u.prose for u in units] == [True, False, False, False, True, False, False, False]
    given: list[list[tuple[int, int]]] = []

    def read(texts, spans):
        given.extend(spans)
        return [[bag(t) for _ in s] for t, s in zip(texts, spans)]

    score_units("passages default", [table, code], embed, read=read)
    assert given == [[(0, 9)], [(0, 7)]]  # "Settings:" and "Run it:" only


def test_a_factoids_units_are_read_in_their_passages_and_a_how_questions_alone(tiny_mlm_dir):
    from rag.retrieval.encoder import Encoder as RealEncoder

    class Spying(RealEncoder):
        def encode_spans(self, texts, spans, batch_tokens=None):
            read.append(list(texts))
            return super().encode_spans(texts, spans, batch_tokens)

    read: list[list[str]] = []
    encoder = Spying(RealEncoder.load(tiny_mlm_dir, device="cpu", precision="fp32").model)
    pipe, _ = evidence_pipeline("The Danube is 2,850 km long [1].", "2,850 km")
    pipe.retriever.encoder = encoder
    factoid = pipe.prepare("What is the length of the Danube river?")
    assert read == [[h.chunk.text for h in pipe.retriever.hits]]  # every passage, once
    assert factoid.evidence and factoid.lead
    pipe.prepare("How do I sort a list by a field?")
    assert len(read) == 1  # a how-question's units were embedded alone


def test_the_answerability_check_weighs_the_best_sentence_the_encoder_read():
    from rag.answer.answerability import DEFAULT_MODEL, SENTENCE_MODEL
    from rag.answer.evidence import best_unit, read_units

    class Covering(Retriever):  # dense hits (score 0.9) and a fixed coverage
        def coverage(self, query, hits):
            return 0.6

    gen = TwoPartDecoder("The Danube river is 2,850 km long [2].", "2,850 km")
    cfg = RAGConfig.of(evidence_tokens=40, k=3, factoid="explain")
    hits = [hit(i + 1, p) for i, p in enumerate(PASSAGES)]
    pipe = RAGPipeline(cfg, retriever=Covering(hits), generator=gen)
    question = "What is the length of the Danube river?"
    decision = pipe.prepare(question).answerable
    want = best_unit(read_units(pipe.retriever.encoder, question, PASSAGES), 5)
    assert decision.unit == pytest.approx(want) and want is not None
    assert decision.probability == pytest.approx(SENTENCE_MODEL.probability(0.9, 0.6, want))
    # no excerpts read (a whole-passage prompt): the two retrieval signals decide
    cfg = RAGConfig.of(evidence_tokens=0, k=3, factoid="explain")
    decision = (
        RAGPipeline(cfg, retriever=Covering(hits), generator=gen).prepare(question).answerable
    )
    assert decision.unit is None
    assert decision.probability == pytest.approx(DEFAULT_MODEL.probability(0.9, 0.6))
