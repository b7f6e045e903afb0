"""The chain pass (graph_passes/chain_pairs.py), on the CPU: a FusedConvAdd 1x1 and the FusedConv 1x1 reading its
output become one FusedConvAddConv node; split_chain_node undoes it; the pipeline option "chain" and
`trtfuse rewrite --chain` apply it.

ResNet-50 is built at 64x64 (res2 maps 16x16, res3 8x8): which pairs chain depends on channel counts and on the map
being whole 8-pixel groups, not on the image size. Maps that are not whole groups come from a small hand-built net
(every image size the model builder takes gives res2/res3 maps of whole groups).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_fixtures import TORCHSCRIPT_R50, load_fixture
from passes_nets import input_data, residual_net
from trtfuse.cli import main
from trtfuse.graph_passes.chain_pairs import chain_conv_pairs, chain_node_name, split_chain_node
from trtfuse.graph_passes.fuse_residual import required_activation_tensors
from trtfuse.graph_passes.pipeline import PASSES, RewriteContext, chain_pass, fuse_pass, rewrite, run_pipeline
from trtfuse.graph_passes.report import FUSED, REJECTED
from trtfuse.graph_passes.scales import SCALES_FORMAT, model_images
from trtfuse.plugins.op_schema import (DOMAIN, FUSED_CONV, FUSED_CONV_ADD, FUSED_CONV_ADD_CONV, NAMESPACE,
                                       chain_attributes, chain_inputs, chained)
from trtfuse.runtime.cpu_executor import CpuExecutor, run_plugin

models = pytest.importorskip("trtfuse.models")

CHAIN = FUSED_CONV_ADD_CONV.name

# ResNet-50: (block whose conv3 is the first conv, block whose conv1 reads its output)
R50_CHAINED = [("layer1.0", "layer1.1"), ("layer1.1", "layer1.2"), ("layer1.2", "layer2.0"),
               ("layer2.0", "layer2.1"), ("layer2.1", "layer2.2"), ("layer2.2", "layer2.3")]
R50_REJECTED = {
    ("layer2.3", "layer3.0"): "128 -> 512 -> 256 channels measured slower",
    **{(f"layer3.{i}", f"layer3.{i + 1}"): "conv 1 is 256 -> 1024 channels" for i in range(5)},
    ("layer3.5", "layer4.0"): "conv 1 is 256 -> 1024 channels",
    ("layer4.0", "layer4.1"): "conv 1 is 512 -> 2048 channels",
    ("layer4.1", "layer4.2"): "conv 1 is 512 -> 2048 channels",
}


def pair_names(first_block, second_block):
    return [f"{first_block}.conv3__fused", f"{second_block}.conv1__fused"]


def chain_rows(report, status=None):
    return [c for c in report if c.pass_name == "chain" and (status is None or c.status == status)]


def chain_nodes(model):
    return [n for n in model.graph.node if n.op_type == CHAIN]


def attrs_of(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def copy_of(model):
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def node_named(model, name):
    (node,) = [n for n in model.graph.node if n.name == name]
    return node


def chain_outputs(model):
    return [o for n in chain_nodes(model) for o in n.output]


def assert_same_outputs(fused, chained_model, feeds, engine="ort", extra=()):
    want = CpuExecutor(fused, engine=engine, extra_outputs=extra).run(feeds)
    got = CpuExecutor(chained_model, engine=engine, extra_outputs=extra).run(feeds)
    assert list(got) == list(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape, name
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    return got


# -- fixtures ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def r50():
    model = models.load_cached_model("resnet50", image_size=64, bn_images=4)
    calib = model_images(model, 2, split="calib")
    fused, fuse_report = rewrite(model, "all", calib_images=calib)
    fused_bytes = fused.SerializeToString()
    report = []
    chained_model = chain_conv_pairs(fused, report)
    return SimpleNamespace(model=model, calib=calib, fused=fused, fused_bytes=fused_bytes, fuse_report=fuse_report,
                           chained=chained_model, report=report, image=model_images(model, 1, split="heldout"))


def bottleneck_net(h=8, w=8, c_mid=64, **kwargs):
    """x -> [1x1 256->c_mid, 1x1 c_mid->256, + x] -> [same] : --fuse all gives FusedConv, FusedConvAdd, FusedConv,
    FusedConvAdd, the middle two a chain candidate. Returns (float model, --fuse all model, calibration images)."""
    model = residual_net(k=1, c_in=256, c_mid=c_mid, c_out=256, h=h, w=w, blocks=2, batch=1, **kwargs)
    calib = np.concatenate([input_data(model, seed=100 + i, batch=1) for i in range(2)])
    fused, _ = rewrite(model, "all", calib_images=calib)
    return model, fused, calib


@pytest.fixture(scope="module")
def small():
    return bottleneck_net()


SMALL_PAIR = ["block0.conv2__fused", "block1.conv1__fused"]


# -- ResNet-50 -----------------------------------------------------------------------------------------------------


def test_resnet50_chains_the_res2_and_res3_pairs(r50):
    assert not chain_nodes(r50.fused)
    want = [chain_node_name(*pair_names(*p)) for p in R50_CHAINED]
    assert sorted(n.name for n in chain_nodes(r50.chained)) == sorted(want)
    fused_rows = chain_rows(r50.report, FUSED)
    assert sorted(c.nodes for c in fused_rows) == sorted(pair_names(*p) for p in R50_CHAINED)
    assert all(c.op == CHAIN and c.kind == "conv-add+conv" for c in fused_rows)
    rejected = {tuple(c.nodes): c.reason for c in chain_rows(r50.report, REJECTED)}
    assert set(rejected) == {tuple(pair_names(*p)) for p in R50_REJECTED}
    for pair, why in R50_REJECTED.items():
        assert why in rejected[tuple(pair_names(*pair))], (pair, rejected[tuple(pair_names(*pair))])
    assert len(chain_rows(r50.report)) == len(R50_CHAINED) + len(R50_REJECTED)
    # the pairs' own nodes are gone, every other node is still there
    gone = {name for p in R50_CHAINED for name in pair_names(*p)}
    assert {n.name for n in r50.chained.graph.node} == {n.name for n in r50.fused.graph.node} - gone | set(want)
    assert len(r50.chained.graph.node) == len(r50.fused.graph.node) - len(R50_CHAINED)


def test_resnet50_chain_nodes_keep_both_tensors_and_the_schema(r50):
    fused_nodes = {n.name: n for n in r50.fused.graph.node}
    readers = {}
    for n in r50.chained.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n.name)
    inits = {i.name: numpy_helper.to_array(i) for i in r50.chained.graph.initializer}
    for node in chain_nodes(r50.chained):
        first, second = (fused_nodes[s] for s in node.name.split("+"))
        assert node.domain == DOMAIN
        # both outputs under their own names: y's other readers (the next block's residual, a downsample) read it as before
        assert list(node.output) == [first.output[0], second.output[0]]
        assert readers.get(first.output[0]), node.name
        assert node.input[FUSED_CONV_ADD_CONV.input_names.index("x")] == first.input[0]
        assert list(node.input) == chained(list(first.input), list(second.input))
        assert all(i in inits for i in node.input[1:5] + node.input[6:])  # weights, scales, biases: constants
        attrs = {a.name: a for a in node.attribute}
        assert list(attrs) == list(FUSED_CONV_ADD_CONV.attribute_names) + ["plugin_namespace", "aot"]
        assert attrs["plugin_namespace"].s == NAMESPACE.encode()
        a, f, s = attrs_of(node), attrs_of(first), attrs_of(second)
        assert (a["in_channels"], a["out_channels"], a["relu"]) == (f["in_channels"], f["out_channels"], f["relu"])
        assert (a["next_out_channels"], a["next_relu"]) == (s["out_channels"], s["relu"])
        assert s["in_channels"] == a["out_channels"]


def test_resnet50_chained_model_is_valid_and_input_untouched(r50):
    onnx.checker.check_model(r50.chained, full_check=True)
    assert r50.fused.SerializeToString() == r50.fused_bytes
    assert {o.domain: o.version for o in r50.chained.opset_import}.get(DOMAIN) == 1
    # graph inputs and outputs as before
    assert [i.name for i in r50.chained.graph.input] == [i.name for i in r50.fused.graph.input]
    assert [o.name for o in r50.chained.graph.output] == [o.name for o in r50.fused.graph.output]


def test_resnet50_chain_is_idempotent(r50):
    again = chain_conv_pairs(r50.chained, [])
    assert len(chain_nodes(again)) == len(R50_CHAINED)
    assert sorted(n.name for n in again.graph.node) == sorted(n.name for n in r50.chained.graph.node)


@pytest.mark.parametrize("engine", ["ort", "reference"])
def test_resnet50_chained_model_bit_identical_on_cpu(r50, engine):
    feeds = {"input": r50.image}
    extra = chain_outputs(r50.chained) if engine == "ort" else ()
    if engine == "ort":
        assert len(extra) == 2 * len(R50_CHAINED)
    got = assert_same_outputs(r50.fused, r50.chained, feeds, engine, extra)
    for name in extra:
        assert got[name].dtype == np.int8 and got[name].any(), name
    assert np.isfinite(got[r50.chained.graph.output[0].name]).all()


def test_split_chain_node_gives_back_the_two_nodes(r50):
    fused_nodes = {n.name: n for n in r50.fused.graph.node}
    for node in chain_nodes(r50.chained):
        first_name, second_name = node.name.split("+")
        first, second = fused_nodes[first_name], fused_nodes[second_name]
        conv, nxt = split_chain_node(node)
        assert (conv.name, nxt.name) == (f"{node.name}/conv", f"{node.name}/next")
        for half, orig, spec in ((conv, first, FUSED_CONV_ADD), (nxt, second, FUSED_CONV)):
            assert (half.op_type, half.domain) == (orig.op_type, orig.domain) == (spec.name, DOMAIN)
            assert list(half.input) == list(orig.input), half.name
            assert list(half.output) == list(orig.output), half.name
            assert attrs_of(half) == attrs_of(orig), half.name
        # op_schema.chain_inputs / chained / chain_attributes round-trip the node's inputs and attributes
        ins = list(node.input)
        assert chain_inputs(ins, node.output[0]) == (list(first.input), list(second.input))
        assert chained(*chain_inputs(ins, node.output[0])) == ins
        node_attrs = attrs_of(node)
        for half_attrs, orig in zip(chain_attributes(node_attrs), (first, second)):
            want = {k: v for k, v in attrs_of(orig).items() if k not in ("plugin_namespace", "aot")}
            assert {k: list(v) if isinstance(v, tuple) else v for k, v in half_attrs.items()} == want


def test_split_chain_nodes_rebuild_the_fused_graph(r50):
    nodes = []
    for n in r50.chained.graph.node:
        nodes.extend(split_chain_node(n) if n.op_type == CHAIN else [n])
    split = copy_of(r50.chained)
    del split.graph.node[:]
    split.graph.node.extend(nodes)
    onnx.checker.check_model(split)

    def key(n):  # a node less its name and attribute order
        return (n.op_type, n.domain, tuple(n.input), tuple(n.output), sorted((k, repr(v)) for k, v in attrs_of(n).items()))

    assert sorted(map(key, split.graph.node)) == sorted(map(key, r50.fused.graph.node))


def test_torchvision_export_with_dynamic_batch_chains_the_same_pairs():
    model = load_fixture(TORCHSCRIPT_R50)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param  # batch "N"
    out, ctx = run_pipeline(model, "all", options={"chain": True}, calib_count=1)
    rows = chain_rows(ctx.report)
    fused_rows = [c.nodes for c in rows if c.status == FUSED]
    want = [[f"/{a.split('.')[0]}/{a}/conv3/Conv__fused", f"/{b.split('.')[0]}/{b}/conv1/Conv__fused"]
            for a, b in R50_CHAINED]
    assert sorted(fused_rows) == sorted(want)
    assert sum(c.status == REJECTED for c in rows) == len(R50_REJECTED)
    nodes = chain_nodes(out)
    assert len(nodes) == len(R50_CHAINED)
    shapes = {v.name: v.type.tensor_type.shape.dim for v in out.graph.value_info}
    for name in (o for n in nodes for o in n.output):
        assert shapes[name][0].dim_param and all(d.dim_value > 0 for d in shapes[name][1:]), name
    onnx.checker.check_model(out)


# -- pairs that are not taken ----------------------------------------------------------------------------------------


def _set_ints(node, name, values):
    (attr,) = [a for a in node.attribute if a.name == name]
    attr.ints[:] = values


def _value_info(model, name):
    (vi,) = [v for v in model.graph.value_info if v.name == name]
    return vi


def reader_3x3(model, pair):
    node = node_named(model, pair[1])
    _set_ints(node, "kernel_shape", [3, 3])
    _set_ints(node, "pads", [1, 1, 1, 1])


def reader_stride_2(model, pair):
    _set_ints(node_named(model, pair[1]), "strides", [2, 2])


def dynamic_y(model, pair):
    dims = _value_info(model, node_named(model, pair[0]).output[0]).type.tensor_type.shape.dim
    dims[2].dim_param, dims[3].dim_param = "H", "W"


def unknown_y(model, pair):
    y = node_named(model, pair[0]).output[0]
    kept = [v for v in model.graph.value_info if v.name != y]
    assert len(kept) == len(model.graph.value_info) - 1
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)


@pytest.mark.parametrize("edit, pair, reason", [
    (reader_3x3, ("layer1.0", "layer1.1"), None),
    (reader_stride_2, ("layer1.2", "layer2.0"), None),
    (dynamic_y, ("layer1.1", "layer1.2"), "has dynamic channel/spatial dims"),
    (unknown_y, ("layer2.1", "layer2.2"), "has unknown shape"),
])
def test_resnet50_edited_pair_not_chained(r50, edit, pair, reason):
    names = pair_names(*pair)
    model = copy_of(r50.fused)
    edit(model, names)
    before = model.SerializeToString()
    report = []
    out = chain_conv_pairs(model, report)
    assert model.SerializeToString() == before
    assert sorted(n.name for n in chain_nodes(out)) == sorted(
        chain_node_name(*pair_names(*p)) for p in R50_CHAINED if p != pair)
    assert all(n in {x.name for x in out.graph.node} for n in names)
    rows = [c for c in chain_rows(report) if c.nodes[0] == names[0]]
    if reason is None:  # not a 1x1 stride-1 reader: not a candidate at all
        assert not rows
    else:
        (row,) = rows
        assert row.status == REJECTED and row.nodes == names and reason in row.reason
        assert node_named(model, names[0]).output[0] in row.reason
    # the other pairs' rows are unchanged
    others = [(c.nodes, c.status, c.reason) for c in chain_rows(report) if c.nodes[0] != names[0]]
    assert others == [(c.nodes, c.status, c.reason) for c in chain_rows(r50.report) if c.nodes[0] != names[0]]


def test_resnet18_has_no_chain():
    model = models.load_cached_model("resnet18", image_size=32, bn_images=4)
    fused, _ = rewrite(model, "all", calib_images=model_images(model, 2, split="calib"))
    producers = {o: n for n in fused.graph.node for o in n.output}
    # its block outputs feed 1x1 stride-2 downsample convs, and its FusedConvAdd convs are 3x3: nothing to chain
    stride2 = [n for n in fused.graph.node if n.op_type == FUSED_CONV.name and attrs_of(n)["kernel_shape"] == [1, 1]
               and attrs_of(n)["strides"] == [2, 2] and producers[n.input[0]].op_type == FUSED_CONV_ADD.name]
    assert len(stride2) == 3
    before = fused.SerializeToString()
    report = []
    out = chain_conv_pairs(fused, report)
    assert not chain_nodes(out) and not chain_rows(report)
    assert out.SerializeToString() == before == fused.SerializeToString()


def test_map_not_in_8_pixel_groups_rejected():
    _, fused, _ = bottleneck_net(h=7, w=7)
    report = []
    out = chain_conv_pairs(fused, report)
    assert not chain_nodes(out)
    (row,) = chain_rows(report)
    assert row.status == REJECTED and row.nodes == SMALL_PAIR
    assert "7x7 map does not come in 8-pixel groups" in row.reason


def test_channels_not_built_rejected():
    _, fused, _ = bottleneck_net(c_mid=32)
    report = []
    assert not chain_nodes(chain_conv_pairs(fused, report))
    (row,) = chain_rows(report)
    assert row.status == REJECTED and row.nodes == SMALL_PAIR and "conv 1 is 32 -> 256 channels" in row.reason


# -- small nets: taken cases -----------------------------------------------------------------------------------------


def test_small_net_chained_bit_identical(small):
    _, fused, _ = small
    report = []
    out = chain_conv_pairs(fused, report)
    (node,) = chain_nodes(out)
    assert node.name == "+".join(SMALL_PAIR)
    (row,) = chain_rows(report)
    assert (row.status, row.nodes, row.op) == (FUSED, SMALL_PAIR, CHAIN)
    onnx.checker.check_model(out, full_check=True)
    x = input_data(fused, seed=7, batch=1)
    for engine in ("ort", "reference"):
        assert_same_outputs(fused, out, {"input": x}, engine, list(node.output) if engine == "ort" else ())


def test_dynamic_batch_is_chained():
    _, fused, _ = bottleneck_net(dynamic_batch=True)
    out = chain_conv_pairs(fused, [])
    (node,) = chain_nodes(out)
    dims = _value_info(out, node.output[0]).type.tensor_type.shape.dim
    assert dims[0].dim_param == "N" and [d.dim_value for d in dims[1:]] == [256, 8, 8]
    x = input_data(fused, seed=7, batch=3)
    assert_same_outputs(fused, out, {"input": x}, extra=list(node.output))


@pytest.mark.parametrize("extra_first", [False, True])
def test_two_readers_first_in_graph_order_is_taken(small, extra_first):
    _, fused, _ = small
    model = copy_of(fused)
    reader = node_named(model, SMALL_PAIR[1])
    extra = onnx.NodeProto()
    extra.CopyFrom(reader)
    extra.name, extra.output[0] = "extra.conv1__fused", "extra.out"
    model.graph.output.append(helper.make_tensor_value_info("extra.out", TensorProto.INT8, [1, 64, 8, 8]))
    nodes = list(model.graph.node)
    at = nodes.index(reader) + (0 if extra_first else 1)
    nodes.insert(at, extra)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.checker.check_model(model)
    report = []
    out = chain_conv_pairs(model, report)
    taken = extra.name if extra_first else SMALL_PAIR[1]
    left = SMALL_PAIR[1] if extra_first else extra.name
    (node,) = chain_nodes(out)
    assert node.name == chain_node_name(SMALL_PAIR[0], taken)
    assert node_named(out, left).op_type == FUSED_CONV.name
    assert [c.nodes for c in chain_rows(report)] == [[SMALL_PAIR[0], taken]]
    x = input_data(fused, seed=7, batch=1)
    assert_same_outputs(model, out, {"input": x}, extra=list(node.output))


def test_run_plugin_chain_equals_its_two_convs(small):
    _, fused, _ = small
    out = chain_conv_pairs(fused, [])
    (node,) = chain_nodes(out)
    inits = {i.name: numpy_helper.to_array(i) for i in out.graph.initializer}
    rng = np.random.default_rng(3)
    acts = {node.input[0]: rng.integers(-128, 128, (1, 64, 8, 8), dtype=np.int8),
            node.input[5]: rng.integers(-128, 128, (1, 256, 8, 8), dtype=np.int8)}
    args = [inits[n] if n in inits else acts[n] for n in node.input]
    attrs = attrs_of(node)
    y, z = run_plugin(CHAIN, args, attrs)
    first_in, _ = chain_inputs(args, None)
    first_attrs, second_attrs = chain_attributes(attrs)
    (y_want,) = run_plugin(FUSED_CONV_ADD.name, first_in, first_attrs)
    (z_want,) = run_plugin(FUSED_CONV.name, chain_inputs(args, y_want)[1], second_attrs)
    assert y.dtype == z.dtype == np.int8 and y.shape == (1, 256, 8, 8) and z.shape == (1, 64, 8, 8)
    np.testing.assert_array_equal(y, y_want)
    np.testing.assert_array_equal(z, z_want)
    assert y.any() and z.any()


# -- pipeline and CLI ------------------------------------------------------------------------------------------------


def test_chain_pass_runs_after_fusion_and_only_when_asked(r50):
    assert PASSES.index(chain_pass) == PASSES.index(fuse_pass) + 1
    assert chain_pass(r50.fused, RewriteContext("all", options={})) is r50.fused
    assert chain_pass(r50.fused, RewriteContext("all", options={"chain": False})) is r50.fused


def test_run_pipeline_chain_option(r50):
    before = r50.model.SerializeToString()
    out, ctx = run_pipeline(r50.model, "all", options={"chain": True}, calib_images=r50.calib)
    assert r50.model.SerializeToString() == before
    assert sorted(n.name for n in chain_nodes(out)) == sorted(n.name for n in chain_nodes(r50.chained))
    assert out.graph == r50.chained.graph
    rows = [c.as_dict() for c in ctx.report]
    assert rows == [c.as_dict() for c in r50.fuse_report + r50.report]


def test_run_pipeline_residual_mode_has_nothing_to_chain(small):
    model, _, calib = small
    out, ctx = run_pipeline(model, "residual", options={"chain": True}, calib_images=calib)
    assert not chain_nodes(out) and not chain_rows(ctx.report)
    assert any(n.op_type == FUSED_CONV_ADD.name for n in out.graph.node)


def _trtfuse_command():
    script = Path(sys.executable).parent / "trtfuse"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    found = shutil.which("trtfuse")
    return [found] if found else [sys.executable, "-m", "trtfuse.cli"]


def test_cli_rewrite_chain_resnet50(r50, tmp_path):
    src = tmp_path / "r50.onnx"
    onnx.save(r50.model, str(src))
    before = src.read_bytes()
    out_path = tmp_path / "r50.chain.onnx"
    proc = subprocess.run(_trtfuse_command() + ["rewrite", str(src), "-o", str(out_path), "--fuse", "all", "--chain",
                                                "--json", "--calib-images", "2"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    summary = result["summary"]
    assert summary["chained_pairs"] == len(R50_CHAINED)
    assert summary["fused_residual_blocks"] == 16
    assert summary["plugin_nodes"] == 53 - len(R50_CHAINED)
    rows = [c for c in result["candidates"] if c["pass_name"] == "chain"]
    assert sorted(c["nodes"] for c in rows if c["status"] == FUSED) == sorted(pair_names(*p) for p in R50_CHAINED)
    assert sum(c["status"] == REJECTED for c in rows) == len(R50_REJECTED)
    out = onnx.load(str(out_path))
    onnx.checker.check_model(out)
    assert sorted(n.name for n in chain_nodes(out)) == sorted(chain_node_name(*pair_names(*p)) for p in R50_CHAINED)
    assert src.read_bytes() == before


def _scales_file(model, path):
    scales = {n: 0.05 for n in required_activation_tensors(model, "all")}
    path.write_text(json.dumps({"format": SCALES_FORMAT, "activations": scales}))
    return str(path)


@pytest.mark.parametrize("chain", [False, True])
def test_cli_rewrite_chain_flag(small, tmp_path, capsys, chain):
    model = small[0]
    src = tmp_path / "in.onnx"
    onnx.save(model, str(src))
    before = src.read_bytes()
    argv = ["rewrite", str(src), "-o", str(tmp_path / "out.onnx"), "--fuse", "all", "--json",
            "--scales", _scales_file(model, tmp_path / "s.json")] + (["--chain"] if chain else [])
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    out = onnx.load(str(tmp_path / "out.onnx"))
    onnx.checker.check_model(out)
    assert summary["chained_pairs"] == len(chain_nodes(out)) == (1 if chain else 0)
    assert summary["plugin_nodes"] == (3 if chain else 4)
    assert src.read_bytes() == before
