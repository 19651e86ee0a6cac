"""Every case of every golden corpus runs and matches its expected file (tests/support/golden_runner.py
says what a case is). After an intended change, the one update command:

    MOEGEN_UPDATE_GOLDENS=1 .venv/bin/pytest -n 0 tests/render/test_goldens.py
"""

from __future__ import annotations

import pytest
from golden_runner import CORPORA, Corpus, check_case, check_corpus_files


def _case_params() -> list:
    return [
        pytest.param(
            corpus,
            name,
            id=f"{corpus.name}-{name}",
            marks=[pytest.mark.xfail(strict=True, reason=corpus.known_bugs[name])]
            if name in corpus.known_bugs
            else [],
        )
        for corpus in CORPORA
        for name in corpus.case_names()
    ]


@pytest.mark.parametrize("corpus", CORPORA, ids=[c.name for c in CORPORA])
def test_every_case_has_a_golden_and_every_golden_a_case(corpus: Corpus) -> None:
    check_corpus_files(corpus)


@pytest.mark.parametrize(("corpus", "name"), _case_params())
def test_case_gives_its_golden(corpus: Corpus, name: str) -> None:
    check_case(corpus, name)
