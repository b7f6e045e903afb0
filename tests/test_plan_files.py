"""Tuned plans read back from a results file (runtime/gpu_runner.py: load_plans, named_plan; `trtfuse offline --plans`):
every name a runner writes (plan_names) reads back as the same tactic and split count, and a file that does not fit the
run is refused in one line. CPU only: the plans are resolved, not launched."""

import json

import pytest

from trtfuse.errors import TrtfuseError
from trtfuse.plugins.conv import ConvLaunch
from trtfuse.plugins.tactics import TACTICS, ConvShape
from trtfuse.plugins.wgmma_tactics import WGMMA_TACTICS
from trtfuse.runtime.gpu_runner import load_plans, named_plan

SHAPE = ConvShape(256, 64, 56, 56, 64, 3, 3, (1, 1), (1, 1, 1, 1))


@pytest.mark.parametrize("tactic", [t for t in TACTICS if t.vec == 32][:8] + [t for t in WGMMA_TACTICS if t.geometry(SHAPE)][:8],
                         ids=lambda t: t.name.split("_")[0])
def test_a_plan_name_reads_back_as_its_tactic_and_splits(tactic):
    plan = ConvLaunch.plan(SHAPE, tactic.id, 2)
    again = named_plan(f"{plan.tactic.name}/s{plan.splits}", SHAPE, "layer1.0.conv2")
    assert (again.tactic.id, again.splits, again.shape) == (tactic.id, 2, SHAPE)


@pytest.mark.parametrize("name", ["w999_nothing/s1", "t9_64x64_w2x2_s2_v32_b4", "t9_64x64_w2x2_s2_v32_b4/sx"])
def test_an_unknown_plan_name_is_refused(name):
    with pytest.raises(TrtfuseError, match="layer1.0.conv2"):
        named_plan(name, SHAPE, "layer1.0.conv2")


def test_a_plan_for_another_layout_is_refused():
    chw4 = next(t for t in TACTICS if t.vec == 4)
    with pytest.raises(TrtfuseError, match="cannot run its shape"):
        named_plan(f"{chw4.name}/s1", SHAPE, "layer1.0.conv2")


def _write(tmp_path, record):
    path = tmp_path / "e2e.json"
    path.write_text(json.dumps(record))
    return str(path)


def test_load_plans_takes_the_conv_plans_and_the_stem_tile(tmp_path):
    conv = f"{TACTICS[0].name}/s1"
    got = load_plans(_write(tmp_path, {"batch": 512, "plans": {"conv1__fused": "stem_pool/4x28", "layer1.0.conv1__fused": conv,
                                                                "layer1.1.conv1__fused": "bottleneck",
                                                                "layer1.2.conv3__fused": "chain",
                                                                "layer1.0.conv2__fused": "stem"}}), 512)
    assert got.plans == [("layer1.0.conv1__fused", conv)] and got.stem_pool_tile == (4, 28)


def test_load_plans_takes_a_file_tuned_at_a_divisor_of_the_batch(tmp_path):
    conv = f"{TACTICS[0].name}/s1"
    got = load_plans(_write(tmp_path, {"batch": 256, "plans": {"layer1.0.conv1__fused": conv}}), 1024)
    assert got.plans == [("layer1.0.conv1__fused", conv)] and got.batch == 256


@pytest.mark.parametrize("record,match", [
    ({"batch": 1024, "plans": {}}, "tuned at batch 1024, this run is batch 512"),
    ({"batch": 384, "plans": {}}, "not a whole multiple"),
    ({"batch": "512", "plans": {}}, "tuned at batch 512"),
    ({"batch": True, "plans": {}}, "tuned at batch True"),
    ({"batch": 512}, "not a results file"),
    ({"batch": 512, "plans": {"conv1__fused": "stem_pool/5x5"}}, "stem tile"),
    ("not json", "not a results file"),
], ids=["larger-batch", "not-a-multiple", "batch-not-a-number", "batch-a-bool", "no-plans", "unknown-tile", "not-json"])
def test_load_plans_refuses_a_file_that_does_not_fit(tmp_path, record, match):
    path = tmp_path / "e2e.json"
    path.write_text(record if isinstance(record, str) else json.dumps(record))
    with pytest.raises(TrtfuseError, match=match):
        load_plans(str(path), 512)


def test_offline_plans_with_autotune_is_one_line(tmp_path, capsys):
    from trtfuse.cli import main

    plans = _write(tmp_path, {"batch": 256, "plans": {}})
    model = tmp_path / "m.onnx"
    model.write_bytes(b"")
    rc = main(["offline", "--model", str(model), "--plans", plans, "--autotune", "--log-dir", str(tmp_path / "logs")])
    err = capsys.readouterr().err
    assert rc != 0 and "--plans" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("extra,match", [(["--autotune"], "--plans"), ([], "tuned at batch 256")],
                         ids=["with-autotune", "other-batch"])
def test_bench_e2e_plans_refusals_are_one_line(tmp_path, capsys, extra, match):
    from trtfuse.cli import main

    plans = _write(tmp_path, {"batch": 256, "plans": {}})
    rc = main(["bench", "e2e", "--batch", "384", "--plans", plans] + extra)
    err = capsys.readouterr().err
    assert rc != 0 and match in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_unfuse_names_map_to_the_runner_options_and_others_are_refused():
    from trtfuse.args import UNFUSE
    from trtfuse.runtime.gpu_runner import CudaRunner, unfused_options

    import inspect

    options = unfused_options(UNFUSE)
    assert options == {"fuse_chain": False, "fuse_downsample": False, "fuse_stem_conv": False, "fuse_stem_pool": False,
                       "fuse_subsample": False}
    assert set(options) <= set(inspect.signature(CudaRunner).parameters)  # every option is one the runner takes
    assert unfused_options([]) == {}
    with pytest.raises(TrtfuseError, match="not a fusion"):
        unfused_options(["bottleneck"])


@pytest.mark.parametrize("argv,match", [
    (["offline", "--backend", "onnxruntime", "--unfuse", "chain"], "--unfuse"),
    (["offline", "--endpoint", "localhost:8000", "--unfuse", "chain"], "--unfuse"),
], ids=["onnxruntime", "endpoint"])
def test_offline_unfuse_outside_the_gpu_runner_is_one_line(tmp_path, capsys, argv, match):
    from trtfuse.cli import main

    model = tmp_path / "m.onnx"
    model.write_bytes(b"")
    if "--endpoint" not in argv:
        argv = argv + ["--model", str(model)]
    rc = main(argv + ["--log-dir", str(tmp_path / "logs")])
    err = capsys.readouterr().err
    assert rc != 0 and match in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_bench_e2e_and_offline_take_unfuse_repeated():
    from trtfuse.cli import build_parser

    a = build_parser().parse_args(["bench", "e2e", "--unfuse", "stem-conv", "--unfuse", "downsample"])
    assert a.unfuse == ["stem-conv", "downsample"]
    assert build_parser().parse_args(["bench", "e2e"]).unfuse == []
    assert build_parser().parse_args(["offline", "--unfuse", "chain"]).unfuse == ["chain"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "e2e", "--unfuse", "bottleneck"])
