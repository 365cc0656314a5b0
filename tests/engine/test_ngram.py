"""Prompt lookup's n-gram index against a brute-force search, and the `+lookup` speculation modes."""
from __future__ import annotations

import random

import pytest

from engine.ngram import NgramIndex, lookup_table
from engine.spec_mode import SpecMode, parse_speculation


def brute_force(tokens: list[int], gamma: int, min_n: int, max_n: int) -> tuple[list[int], int]:
    """Scan back from the end for the latest earlier occurrence of the last n tokens, longest n first."""
    for n in range(max_n, min_n - 1, -1):
        if len(tokens) <= n:
            continue
        key = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start: start + n] == key:
                text = list(tokens)
                while len(text) < len(tokens) + gamma:  # the copy goes on into the text it writes
                    text.append(text[start + n + len(text) - len(tokens)])
                return text[len(tokens):], n
    return [], 0


@pytest.mark.parametrize("min_n,max_n,vocab", [(2, 3, 6), (1, 3, 12), (2, 4, 3), (3, 3, 4)])
def test_index_equals_brute_force_as_the_text_grows(min_n, max_n, vocab):
    rng = random.Random(min_n * 100 + max_n * 10 + vocab)
    for _ in range(20):
        tokens = [rng.randrange(vocab) for _ in range(rng.randint(0, 5))]
        index = NgramIndex(min_n, max_n)
        found = 0
        for _ in range(60):
            # tokens arrive one or several at a time (accepted drafts), and lookups skip steps
            tokens += [rng.randrange(vocab) for _ in range(rng.choice([1, 1, 2, 4]))]
            if rng.random() < 0.8:
                got = index.propose(tokens, 5)
                assert got == brute_force(tokens, 5, min_n, max_n), tokens
                found += bool(got[0])
        assert found  # small vocabularies repeat n-grams: the matching path ran


def test_no_match_and_the_suffix_never_matches_itself():
    index = NgramIndex(2, 3)
    assert index.propose([], 4) == ([], 0)
    assert index.propose([7], 4) == ([], 0)
    assert index.propose([1, 2, 3, 4], 4) == ([], 0)
    assert index.propose([1, 2, 3, 4, 1, 2], 4) == ([3, 4, 1, 2], 2)
    assert index.propose([1, 2, 3, 4, 1, 2, 3], 2) == ([4, 1], 3)  # the longest n-gram wins
    assert index.propose([1, 2, 3, 4, 1, 2, 3], 6) == ([4, 1, 2, 3, 4, 1], 3)  # a loop of period 4 goes on
    # overlapping occurrences: what followed (5, 5) at positions 0..1 is the last 5, and then the loop
    assert NgramIndex(2, 3).propose([5, 5, 5], 4) == ([5, 5, 5, 5], 2)
    with pytest.raises(ValueError):
        NgramIndex(0, 3)


@pytest.mark.parametrize("min_n,max_n,vocab", [(2, 3, 5), (1, 2, 9), (3, 4, 3)])
def test_lookup_table_is_what_the_index_proposes_at_every_prefix(min_n, max_n, vocab):
    """The copy hints a drafter trains on are the engine's own proposals: each row equals a fresh index's answer for
    that prefix (and a brute-force search's)."""
    rng = random.Random(min_n * 100 + max_n * 10 + vocab)
    matched = unmatched = 0
    for _ in range(15):
        tokens = [rng.randrange(vocab) for _ in range(rng.randint(1, 50))]
        start = rng.randint(0, len(tokens) - 1)
        table = lookup_table(tokens, 6, min_n, max_n, start=start)
        assert len(table) == len(tokens) - start
        for p, row in enumerate(table, start):
            assert row == NgramIndex(min_n, max_n).propose(tokens[: p + 1], 6)[0]
            assert row == brute_force(tokens[: p + 1], 6, min_n, max_n)[0]
            matched, unmatched = matched + bool(row), unmatched + (not row)
    assert matched and unmatched  # both kinds of row ran


@pytest.mark.parametrize("text,mode", [
    ("adaptive+lookup", SpecMode("adaptive", lookup=True)),
    ("fixed:3+lookup", SpecMode("fixed", k=3, lookup=True)),
    (" Threshold:0.8+Lookup ", SpecMode("threshold", threshold=0.8, lookup=True)),
    ("adaptive", SpecMode("adaptive")),
])
def test_lookup_modes_parse_and_print(text, mode):
    assert parse_speculation(text) == mode
    assert parse_speculation(str(mode)) == mode


@pytest.mark.parametrize("text", ["off+lookup", "adaptive+", "adaptive+ngram", "lookup", "fixed:+lookup",
                                  "adaptive+lookup+lookup"])
def test_bad_lookup_modes_are_refused(text):
    with pytest.raises(ValueError, match="invalid speculation"):
        parse_speculation(text)
