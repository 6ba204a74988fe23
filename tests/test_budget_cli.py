"""``python -m cheapinfer budget``: answers, the tables, and clear errors on bad input."""

import pytest

from cheapinfer.cli.chapter import budget_cli


def test_budget_cli_answers_the_16_gb_int8_7b_case(capsys):
    assert budget_cli(["--gpu-gib", "16", "--model", "7b", "--bits", "8"]) == 0
    out = capsys.readouterr().out
    assert "65,378 tokens" in out and "Assumptions:" in out and "1.5 GiB reserved" in out


def test_budget_cli_prints_the_three_tables(capsys):
    assert budget_cli(["--tables"]) == 0
    out = capsys.readouterr().out
    for heading in ("\n8 GB", "\n16 GB", "\n24 GB"):
        assert heading in out
    assert "337" in out and "3,136" in out


def test_budget_cli_says_when_the_weights_do_not_fit(capsys):
    assert budget_cli(["--gpu-gib", "8", "--model", "70b", "--bits", "4.125"]) == 0
    assert "does not fit" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        pytest.param(["--gpu-gib", "-8", "--model", "7b", "--bits", "8"], "--gpu-gib must be > 0", id="negative-memory"),
        pytest.param(["--gpu-gib", "0", "--model", "7b", "--bits", "8"], "--gpu-gib must be > 0", id="zero-memory"),
        pytest.param(["--gpu-gib", "abc", "--model", "7b", "--bits", "8"], "must be a number", id="memory-not-a-number"),
        pytest.param(["--gpu-gib", "16", "--model", "9b", "--bits", "8"], "invalid choice: '9b'", id="unknown-model"),
        pytest.param(["--gpu-gib", "16", "--model", "7b", "--bits", "0"], "--bits must be > 0", id="zero-bits"),
        pytest.param(["--gpu-gib", "16", "--model", "7b", "--bits", "-4"], "--bits must be > 0", id="negative-bits"),
        pytest.param(["--gpu-gib", "16", "--model", "7b"], "required", id="missing-bits"),
        pytest.param(["--gpu-gib", "16", "--model", "7b", "--bits", "8", "--reserve-gib", "-1"], "--reserve-gib", id="negative-reserve"),
        pytest.param(["--gpu-gib", "1e308", "--model", "7b", "--bits", "8"], "memory too large to count in bytes", id="memory-overflows"),
        pytest.param(["--gpu-gib", "16", "--model", "7b", "--bits", "1e308"], "weights too large to count in bytes", id="bits-overflow"),
        pytest.param(["--gpu-gib", "16", "--model", "7b", "--bits", "8", "--reserve-gib", "1e308"], "reserve too large to count in bytes", id="reserve-overflows"),
    ],
)
def test_budget_cli_rejects_bad_input_with_a_clear_error(argv, message, capsys):
    assert budget_cli(argv) == 2
    err = capsys.readouterr().err
    assert "cheapinfer budget: error:" in err and message in err


def test_budget_cli_through_the_package_entry_point(capsys):
    from cheapinfer.cli import main

    assert main(["budget", "--gpu-gib", "8", "--model", "13b", "--bits", "4.125"]) == 0
    assert "337 tokens" in capsys.readouterr().out
