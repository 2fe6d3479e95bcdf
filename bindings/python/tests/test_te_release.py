"""The installed TransformerEngine release chooses the TE drop-in's pack (``te@auto``,
docs/packs/releases.md): a stub ``transformer_engine`` module stands in for TE (CI and the GPU
machine have none), injected into ``sys.modules`` and removed after each test."""

import sys
import types
import warnings

import pytest

import attn_policy
from attn_policy import _environment, te

RELEASES = "te@2.18.0, te@2.19.0, te@2.20.2"
CONFIG = {"head_dim_qk": 128, "head_dim_v": 128, "device_compute_capability": [9, 0]}
SUPPORTED = {"cuda_device": True, "fused_attn_graph": True, "frost_plan": True}


def _reset():
    te.set_policy(None)
    te.clear_environment()
    te.reprobe()
    _environment._warned_releases.clear()


@pytest.fixture
def installed():
    """``installed("2.19.0")`` makes ``import transformer_engine`` give a stub of that
    release; the stub (and the drop-in's state) is gone after the test."""
    saved = sys.modules.get("transformer_engine")

    def install(version):
        stub = types.ModuleType("transformer_engine")
        stub.__version__ = version
        sys.modules["transformer_engine"] = stub
        _reset()
        return stub

    yield install
    if saved is None:
        sys.modules.pop("transformer_engine", None)
    else:  # pragma: no cover - a real TE in the test environment
        sys.modules["transformer_engine"] = saved
    _reset()


@pytest.mark.parametrize("version", ["2.18.0", "2.19.0", "2.20.2"])
def test_an_installed_release_with_a_pack_decides_with_it(installed, version):
    installed(version)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = te.get_policy()
    assert p.name == f"te@{version}"
    assert p.pack_from == {"requested": "te@auto", "installed": version, "warning": None}
    d = te.select(CONFIG, probe=SUPPORTED)
    assert d.to_dict()["pack"] == f"te@{version}"
    assert d.to_dict()["pack_from"]["installed"] == version
    assert f"pack: te@{version} (from te@auto, TransformerEngine {version})" in d.explain()
    assert d.provenance["te_version"] == "probe"
    # The same decision as the release's own pack.
    own = attn_policy.Policy.load(f"te@{version}").select(dict(CONFIG, probe=SUPPORTED))
    assert d.te_tuple() == own.te_tuple()


def test_a_release_between_packs_takes_the_nearest_older_with_one_warning(installed):
    installed("2.19.5")
    with pytest.warns(UserWarning) as caught:
        p = te.get_policy()
        te.select(CONFIG, probe=SUPPORTED)
        te.get_attention_backend(CONFIG, frost=False, probe=SUPPORTED)
    messages = [str(w.message) for w in caught if "attn_policy" in str(w.message)]
    assert messages == [
        "attn_policy: TransformerEngine 2.19.5 has no pack; deciding with te@2.19.0, the "
        f"nearest older release (packs: {RELEASES})"
    ]
    assert p.name == "te@2.19.0"
    d = te.select(CONFIG, probe=SUPPORTED)
    assert "pack: te@2.19.0 (from te@auto, TransformerEngine 2.19.5)" in d.explain()
    assert "2.19.5 has no pack" in d.to_dict()["pack_from"]["warning"]
    # Once per process: choosing the pack again (reprobe) does not warn again.
    te.reprobe()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert te.get_policy().name == "te@2.19.0"


def test_a_release_newer_than_every_pack_takes_the_newest(installed):
    installed("2.21.0")
    with pytest.warns(UserWarning, match="TransformerEngine 2.21.0 is newer"):
        assert te.get_policy().name == "te@2.20.2"


@pytest.mark.parametrize("version", ["2.17.0", "garbage"])
def test_an_older_or_unreadable_release_is_refused(installed, version):
    installed(version)
    with pytest.raises(attn_policy.PolicyError) as e:
        te.get_policy()
    assert RELEASES in str(e.value)
    assert version in str(e.value)
    with pytest.raises(attn_policy.PolicyError):
        te.select(CONFIG, probe=SUPPORTED)
    # The user's policy still wins.
    te.set_policy(attn_policy.Policy.load("te@2.19.0"))
    assert te.select(CONFIG, probe=SUPPORTED).to_dict()["pack"] == "te@2.19.0"


def test_set_policy_wins_and_none_goes_back_to_the_installed_release(installed):
    installed("2.19.0")
    te.set_policy(attn_policy.Policy.load("te"))
    assert te.get_policy().name == "te"
    assert "pack_from" not in te.select(CONFIG, probe=SUPPORTED).to_dict()
    te.set_policy(None)
    assert te.get_policy().name == "te@2.19.0"


def test_without_transformer_engine_the_te_pack_decides(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformer_engine", None)  # `import` fails
    _reset()
    try:
        assert _environment.installed_te_version() is None
        assert te.get_policy().name == "te"
        d = te.select(CONFIG, probe=SUPPORTED)
        assert "pack_from" not in d.to_dict()
        assert d.provenance["te_version"] == "default"
    finally:
        _reset()


def test_set_environment_te_version_overrides_the_installed_release(installed):
    installed("2.20.2")
    assert te.get_policy().name == "te@2.20.2"
    te.set_environment(te_version="2.18.0")
    assert te.get_policy().name == "te@2.18.0"
    assert te.select(CONFIG, probe=SUPPORTED).provenance["te_version"] == "set_environment"
    te.set_environment(te_version=None)
    assert te.get_policy().name == "te@2.20.2"
    # A call argument does not choose the pack: it is refused.
    with pytest.raises(attn_policy.PolicyError):
        te.select(CONFIG, te_version="2.18.0")


def test_the_resolver_is_the_rust_one(installed):
    assert attn_policy.resolve_te_release("2.19.0") == ("te@2.19.0", None)
    assert attn_policy.resolve_te_release("2.19.0+cu13") == ("te@2.19.0", None)
    pack, warning = attn_policy.resolve_te_release("2.20.2rc1")
    assert pack == "te@2.19.0" and "2.20.2rc1" in warning
    with pytest.raises(attn_policy.PolicyError, match="te@2.18.0, te@2.19.0, te@2.20.2"):
        attn_policy.resolve_te_release("2.17.0")
    # Policy.load("te@auto"): a given release, else the installed one, else an error.
    assert attn_policy.Policy.load("te@auto", te_version="2.19.5").name == "te@2.19.0"
    installed("2.18.0")
    assert attn_policy.Policy.load("te@auto").name == "te@2.18.0"
    sys.modules["transformer_engine"] = None
    with pytest.raises(attn_policy.PolicyError, match="te_version="):
        attn_policy.Policy.load("te@auto")


def test_live_facts_read_the_installed_release(installed):
    pytest.importorskip("torch")
    from attn_policy import _facts

    installed("2.19.5")
    _facts._device_facts.clear()
    try:
        facts = _facts.live_facts("cpu")
        assert facts["te_version"] == ("2.19.5", "probe")
    finally:
        _facts._device_facts.clear()
