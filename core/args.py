"""The command-line flags that more than one of trtfuse's parsers takes, each declared here once (Polygraphy's
argument groups, as functions): its names, type and the validation the type does, metavar, and the form of its help.

A subcommand (or a `python -m trtfuse...` tool) calls the function of each common flag it takes, giving what is its
own: the default, and the words of the help that say what the value means to it (`what`, or the whole text where
the commands word it differently). `tests/test_code_layout.py` fails when a flag of COMMON_FLAGS is declared with
`add_argument` anywhere else, and when another flag comes to be declared in two places.

Bad values are refused while parsing: the types below raise argparse.ArgumentTypeError, which trtfuse's parser prints
as one line (`trtfuse: error: <subcommand>: argument --count: must be at least 1, got 0`, exit 2).
"""

from __future__ import annotations

import argparse

from .validate import number_type, positive_float, positive_int

# Every flag declared here: what tests/test_code_layout.py keeps out of every other module.
COMMON_FLAGS = frozenset({
    "arch", "model", "-o", "--output", "--out", "--json", "--debug", "--data", "--count", "--batch", "--backend", "--gpus",
    "--streams", "--threads", "--autotune", "--reps", "--seconds", "--settle", "--replace", "--fuse", "--scales",
    "--percentile", "--seed", "--image-size", "--min-duration", "--log-dir", "--endpoint", "--model-name",
    "--max-in-flight", "--shared-memory", "--max-batch", "--preferred-batch", "--max-queue-delay-us", "--name",
    "--plans", "--answers", "--unfuse", "--model",
})

# = models.resnet.ARCHITECTURES and graph_passes.fuse_residual.FUSE_MODES, written out so that building the parser
# imports no model builder or pass (`trtfuse --help` stays fast); tests/test_args.py checks they agree
ARCHITECTURES = ("resnet18", "resnet34", "resnet50", "resnet101")
FUSE_MODES = ("residual", "all")
# What an images argument of calibrate / evaluate / calibrate-compare takes.
# How a LoadGen run receives its query and answers each batch (runtime/offline.run_loadgen; runtime/loadgen_query.py,
# runtime/loadgen_answers.py), fastest first.
ANSWER_PATHS = ("array", "lists", "objects")
DATA_HELP = "a folder of JPEG/PNG images (optional val_map.txt labels), a .npy/.npz batch, or 'default' (embedded photos)"

_POSITIVE_INT = positive_int()
_POSITIVE_FLOAT = positive_float()


def _non_negative(kind: type):
    """An int or finite float that may be 0 (a count of GPUs with none meaning the CPU, seconds to wait)."""
    checked = number_type(kind, False)

    def parse(text: str):
        value = checked(text)
        if value < 0:
            raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


_NON_NEGATIVE_INT = _non_negative(int)
_NON_NEGATIVE_FLOAT = _non_negative(float)


def _gpus_or_all(text: str) -> str:
    """`offline --gpus`: N >= 1 or 'all', kept as written (run_offline resolves 'all' on the machine)."""
    if text != "all" and not (text.isdigit() and int(text) >= 1):
        raise argparse.ArgumentTypeError(f"{text}: give a number of GPUs (at least 1) or 'all'")
    return text


_gpus_or_all.__name__ = "gpus"


def batch_range(text: str) -> tuple[int, int, int]:
    """`build --batch`: "8" -> (8, 8, 8); "1,8,32" -> (MIN, OPT, MAX), the engine's optimization profile."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes N or MIN,OPT,MAX, not {text!r}") from None
    if len(values) == 1:
        values *= 3
    if len(values) != 3 or not (1 <= values[0] <= values[1] <= values[2]):
        raise argparse.ArgumentTypeError(f"needs 1 <= MIN <= OPT <= MAX, got {text!r}")
    return tuple(values)


batch_range.__name__ = "batch range"


# ---- what a command reads and writes ----

def arch(p, help: str | None = None):
    """The ResNet architecture, positional (`trtfuse models ARCH`)."""
    return p.add_argument("arch", choices=ARCHITECTURES, help=help)


def model(p, help: str | None = None):
    """The input model, positional (`trtfuse rewrite MODEL ...`); each command checks it as it reads it."""
    return p.add_argument("model", help=help)


def model_option(p, help: str, *, metavar: str | None = None):
    """--model: the input model where it is an option (`offline`, `bench e2e`) rather than positional."""
    return p.add_argument("--model", metavar=metavar, help=help)


def output(p, help: str, *, required: bool = False, metavar: str | None = None):
    """-o/--output: what the command writes (atomically); checked up front by the command (trtfuse.validate)."""
    return p.add_argument("-o", "--output", required=required, metavar=metavar, help=help)


def out(p, help: str = "also write the run's JSON record here"):
    """--out of the bench's `python -m trtfuse.bench...` probes: where their JSON record goes."""
    return p.add_argument("--out", metavar="FILE", help=help)


def json_flag(p, help: str = "print the summary as JSON"):
    return p.add_argument("--json", action="store_true", help=help)


def debug(p, help: str = "show tracebacks for unexpected errors", *, after_subcommand: bool = False):
    """--debug; after the subcommand its default is left out, so that it does not undo one given before it."""
    return p.add_argument("--debug", action="store_true", help=help,
                          **({"default": argparse.SUPPRESS} if after_subcommand else {}))


def data(p, default: str, help: str, metavar: str | None = None):
    """--data: the images a command runs on (each command says which forms it reads)."""
    return p.add_argument("--data", default=default, metavar=metavar, help=help)


def scales(p, help: str):
    """--scales: an activation scales JSON (trtfuse-scales-v1, `trtfuse calibrate -o`)."""
    return p.add_argument("--scales", metavar="F", help=help)


# ---- how much ----

def count(p, default: int | None, help: str, metavar: str | None = None):
    """--count: images or samples, at least 1."""
    return p.add_argument("--count", type=_POSITIVE_INT, default=default, metavar=metavar, help=help)


def batch(p, default=None, help: str | None = None, *, metavar: str | None = None, nargs=None, profile: bool = False):
    """--batch: images per run, at least 1 (nargs="+": several, each timed); with `profile`, TensorRT's optimization
    profile N or MIN,OPT,MAX, parsed into (MIN, OPT, MAX)."""
    return p.add_argument("--batch", type=batch_range if profile else _POSITIVE_INT, default=default, nargs=nargs,
                          metavar=metavar, help=help)


def streams(p, default: int, help: str, metavar: str | None = "N"):
    """--streams: runners (CUDA graphs on their own streams) in flight, at least 1."""
    return p.add_argument("--streams", type=_POSITIVE_INT, default=default, metavar=metavar, help=help)


def threads(p, default: int, help: str, metavar: str | None = None):
    """--threads: ONNX Runtime intra-op threads, at least 1 (a default of 0 leaves the choice to ONNX Runtime)."""
    return p.add_argument("--threads", type=_POSITIVE_INT, default=default, metavar=metavar, help=help)


def reps(p, default: int, help: str):
    """--reps: timed repetitions per figure, at least 1."""
    return p.add_argument("--reps", type=_POSITIVE_INT, default=default, help=help)


def seconds(p, default: float, help: str | None = None):
    """--seconds: a duration a benchmark times or runs for, greater than 0."""
    return p.add_argument("--seconds", type=_POSITIVE_FLOAT, default=default, help=help)


def settle(p, default: float, help: str | None = None):
    """--settle: seconds given to the GPU's clocks to settle around a timing (idle before it, or run before its samples
    count), 0 or more."""
    return p.add_argument("--settle", type=_NON_NEGATIVE_FLOAT, default=default, help=help)


def min_duration(p, default: float | None, help: str):
    """--min-duration: LoadGen's min duration in seconds, greater than 0."""
    return p.add_argument("--min-duration", type=_POSITIVE_FLOAT, default=default, metavar="S", help=help)


def image_size(p, default: int = 224, help: str | None = None):
    """--image-size: input height = width in pixels, at least 1 (the model builder checks its own rules)."""
    return p.add_argument("--image-size", type=_POSITIVE_INT, default=default, help=help)


def seed(p, default: int = 0, help: str = "weight seed (default 0)"):
    return p.add_argument("--seed", type=number_type(int, False), default=default, help=help)


def percentile(p, help: str, default: float = 99.99):
    """--percentile of the percentile calibration method, greater than 0 (at most 100: calibrate.check_method)."""
    return p.add_argument("--percentile", type=_POSITIVE_FLOAT, default=default, help=help)


# ---- where and how it runs ----

def backend(p, choices, *, default: str | None = None, required: bool = False, help: str | None = None):
    return p.add_argument("--backend", choices=choices, default=default, required=required, help=help)


def gpus(p, default, help: str, *, metavar: str = "N", allow_all: bool = False):
    """--gpus: GPUs to use, one worker or model instance each. With `allow_all` (offline): N >= 1 or 'all', kept as
    text; otherwise a count, 0 or more (the command says what 0 means to it, or refuses it)."""
    return p.add_argument("--gpus", type=_gpus_or_all if allow_all else _NON_NEGATIVE_INT, default=default,
                          metavar=metavar, help=help)


def autotune(p, help: str):
    """--autotune: time every tactic instead of taking the heuristic's choice."""
    return p.add_argument("--autotune", action="store_true", help=help)


def plans(p, help: str):
    """--plans: a results file whose tuned launch plans the GPU runners take instead of tuning again."""
    return p.add_argument("--plans", metavar="RESULTS_JSON", help=help)


# The GPU runner's fusions `--unfuse` can turn off, each name -> runtime/gpu_runner.py's CudaRunner option
UNFUSE = ("chain", "downsample", "stem-conv", "stem-pool", "subsample")


def unfuse(p, help: str):
    """--unfuse NAME (repeatable): run one of the GPU runner's fusions as the kernels it replaces (an A/B against the
    default in one command)."""
    return p.add_argument("--unfuse", action="append", choices=UNFUSE, default=[], metavar="|".join(UNFUSE), help=help)


def fuse(p, default: str, help: str, *, both: bool = False):
    """--fuse: which convs the rewrite fuses; `both` (calibrate): the tensors either mode reads."""
    return p.add_argument("--fuse", choices=("both", *FUSE_MODES) if both else FUSE_MODES, default=default, help=help)


def replace(p, help: str):
    """--replace of the wgmma probes: integer fields of table tactics replaced ('70:halo_stages=10')."""
    return p.add_argument("--replace", default="", help=help)


def answers(p, help: str):
    """--answers of a LoadGen run: how the query is received and each batch answered (runtime/loadgen_query.py,
    runtime/loadgen_answers.py)."""
    return p.add_argument("--answers", choices=ANSWER_PATHS, default=ANSWER_PATHS[0],
                          help=f"how LoadGen's query is received and each batch answered: array, the query read in "
                               f"place from LoadGen's own sample array and one call into LoadGen's C++ "
                               f"QuerySamplesComplete per batch (default; the next path where the installed LoadGen "
                               f"does not allow it); lists, the query as the Python binding's two lists of ints and "
                               f"answers as array; objects, those lists and a QuerySampleResponse per sample; {help}")


# ---- groups ----

def loadgen_logs(p, default: str):
    """--log-dir of a LoadGen run."""
    return p.add_argument("--log-dir", default=default, help=f"folder for LoadGen's logs (default {default})")


def endpoints(p) -> None:
    """The options that point a LoadGen run at Triton servers instead of an in-process model."""
    p.add_argument("--endpoint", action="append", metavar="127.0.0.1:PORT",
                   help="a Triton server's gRPC endpoint (`trtfuse serve`); repeat it: the servers share the load")
    p.add_argument("--model-name", default="resnet", help="--endpoint: the served model's name (default resnet)")
    p.add_argument("--max-in-flight", type=_POSITIVE_INT, default=64, metavar="N",
                   help="--endpoint: requests outstanding per endpoint at most (default 64)")
    p.add_argument("--shared-memory", choices=("none", "cuda"), default="none",
                   help="--endpoint: how images reach the servers: in the requests (none, default), or through CUDA "
                        "shared memory on this machine's GPUs (cuda: a server on the same machine; no image crosses gRPC)")


def triton_batching(p, max_batch: int) -> None:
    """A Triton model's batching and name (`serve`, `export-triton`)."""
    p.add_argument("--max-batch", type=_POSITIVE_INT, default=max_batch, metavar="N",
                   help=f"max_batch_size: images per batch at most, requests batched together included (default {max_batch})")
    p.add_argument("--preferred-batch", metavar="N,N", help="dynamic batching's preferred batch sizes (default: none)")
    p.add_argument("--max-queue-delay-us", type=_NON_NEGATIVE_INT, default=100, metavar="US",
                   help="dynamic batching's max queue delay in microseconds (default 100)")
    p.add_argument("--name", default="resnet", help="the model's name in the repository (default resnet)")
