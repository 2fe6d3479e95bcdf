import gzip
import json
import os
from pathlib import Path

import pytest

CORPUS = Path(os.environ.get("ATTN_POLICY_CORPUS", Path(__file__).resolve().parents[3] / "../shared/conformance/te-2.20.2-corpus-a.jsonl.gz"))


@pytest.fixture(scope="session")
def corpus():
    if not CORPUS.exists():
        pytest.skip(f"conformance corpus not found at {CORPUS}")
    out = []
    with gzip.open(CORPUS, "rt") as f:
        for line in f:
            out.append(json.loads(line))
            if len(out) >= 400:
                break
    return out
