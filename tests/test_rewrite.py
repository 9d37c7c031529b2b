"""The multi-turn query rewrite (rag/answer/rewrite.py): follow-ups gain the topic, standalone
questions pass through unchanged, and the result never looks like a citation marker."""

from __future__ import annotations

import pytest

from rag.answer.rewrite import content_words, is_follow_up, rewrite_query

OPEN = "How do I open a file in Python?"


def test_follow_up_with_pronoun_gets_previous_topic():
    out = rewrite_query("and how do I close it?", [(OPEN, "Use open() [1]")])
    assert out.startswith("how do I close it?")  # leading connective dropped
    for term in ("open", "file", "Python"):
        assert term in out


def test_standalone_question_is_unchanged():
    q = "How do I create a git branch?"
    assert rewrite_query(q, [(OPEN, "x")]) == q
    assert rewrite_query("  What   is BM25 scoring?  ", []) == "What is BM25 scoring?"


def test_no_history_means_no_rewrite():
    assert rewrite_query("and how do I close it?") == "and how do I close it?"


@pytest.mark.parametrize(
    "question,follow",
    [
        ("and the second one?", True),
        ("what about branches?", True),
        ("why?", True),
        ("How does it work?", True),
        ("How does git rebase rewrite commit history?", False),
    ],
)
def test_follow_up_detection(question, follow):
    assert is_follow_up(question) is follow


def test_chained_follow_ups_keep_the_original_topic():
    history = [("How do I create a git branch?", "a"), ("and rename it?", "b")]
    out = rewrite_query("and delete it?", history)
    assert "git" in out and "branch" in out and "rename" in out


def test_accepts_chat_message_dicts():
    history = [{"role": "user", "content": OPEN}, {"role": "assistant", "content": "x"}]
    assert rewrite_query("and close it?", history) == rewrite_query("and close it?", [(OPEN, "x")])


def test_terms_not_repeated_and_capped():
    prev = "alpha beta gamma delta epsilon zeta eta theta"
    out = rewrite_query("what about beta?", [(prev, "")])
    context = out[out.index("(") + 1 : -1].split()
    assert "beta" not in context and len(context) == 6


def test_no_square_brackets_in_rewrite():
    out = rewrite_query("and this?", [("What does [1] mean in the answer format?", "")])
    assert "[" not in out and "]" not in out
    assert content_words("[1] marker") == ["1", "marker"]


def test_accepts_role_text_pairs_from_the_pipeline():
    history = [("user", OPEN), ("assistant", "Use open() [1]")]
    assert rewrite_query("and close it?", history) == rewrite_query("and close it?", [(OPEN, "x")])
