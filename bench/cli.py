"""`trtfuse bench <what>`: benchmarks. Each lives in its own module exposing
`add_arguments(parser)` and `run(args) -> int`; each writes a JSON record to -o, else to
./bench-results/ ($TRTFUSE_RESULTS_DIR overrides; never into the installed package)."""

import importlib

from trtfuse import args as flags

BENCHMARKS = {
    "kernels": ("trtfuse.bench.kernels", "time the fused INT8 conv kernels per ResNet-50 layer (GPU)"),
    "splitk": ("trtfuse.bench.splitk", "time MatMul/Gemm plain vs split-K rewrite on a shape sweep (GPU)"),
    "e2e": ("trtfuse.bench.e2e", "INT8 ResNet-50 forward on trtfuse's kernels vs PyTorch fp16, per-step breakdown (GPU)"),
    "harness": ("trtfuse.bench.harness", "the Offline harness's own ceiling: LoadGen + threads + responses over instant runners (CPU)"),
}


def register(sub) -> None:
    p = sub.add_parser("bench", help="run a benchmark and record its JSON (-o, else ./bench-results/)")
    bsub = p.add_subparsers(dest="bench", metavar="BENCHMARK", required=True)
    for name, (module, help_text) in BENCHMARKS.items():
        bp = bsub.add_parser(name, help=help_text)
        flags.json_flag(bp, "print the records as JSON instead of a table")
        flags.output(bp, "results file (default: ./bench-results/<name>-<device>.json, a line appended to "
                     "<name>-history.jsonl beside it; $TRTFUSE_RESULTS_DIR overrides the folder)")
        bp.set_defaults(func=lambda args, module=module: importlib.import_module(module).run(args))
        bp.set_defaults(_add_arguments_from=module)
        try:
            importlib.import_module(module).add_arguments(bp)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
