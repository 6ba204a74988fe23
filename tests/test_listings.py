"""The chapter's listings (cheapinfer/explanations.toml, [[listing]]): every listing of both translations is in the
inventory with the claim that runs it; one marked verbatim is the function that claim runs, statement for statement;
one that is not runs here as printed, with the side effects its text promises (warnings, state kept between steps)."""

import copy
import tomllib

import pytest
import torch

from cheapinfer.faults.text import LISTINGS, TEXT_FAULTS
from cheapinfer.harness import explanations, locate

SEEDS = sorted(locate.SEEDS.glob("*.txt")) if locate.SEEDS.is_dir() else []
needs_seeds = pytest.mark.skipif(not SEEDS, reason=f"the chapter's translations are not beside this checkout ({locate.SEEDS})")


def _printed(seed) -> dict[str, str]:
    """Listing id -> its source as printed in ``seed``; every listing found must be in the inventory."""
    inventory = explanations.listings()
    out = {}
    for line, source in explanations.code_listings(seed.read_text(encoding="utf-8")):
        ids = [item.id for item in inventory if source.startswith(item.first)]
        assert len(ids) == 1, f"{seed.name}, line {line}: a listing not in cheapinfer/explanations.toml's inventory: {source.splitlines()[0]!r}"
        out[ids[0]] = source
    return out


@needs_seeds
@pytest.mark.parametrize("seed", SEEDS, ids=lambda p: p.name)
def test_every_listing_of_the_chapter_is_in_the_inventory_and_located_once(seed):
    text = seed.read_text(encoding="utf-8")
    inventory = explanations.listings()
    assert set(_printed(seed)) == {item.id for item in inventory}
    for item in inventory:
        assert locate.line_of(text, item.first) >= 1
    promised = {s.listing for s in explanations.sentences() if s.kind == "listing"}
    assert promised <= {item.id for item in inventory}


def test_every_listing_names_a_registry_claim_and_a_function_that_exists():
    from cheapinfer.harness import registry

    claims = registry.load()
    for item in explanations.listings():
        assert item.claim in claims, item.id
        explanations.same_statements(item.first, item.runs)  # the function exists (ValueError otherwise)


@needs_seeds
@pytest.mark.parametrize("seed", SEEDS, ids=lambda p: p.name)
def test_a_listing_marked_verbatim_is_the_function_its_claim_runs(seed):
    printed = _printed(seed)
    for item in explanations.listings():
        assert explanations.same_statements(printed[item.id], item.runs) == item.verbatim, (
            f"{item.id}: marked verbatim={item.verbatim}, but {item.runs} {'differs from' if item.verbatim else 'is'} the printed statements")


def _listings_check():
    """The statement comparison sees a changed bound or a missing statement, and ignores spacing and comments; a listing
    is a run of code paragraphs a blank line apart, prose and bare words left out."""
    runs = "cheapinfer/chapter/quantization/quant.py:absmax_listing"
    listing = ("qmax  = 2 ** (bits - 1) - 1\nscale = W.abs().max() / qmax   \n"
               "Wq    = torch.round(W / scale).clamp(-qmax - 1, qmax)\nW_hat = Wq * scale   # dequantized")
    assert explanations.same_statements(listing, runs)
    assert not explanations.same_statements(listing.replace("-qmax - 1", "-qmax"), runs)
    assert not explanations.same_statements(listing.rsplit("\n", 1)[0], runs)
    text = "Proza met een zin.\n\nx = f(1)\n\nfor _ in range(2):\n    x = f(x)\n\n8 GB\n\n\"een zin\"\n\n\ny = 2\n"
    assert explanations.code_listings(text) == [(3, "x = f(1)\n\nfor _ in range(2):\n    x = f(x)"), (13, "y = 2")]


def test_the_listings_check():
    _listings_check()


@pytest.mark.parametrize("name", [n for n, f in TEXT_FAULTS.items() if f.check == LISTINGS])
def test_each_listings_fault_turns_the_check_red(name):
    with TEXT_FAULTS[name].activate(), pytest.raises(AssertionError):
        _listings_check()


def test_a_listing_without_its_claim_or_why_is_refused():
    raw = tomllib.loads(explanations.DATA.read_text(encoding="utf-8"))
    for key, match in (("claim", "needs claim"), ("why", "no why")):
        bad = copy.deepcopy(raw)
        item = next(i for i in bad["listing"] if not i["verbatim"])
        del item[key]
        with pytest.raises(ValueError, match=match):
            explanations.listings(bad)


@needs_seeds
def test_the_cached_loop_as_printed_runs_with_the_side_effects_its_text_promises():
    """The printed text, executed on a small random model: the tokens and deprecation messages of listing_continuation
    (what KV-API runs), and state kept between steps: each step is fed one token and a cache one token longer."""
    from cheapinfer.chapter.kv_cache import kv_listing, kv_macs
    from cheapinfer.runtime import hf

    source = _printed(SEEDS[0])["kv-cached-loop"]
    torch.manual_seed(0)
    model = kv_macs.tiny_model(kv_macs.tiny_arch()).eval()
    prompt_ids, n = torch.tensor([[5, 9, 13, 2, 7]]), 6
    fed, tokens = [], []

    def recorded(ids, **kwargs):
        past = kwargs.get("past_key_values")
        fed.append((ids.shape[1], None if past is None else hf.cache_length(past)))
        out = model(ids, **kwargs)
        tokens.append(out.logits[:, -1].argmax(-1, keepdim=True))
        return out

    printed_msgs, suite_msgs = [], []
    with torch.inference_mode():
        with kv_listing.deprecations(printed_msgs):
            exec(compile(source, "<the chapter's listing>", "exec"), {"model": recorded, "prompt_ids": prompt_ids, "n": n})
        with kv_listing.deprecations(suite_msgs):
            suite = kv_listing.listing_continuation(model, prompt_ids, n)
    assert torch.equal(torch.cat(tokens, dim=1), suite)
    assert sorted(set(printed_msgs)) == sorted(set(suite_msgs))
    p = prompt_ids.shape[1]
    assert fed == [(p, None)] + [(1, p + step) for step in range(n - 1)]
