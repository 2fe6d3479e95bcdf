import gzip
import json
import os
from pathlib import Path

import pytest

CORPUS = Path(os.environ.get("ATTN_POLICY_CORPUS", Path(__file__).resolve().parents[3] / "tests/corpora/te-2.20.2-corpus-a.jsonl.gz"))


def te_accepts(config) -> bool:
    """Whether TransformerEngine's DotProductAttention would accept the record's head counts
    (its constructor asserts num_heads % num_gqa_groups == 0, so TE's selector never sees
    such a call; the public corpus holds records that break it, which the bindings refuse as
    input errors like the CLI). Written here from TE's assert, not from the binding."""
    heads = config.get("num_heads")
    groups = config.get("num_gqa_groups") or heads
    return not (isinstance(heads, int) and isinstance(groups, int) and groups > 0 and heads % groups)


@pytest.fixture(scope="session")
def valid_corpus(corpus):
    """The corpus records TE accepts (see te_accepts)."""
    return [r for r in corpus if te_accepts(r["config"])]


def read_corpus(path: Path, limit: int) -> list:
    """The first ``limit`` records of a ``.jsonl.gz`` conformance corpus (shipped in the
    repository under tests/corpora/, so a missing file is a failure, not a skip)."""
    assert path.exists(), f"conformance corpus not found at {path} (tests/corpora/ ships it)"
    out = []
    with gzip.open(path, "rt") as f:
        for line in f:
            out.append(json.loads(line))
            if len(out) >= limit:
                break
    return out


@pytest.fixture(scope="session")
def corpus():
    return read_corpus(CORPUS, 400)


@pytest.fixture
def eager_node_mode(monkeypatch):
    """``use(mode)`` sets ``ATTN_POLICY_EAGER_NODE`` (auto, cpp, python) and forgets the cached
    plans, which hold the node chosen when they were made."""
    import attn_policy.torch as apt

    def use(mode):
        monkeypatch.setenv("ATTN_POLICY_EAGER_NODE", mode)
        apt.clear_cache()

    yield use
    apt.clear_cache()
