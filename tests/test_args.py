"""trtfuse.args, the flags several parsers share: what they accept and refuse, and that every flag two subcommands
share comes from there (tests/test_code_layout.py keeps their declarations out of every other module)."""

from __future__ import annotations

import argparse

import pytest

from trtfuse import args as flags
from trtfuse.cli import build_parser, main


def test_written_out_choices_agree_with_the_library():
    from trtfuse.graph_passes.fuse_residual import FUSE_MODES
    from trtfuse.models.resnet import ARCHITECTURES

    assert flags.FUSE_MODES == FUSE_MODES and flags.ARCHITECTURES == tuple(ARCHITECTURES)


def _subparsers(parser, path=("trtfuse",)):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _subparsers(sub, path + (name,))


def test_every_flag_subcommands_share_is_a_common_flag():
    seen: dict[str, set] = {}
    for path, parser in _subparsers(build_parser()):
        for action in parser._actions:
            for name in action.option_strings or [action.dest]:
                seen.setdefault(name, set()).add(" ".join(path))
    shared = {name for name, where in seen.items() if len(where) > 1} - {"-h", "--help", "command", "bench"}
    assert shared <= flags.COMMON_FLAGS, f"shared by subcommands but not declared in trtfuse.args: {sorted(shared - flags.COMMON_FLAGS)}"


@pytest.mark.parametrize("argv,flag", [
    (["offline", "--model", "m.onnx", "--gpus", "0"], "--gpus"),
    (["offline", "--endpoint", "127.0.0.1:1", "--max-in-flight", "0"], "--max-in-flight"),
    (["serve", "m.onnx", "--backend", "cuda", "--gpus", "-1"], "--gpus"),
    (["serve", "m.onnx", "--backend", "cuda", "--streams", "0"], "--streams"),
    (["export-triton", "m.onnx", "-o", "repo", "--max-queue-delay-us", "-5"], "--max-queue-delay-us"),
    (["export-triton", "m.onnx", "-o", "repo", "--max-batch", "0"], "--max-batch"),
    (["build", "m.onnx", "-o", "m.engine", "--batch", "3,2,1"], "--batch"),
    (["calibrate", "m.onnx", "-o", "s.json", "--count", "nan"], "--count"),
    (["bench", "e2e", "--seconds", "-1"], "--seconds"),
])
def test_bad_values_are_refused_while_parsing(argv, flag, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no file is read: the value is refused before the command runs
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"trtfuse: error: {argv[0]}") and f"argument {flag}" in err[0], err
    assert list(tmp_path.iterdir()) == []


def test_the_probes_flags_check_their_values_too():
    p = argparse.ArgumentParser()
    flags.settle(p, 0.0)
    flags.seconds(p, 2.0)
    flags.out(p)
    assert vars(p.parse_args([])) == {"settle": 0.0, "seconds": 2.0, "out": None}
    assert p.parse_args(["--settle", "0", "--seconds", "0.5", "--out", "r.json"]).out == "r.json"
    for bad in (["--settle", "-1"], ["--seconds", "0"], ["--seconds", "inf"]):
        with pytest.raises(SystemExit):
            p.parse_args(bad)


def test_offline_gpus_keeps_its_text_and_build_batch_is_the_profile():
    parser = build_parser()
    assert parser.parse_args(["offline", "--model", "m.onnx", "--gpus", "all"]).gpus == "all"
    assert parser.parse_args(["offline", "--model", "m.onnx"]).gpus == "1"
    assert parser.parse_args(["build", "m.onnx", "-o", "e", "--batch", "8"]).batch == (8, 8, 8)
    assert parser.parse_args(["build", "m.onnx", "-o", "e"]).batch is None
