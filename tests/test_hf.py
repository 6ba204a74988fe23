"""The one place that speaks to transformers: no other code hands a model its cache directly."""

import ast
from pathlib import Path

import pytest
import torch

from cheapinfer.runtime import hf

ROOT = Path(__file__).resolve().parent.parent
CACHE_KEYWORDS = set(hf.CACHE_NAMES)
#: Functions that run the chapter's listing exactly as printed (``past_key_values=``): KV-API measures that spelling.
LISTING = {("cheapinfer/chapter/kv_cache/kv_listing.py", "listing_continuation"), ("cheapinfer/chapter/kv_cache/kv_listing.py", "listing_api")}


def _sources() -> list[Path]:
    folders = ("cheapinfer", "fixtures", "claims", "tests")
    return sorted(p for f in folders for p in (ROOT / f).rglob("*.py") if p != ROOT / "cheapinfer" / "runtime" / "hf.py")


def _suite_functions_taking_a_cache() -> set[str]:
    """Names of the suite's own functions with a parameter called like a cache keyword (calls to them hand a cache to the suite,
    not to a model), except the names of a model's own methods: ``x.forward(cache=)`` and ``x.generate(cache=)`` are model calls."""
    names = set()
    for path in (ROOT / "cheapinfer").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                params = [a.arg for a in node.args.args + node.args.kwonlyargs]
                if CACHE_KEYWORDS & set(params):
                    names.add(node.name)
    return names - {"forward", "generate", "__call__"}


def _direct_cache_keywords(path: Path, allowed: set[str], root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    rel = path.relative_to(root).as_posix()
    listing = {id(n) for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef) and (rel, fn.name) in LISTING for n in ast.walk(fn)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and id(node) not in listing:
            callee = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id if isinstance(node.func, ast.Name) else ""
            owner = node.func.value.id if isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) else ""
            for kw in node.keywords:
                if kw.arg in CACHE_KEYWORDS and not (owner == "hf" or (kw.arg == "cache" and callee in allowed)):
                    found.append(f"{rel}:{node.lineno}: {ast.unparse(node.func)}(..., {kw.arg}=...)")
    return sorted(set(found))


def test_no_module_hands_a_model_its_cache_directly():
    """Every model call with a cache goes through cheapinfer.runtime.hf (forward, generate): the keyword differs between transformers releases."""
    allowed = _suite_functions_taking_a_cache()
    offenders = [line for path in _sources() for line in _direct_cache_keywords(path, allowed)]
    assert not offenders, "hand the cache over through cheapinfer.runtime.hf.forward / hf.generate:\n" + "\n".join(offenders)


def test_the_keyword_check_sees_a_direct_cache_keyword(tmp_path):
    """The source check itself: a model called with cache= or past_key_values= is found; hf.forward(..., cache=) is not."""
    bad = tmp_path / "bad.py"
    bad.write_text("def step(model, ids, c):\n    model(input_ids=ids, cache=c)\n    self.model(ids, past_key_values=c)\n    hf.forward(model, ids, cache=c)\n"
                   "    model.generate(ids, cache=c)\n    kv.greedy_cached(model, ids, 4, cache=c)\n")
    found = _direct_cache_keywords(bad, _suite_functions_taking_a_cache(), tmp_path)
    assert [f.split(": ", 1)[1] for f in found] == ["model(..., cache=...)", "self.model(..., past_key_values=...)", "model.generate(..., cache=...)"]


#: The one call of ``.crop`` outside cheapinfer.runtime.hf: the suite's own paged layer hands a crop to its own cache.
OWN_CROPS = {("cheapinfer/chapter/batching/paging.py", "self.owner.crop")}


def _direct_crops(path: Path, root: Path = ROOT) -> list[str]:
    rel = path.relative_to(root).as_posix()
    return sorted({f"{rel}:{node.lineno}: {ast.unparse(node.func)}(...)" for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                   if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "crop"
                   and ast.unparse(node.func) != "hf.crop" and (rel, ast.unparse(node.func)) not in OWN_CROPS})


def test_no_module_crops_a_cache_directly():
    """Every crop of a transformers cache goes through hf.crop(cache, length): ``Cache.crop``'s argument changed meaning
    between releases (a length in 4.x, minus the positions to remove in 5.x; both take a negative count), and hf.crop
    holds the one spelling of it. The suite's own tests of the installed method may call it."""
    offenders = [line for path in _sources() if not path.is_relative_to(ROOT / "tests") for line in _direct_crops(path)]
    assert not offenders, "crop a cache through cheapinfer.runtime.hf.crop(cache, length):\n" + "\n".join(offenders)


def test_the_crop_check_sees_a_direct_crop(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def step(cache, n):\n    cache.crop(-1)\n    hf.crop(cache, n)\n    self.owner.crop(n)\n")
    assert [f.split(": ", 1)[1] for f in _direct_crops(bad, tmp_path)] == ["cache.crop(...)", "self.owner.crop(...)"]


def _tiny(layers: int = 2):
    from transformers import Qwen2Config

    config = Qwen2Config(num_hidden_layers=layers, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=97, max_position_embeddings=64)
    torch.manual_seed(0)
    return hf.from_config(config)


def test_forward_hands_the_cache_under_the_installed_name_and_it_is_used():
    """A decode step through hf.forward extends the cache it is handed and continues the sequence as a full forward does."""
    model = _tiny()
    ids = torch.randint(0, 97, (1, 6), generator=torch.Generator().manual_seed(1))
    cache = hf.new_cache(model.config)
    with torch.inference_mode():
        hf.forward(model, ids[:, :5], cache=cache, use_cache=True)
        step = hf.forward(model, ids[:, 5:], cache=cache, use_cache=True)
        full = model(input_ids=ids, use_cache=False)
    assert hf.cache_length(cache) == 6 and hf.output_cache(step) is cache
    torch.testing.assert_close(step.logits[:, -1], full.logits[:, -1], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("how", ["no cache handed over", "cache handed over but dropped"])
def test_the_trace_notices_a_step_that_did_not_use_its_cache(how, monkeypatch):
    """What the 4.x regression looked like (a cache keyword the forward does not know is swallowed), seen from outside."""
    from cheapinfer.runtime import evidence

    model = _tiny()
    ids = torch.randint(0, 97, (1, 5), generator=torch.Generator().manual_seed(2))
    cache = hf.new_cache(model.config)
    with torch.inference_mode():
        hf.forward(model, ids[:, :4], cache=cache, use_cache=True)
        good = evidence.traced(model, lambda: hf.forward(model, ids[:, 4:], cache=cache, use_cache=True))[1]
        hf.crop(cache, 4)
        if how == "no cache handed over":
            bad = evidence.traced(model, lambda: model(input_ids=ids[:, 4:], use_cache=True))[1]
        else:  # the hooks see the cache handed in; the forward behind them never gets it
            real = model.forward
            monkeypatch.setattr(model, "forward", lambda *a, **k: real(*a, **{n: v for n, v in k.items() if n not in hf.CACHE_NAMES}))
            bad = evidence.traced(model, lambda: hf.forward(model, ids[:, 4:], cache=cache, use_cache=True))[1]
    assert good["forwards_without_cache"] == 0 and good["cache_grows_by_fed"] and good["logit_change_vs_no_context"] > 0.01
    if how == "no cache handed over":
        assert bad["forwards_without_cache"] == 1
    else:
        assert bad["forwards_without_cache"] == 0 and not bad["cache_grows_by_fed"]



def test_the_trace_reports_the_history_each_step_held_and_combines_the_range():
    """``history_tokens``: the fewest and most tokens of history the traced forwards held, so a claim can assert its context."""
    from cheapinfer.runtime import evidence

    model = _tiny()
    ids = torch.randint(0, 97, (1, 9), generator=torch.Generator().manual_seed(3))
    cache = hf.new_cache(model.config)
    with torch.inference_mode():
        first = evidence.traced(model, lambda: hf.forward(model, ids[:, :4], cache=cache, use_cache=True))[1]
        at_4 = evidence.traced(model, lambda: hf.forward(model, ids[:, 4:5], cache=cache, use_cache=True))[1]
        at_5_and_6 = evidence.traced(model, lambda: [hf.forward(model, ids[:, k:k + 1], cache=cache, use_cache=True) for k in (5, 6)])[1]
    assert first["history_tokens"] == [] and at_4["history_tokens"] == [4, 4] and at_5_and_6["history_tokens"] == [5, 6]
    assert evidence.combine(first, at_4, at_5_and_6)["history_tokens"] == [4, 6]
    assert evidence.conditions(at_4)["history_tokens"] == [4, 4]


@pytest.mark.parametrize("reset", [True, False], ids=["mask reset", "mask kept"])
def test_the_trace_sees_a_request_admitted_beside_other_histories(reset):
    """A row admitted into a freed slot of a batch (position 0, the cache holding the other rows' histories) computes its
    token alone; with its mask left over from the previous occupant (the catalogue's fault) it reads that request's cache columns."""
    import contextlib

    from cheapinfer.chapter.batching import scheduler
    from cheapinfer.faults import catalogue, core  # noqa: F401  (importing the catalogue registers its faults)
    from cheapinfer.runtime import evidence

    model = _tiny()
    batch = scheduler.SlotBatch(model)
    for r in range(3):
        batch.admit(r, 6, 5 + r)
    for _ in range(3):
        batch.step()
    with contextlib.nullcontext() if reset else core.FAULTS["scheduler-reused-row-keeps-mask"].activate():
        batch.admit(3, 6, 11, row=1)
    found = evidence.traced(model, batch.step)[1]
    assert found["fresh_rows_traced"] == 1 and found["logit_change_vs_no_context"] > 0.01
    assert (found["fresh_row_change_vs_no_context"] < 1e-5) if reset else (found["fresh_row_change_vs_no_context"] > 0.01)


def test_meta_model_runs_a_forward_on_the_meta_device():
    """Shapes without memory or arithmetic, on every supported transformers (4.x computes RoPE under autocast, which has no meta device)."""
    from transformers import Qwen2Config

    config = Qwen2Config(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=97)
    model = hf.meta_model(config)
    with torch.inference_mode():
        out = model(input_ids=torch.zeros((2, 3), dtype=torch.long, device="meta"), use_cache=True)
    assert out.logits.shape == (2, 3, 97) and hf.cache_length(hf.output_cache(out)) == 3


def test_pinned_tokenizer_conventions_are_read_back(stand_in):
    """The stand-in's tokenizer follows what its GGUF states (no BOS prepended, EOS and padding <|im_end|>), on every release."""
    got = hf.tokenizer_conventions(stand_in.tokenizer)
    assert got == {"adds_bos": False, "adds_eos": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}
    assert stand_in.model.generation_config.eos_token_id == 2


# ------------------------------------------------------------------------------------------------
# the speculative loop rolls its caches back with Cache.crop, and proves it did
# ------------------------------------------------------------------------------------------------


def test_the_speculative_loop_emits_the_targets_greedy_tokens_and_stops_in_one_line_where_crop_keeps_what_it_fed():
    """In float64 (no near-ties between a one-position and a several-position pass) a draft that disagrees with the target
    still yields the target's own greedy tokens; with the installed ``Cache.crop`` made a no-op the loop stops at the
    first rejected proposal with the cause, not later with a shape error on an empty feed."""
    from unittest import mock

    from transformers import DynamicCache

    from cheapinfer.chapter.speculative import speculative as spec

    target, draft = _tiny().double(), _tiny(layers=1).double()
    prompt = torch.randint(0, 97, (5,), generator=torch.Generator().manual_seed(2)).tolist()
    plain = spec.generate(target, prompt, 12, stop_at_eos=False)
    run = spec.generate(target, prompt, 12, draft=draft, gamma=3, stop_at_eos=False)
    assert run.tokens == plain.tokens and run.accepted < run.proposed  # the draft was rejected somewhere: the caches were cropped
    with mock.patch.object(DynamicCache, "crop", lambda self, *a, **k: None), \
            pytest.raises(RuntimeError, match=r"^the speculative loop's caches were not rolled back: cropped to \d+ tokens, the target's holds \d+"):
        spec.generate(target, prompt, 12, draft=draft, gamma=3, stop_at_eos=False)


def test_a_speculative_loop_whose_target_cache_is_swallowed_runs_on_and_its_trace_says_so():
    """A target handed its cache under a keyword the model swallows (4.x and ``cache=``) leaves the cache empty: that is no
    failed rollback. The loop runs on, every pass recomputing the whole sequence, still emits the target's greedy tokens,
    and its trace reports the target's forwards as run without a cache, which makes its claims deviate."""
    from cheapinfer.chapter.speculative import speculative as spec
    from cheapinfer.faults.catalogue.patches import misspelled_while

    target, draft = _tiny().double(), _tiny(layers=1).double()
    prompt = torch.randint(0, 97, (5,), generator=torch.Generator().manual_seed(2)).tolist()
    plain = spec.generate(target, prompt, 12, stop_at_eos=False)
    real_forward, swallowed = spec._forward, misspelled_while(spec, spec._forward)

    def forward(model, tokens, cache, keep):  # the target's passes only: the draft keeps its cache
        return (swallowed if model is target else real_forward)(model, tokens, cache, keep)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(spec, "_forward", forward)
        run = spec.generate_traced(target, prompt, 12, draft=draft, gamma=3, stop_at_eos=False)
    assert run.tokens == plain.tokens
    assert run.evidence["target"]["cache_grows_by_fed"] is False and run.evidence["draft"]["cache_grows_by_fed"] is True


def test_a_cast_copy_is_the_deep_copy_cast_without_a_second_full_precision_model(monkeypatch):
    """hf.cast_copy gives what ``copy.deepcopy(model).to(dtype)`` gives, bit for bit (a tied head stays tied, the
    original untouched, no storage shared), without deep-copying a single tensor first (the deep copy's route holds a
    second full-precision model: 2 GB for the twin), and creating no more storage than the copy it returns."""
    import copy

    from transformers import Qwen2Config

    from cheapinfer.runtime.accel import LivePeak

    config = Qwen2Config(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=97, max_position_embeddings=64, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = hf.from_config(config)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    deep_copies = []
    for cls in (torch.Tensor, torch.nn.Parameter):
        real = cls.__deepcopy__
        monkeypatch.setattr(cls, "__deepcopy__", lambda self, memo, real=real: deep_copies.append(self.nbytes) or real(self, memo))
    with LivePeak() as made:
        cast = hf.cast_copy(model, torch.bfloat16)
    copied_by_cast = sum(deep_copies)
    ref = copy.deepcopy(model).to(dtype=torch.bfloat16)
    assert copied_by_cast == 0 and sum(deep_copies) >= 4 * sum(p.numel() for p in model.parameters())  # the spy sees the deep copy's fp32 tensors
    tensors = lambda m: dict(m.named_parameters(remove_duplicate=False)) | dict(m.named_buffers(remove_duplicate=False))
    got, want = tensors(cast), tensors(ref)
    assert got.keys() == want.keys() and all(got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]) for k in want)
    assert cast.lm_head.weight is cast.model.embed_tokens.weight and isinstance(cast.lm_head.weight, torch.nn.Parameter)
    assert not {t.untyped_storage().data_ptr() for t in got.values()} & {t.untyped_storage().data_ptr() for t in tensors(model).values()}
    assert all(torch.equal(before[k], v) and v.dtype == torch.float32 for k, v in model.state_dict().items())
    ids = torch.tensor([[1, 5, 7]])
    with torch.inference_mode():
        assert torch.equal(cast(input_ids=ids).logits, ref(input_ids=ids).logits)
    assert made.peak <= sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in got.values()}.values())
