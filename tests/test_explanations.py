"""cheapinfer/explanations.toml: the chapter's explanations and statistical words, each judged by a registry check
(or listed as not measured with why), located in both translations; and the mechanism the collapse check rests on."""

import copy
import tomllib

import pytest
import torch

from cheapinfer.chapter.quantization import quant, quant_error
from cheapinfer.harness import explanations, locate, registry

SEEDS = {lang: sorted(locate.SEEDS.glob(f"{n}_*.txt")) for lang, n in (("nl", "000"), ("vi", "002"))} if locate.SEEDS.is_dir() else {}
needs_seeds = pytest.mark.skipif(not SEEDS or not all(SEEDS.values()), reason=f"the chapter's translations are not beside this checkout ({locate.SEEDS})")


def _claim_checks():
    return {cid: {c.q for c in claim.checks} for cid, claim in registry.load().items()}


def test_every_sentence_is_judged_by_the_registry_or_says_why_not():
    found = explanations.sentences()
    assert len(found) >= 40
    assert not explanations.problems(found, _claim_checks(), {e.id for e in locate.entries()})
    kinds = {s.kind for s in found}
    assert kinds == set(explanations.KINDS)


def test_a_contradicted_sentence_names_the_registry_erratum_that_documents_it():
    """A contradiction is graded and placed by errata.toml; where a registry erratum gives it, that erratum documents one of its checks."""
    entries = {e.id: e for e in locate.entries()}
    for s in explanations.sentences():
        if s.verdict != "contradicted":
            continue
        entry = entries[s.errata]
        assert entry.grade != "note", f"{s.id}: a contradiction placed as a note"
        if entry.erratum is not None:  # placed from a registry erratum: it documents one of the sentence's checks
            fails = set(registry.get(entry.claim).errata[entry.erratum].fails)
            assert fails & {q for c, q in s.checks if c == entry.claim}, f"{s.id}: erratum {s.errata} documents none of the sentence's checks"


@needs_seeds
@pytest.mark.parametrize("lang", ["nl", "vi"])
def test_every_quote_is_found_once_in_its_translation(lang):
    text = SEEDS[lang][0].read_text(encoding="utf-8")
    lines = explanations.located(explanations.sentences(), text, lang)
    assert len(lines) == len(explanations.sentences())


def test_an_incomplete_sentence_is_refused_or_reported():
    raw = tomllib.loads(explanations.DATA.read_text(encoding="utf-8"))
    for key, match in (("vi", "printed words"), ("kind", "kind")):
        bad = copy.deepcopy(raw)
        del bad["sentence"][0][key]
        with pytest.raises(ValueError, match=match):
            explanations.sentences(bad)
    bad = copy.deepcopy(raw)
    first = bad["sentence"][0]
    first["checks"] = ["KV-IDENTITY:no_such_check"]
    stat = next(s for s in bad["sentence"] if s["kind"] == "statistical")
    stat.pop("assumption")
    unmeasured = next(s for s in bad["sentence"] if s["verdict"] == "not measured")
    unmeasured.pop("why")
    got = explanations.problems(explanations.sentences(bad), _claim_checks(), {e.id for e in locate.entries()})
    assert any("no_such_check" in p for p in got)
    assert any("assumption" in p for p in got)
    assert any("without a why" in p for p in got)


@pytest.mark.parametrize("scheme", ["int8-tensor", "int4-tensor", "int4-row", "int4-g128", "nf4"])
def test_nearest_rounding_never_errs_more_than_the_weights_norm(scheme):
    """The premise of Q-ERROR-TABLE's error_max: 0 is a level and codes are the nearest, so |w - w_hat| <= |w|."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 256, generator=g) * 0.02
    w[3, 7] = 0.9  # one outlier sets the tensor's step, as in the chapter's matrix
    w_hat = quant.fake_quantize(w, scheme)
    assert bool(((w - w_hat).abs() <= w.abs() * (1 + 4 * 2**-24)).all())
    assert quant_error.relative_error(w, scheme) <= 1 + 4 * 2**-24


def test_the_reconstruction_tells_noise_from_a_collapse():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(64, 256, generator=g) * 0.02
    w[0, 0] = 2.0  # a step of 2 / 7: every other weight rounds to 0
    made = quant_error.reconstruction(w, "int4-tensor")
    assert made["zero_fraction"] == pytest.approx(1 - 1 / w.numel())
    assert made["kept_norm"] == pytest.approx(float(w.abs().max() / w.norm()), rel=1e-3)
    noise = quant_error.reconstruction(w, "reference")  # W itself: size 1, direction kept
    assert noise["kept_norm"] == pytest.approx(1.0) and noise["cosine"] == pytest.approx(1.0)


def _outlier_matrix(seed=2):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(64, 256, generator=g) * 0.02
    w[5, 9] = 0.9
    return w


def test_the_faults_of_the_new_checks_break_what_those_checks_read():
    """Without a model: under q-codes-rounded-up the error exceeds the bound error_max holds (1); under
    q-int-group-size-ignored INT4 at block 64 is group-128 again, so block_share is 0 and its '> 0' fails."""
    from cheapinfer.audits import faults as runner

    w = _outlier_matrix()
    with runner.activate("q-codes-rounded-up"):
        assert quant_error.relative_error(w, "int4-tensor") > 1.0000003
    with runner.activate("q-int-group-size-ignored"):
        assert quant_error.relative_error(w, "int4-g64") == quant_error.relative_error(w, "int4-g128")
    assert quant_error.relative_error(w, "int4-g64") < quant_error.relative_error(w, "int4-g128")
