"""``entropace demo``: the table's values agree with the polarity theorem and with brute force."""

from __future__ import annotations

import argparse

import pytest
import torch

from entropace.cli import demo


def brute_force_dh(z: torch.Tensor, y: int, advantage: float, eta: float) -> float:
    def h(logits: torch.Tensor) -> torch.Tensor:
        return -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum()

    zz = z.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(torch.log_softmax(zz, -1)[y], zz)
    return float(h(z + eta * advantage * grad) - h(z))


def test_rows_agree_with_theorem_and_brute_force() -> None:
    vocab, eta, seed = 300, 0.01, 3
    rows = demo.polarity_check(vocab=vocab, eta=eta, seed=seed)
    assert len(rows) == len(demo.DISTRIBUTIONS) * len(demo.TOKENS) * 2
    # regenerate the same logits to recompute every column independently
    gen = torch.Generator().manual_seed(seed)
    logits = {name: make(vocab, gen) for name, make in demo.DISTRIBUTIONS.items()}
    for r in rows:
        z = logits[r.distribution]
        p = torch.softmax(z, -1)
        y = int(p.argmax()) if r.token == "frequent" else int(p.argmin())
        h = float(-(p * p.log()).sum())
        s_ref = float((p * p * (h + p.log())).sum() - p[y] * (h + p[y].log()))
        assert r.entropy == pytest.approx(h, rel=1e-12)
        assert r.logprob == pytest.approx(float(p[y].log()), rel=1e-12)
        assert r.sensitivity == pytest.approx(s_ref, rel=1e-9, abs=1e-15)
        assert r.polarity == r.advantage * r.sensitivity
        assert r.predicted_dh == pytest.approx(eta * r.polarity, rel=1e-15)
        assert r.realised_dh == pytest.approx(brute_force_dh(z, y, r.advantage, eta), rel=1e-9)
        # first-order theorem at this small step: same sign, within a few percent
        assert r.signs_agree
        assert abs(r.realised_dh - r.predicted_dh) < 0.1 * abs(r.predicted_dh)
        # frequent token reinforced contracts; rare token reinforced expands
        expected_sign = (1 if r.token == "rare" else -1) * r.advantage
        assert r.polarity * expected_sign > 0


def test_signs_agree_flag_is_computed_not_assumed() -> None:
    row = demo.PolarityRow("x", "rare", 1.0, 1.0, -2.0, 0.5, 0.5, 0.005, -0.001)
    assert not row.signs_agree
    assert "NO" in demo.format_table([row]).splitlines()[2]
    assert demo.format_table([row]).endswith("sign agreement: 0/1")


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="entropace")
    demo.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_command_prints_table_and_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    args = _parse(["demo", "--vocab", "128", "--eta", "0.005", "--seed", "1"])
    assert args.func(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert "V=128" in out[0] and "eta=0.005" in out[0]
    table = out[3:-1]
    assert len(table) == 12
    assert out[-1] == "sign agreement: 12/12"
    rows = demo.polarity_check(vocab=128, eta=0.005, seed=1)
    for line, row in zip(table, rows):
        cells = line.split()
        assert cells[0] == row.distribution and cells[1] == row.token
        assert float(cells[7]) == pytest.approx(row.predicted_dh, rel=1e-3)
        assert float(cells[8]) == pytest.approx(row.realised_dh, rel=1e-3)
        assert cells[9] == "yes"


def test_entry_point_dispatches_to_demo(capsys: pytest.CaptureFixture[str]) -> None:
    from entropace.cli import main

    assert main(["demo", "--vocab", "64"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "sign agreement: 12/12"


@pytest.mark.parametrize("argv", [["--eta", "-1"], ["--vocab", "1"]])
def test_bad_options_exit_two(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    args = _parse(["demo", *argv])
    assert args.func(args) == 2
    captured = capsys.readouterr()
    assert "entropace demo: error:" in captured.err and captured.out == ""


def test_the_cli_imports_torch_only_for_commands_that_run_it() -> None:
    """``entropace --help``, ``envs list`` ... build the parser of every subcommand: none may
    import torch for it (2-8 s on a 2-core machine); ``demo`` imports it when it runs."""
    import subprocess
    import sys

    code = (
        "import sys; from entropace.cli import build_parser, main; build_parser(); "
        "assert 'torch' not in sys.modules, 'parser imported torch'; "
        "main(['demo', '--vocab', '8']); assert 'torch' in sys.modules"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "sign agreement: 12/12" in done.stdout
