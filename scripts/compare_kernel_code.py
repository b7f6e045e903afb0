"""Compare the code NVRTC emits for every wgmma tactic between two revisions of the kernel sources.

    .venv/bin/python scripts/compare_kernel_code.py [--base REV] [--only LABEL,...] [--no-sass] [--jobs N]

Each side is a tree of the repository (the base: `git archive REV`, kept under the temporary directory per commit;
the other: this working tree), imported as `trtfuse` in a process of its own, so each compiles with its own kernel
sources and its own tactic objects. The variants are the tactic table, every profiling build bench/wgmma_diag.py
times, the timeline builds of the channel-major ping-pong tactics (bench/wgmma_timeline.py) and the chained 1x1 convs
kernel's builds ("chain K1-C1-C2", plugins/chain_conv.py), keyed by label.

For each variant it prints whether the PTX for sm_90a is identical once line info, comments and the unused .global
scalars NVRTC emits for constexpr constants are dropped (`same`), identical once virtual registers are renumbered in
order of appearance (`regs`), the same instruction sequence with register names masked (`masked`), or different;
and for the table's tactics the SASS instruction count of each side's cubin (cuobjdump -sass: pass --cuobjdump, or
put the binary of `pip install nvidia-cuda-cuobjdump`, in a scratch venv, on PATH). The profiling builds are
compared by their PTX alone. NVRTC needs cuda-python: run it with the project's .venv python. Exit status 1 when a
variant's PTX is different.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = {"trtfuse": "core", "trtfuse.plugins": "plugins", "trtfuse.graph_passes": "graph_passes",
                "trtfuse.models": "models", "trtfuse.calib": "calib", "trtfuse.runtime": "runtime", "trtfuse.bench": "bench"}
TIMELINE_TACTICS = (70, 71, 73, 74, 89)


def import_tree(tree: Path) -> None:
    """Make `import trtfuse...` load the packages of `tree` (the repository's package-dir mapping)."""
    import importlib.util

    for name, folder in PACKAGE_DIRS.items():
        spec = importlib.util.spec_from_file_location(name, tree / folder / "__init__.py",
                                                      submodule_search_locations=[str(tree / folder)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        if "." in name:
            setattr(sys.modules[name.rsplit(".", 1)[0]], name.rsplit(".", 1)[1], module)


class ChainBuild(tuple):
    """A build of the chained 1x1 convs kernel (plugins/chain_conv.py), (K1, C1, C2)."""


def chain_builds() -> dict:
    """The chain kernel's builds, labelled "chain K1-C1-C2": a tree's VARIANTS table, or, in a tree from before it,
    res2's two (K1, C1 and C2_CHOICES); none in a tree without the kernel."""
    try:
        from trtfuse.plugins import chain_conv
    except ImportError:
        return {}
    keys = list(chain_conv.VARIANTS) if hasattr(chain_conv, "VARIANTS") else \
        [(chain_conv.K1, chain_conv.C1, c2) for c2 in chain_conv.C2_CHOICES]
    return {f"chain {k1}-{c1}-{c2}": ChainBuild((k1, c1, c2)) for k1, c1, c2 in keys}


def variants() -> list[tuple[str, object]]:
    import dataclasses

    from trtfuse.bench.wgmma_diag import variants as diag_variants
    from trtfuse.plugins.tactics import TACTICS_BY_ID, WGMMA_TACTICS

    out = {f"table w{t.id}": t for t in WGMMA_TACTICS}
    out.update({label: t for label, t in diag_variants() if not label.startswith("full")})
    for i in TIMELINE_TACTICS:
        if i in TACTICS_BY_ID:
            out[f"timeline w{i}"] = dataclasses.replace(TACTICS_BY_ID[i], timeline=1)
            out[f"timeline+diag1 w{i}"] = dataclasses.replace(TACTICS_BY_ID[i], timeline=1, diag=1)
    out.update(chain_builds())
    return list(out.items())


def compile_variant(tactic, target: str) -> bytes:
    """The tree's own way of compiling a tactic: plugins/wgmma.py's compile_tactic where it exists, else the source
    with the tactic's -D defines; a chain build through the tree's chain_conv.compile_chain (keyed by C2 alone before
    its VARIANTS table)."""
    if isinstance(tactic, ChainBuild):
        from trtfuse.plugins import chain_conv

        return chain_conv.compile_chain(tuple(tactic) if hasattr(chain_conv, "VARIANTS") else tactic[2], target).image
    from trtfuse.plugins import wgmma

    if hasattr(wgmma, "compile_tactic"):
        return wgmma.compile_tactic(tactic, target).image
    from trtfuse.plugins.nvrtc import compile_kernel

    return compile_kernel(wgmma.SOURCE, tactic.defines(), wgmma.ARCH, target).image


# NVRTC emits every namespace-scope constexpr scalar (the tactic's fields, the derived flags) as an unused .global; which
# ones exist says nothing about the code, so they are left out (arrays, such as the timeline's, are kept)
SCALAR_CONSTANT = re.compile(r"\.global \.align \d+ \.[a-z]\d+ [\w$]+( = -?\d+)?;$")


def normalize_ptx(ptx: str, renumber: bool = False, mask: bool = False) -> str:
    """The PTX without line info, comments and unused scalar constants; `renumber`: virtual registers renumbered in
    order of first appearance; `mask`: every register and label name replaced by its kind alone."""
    lines = []
    in_debug = False
    for line in ptx.splitlines():
        s = line.strip()
        if s.startswith(".section") and ".debug" in s:
            in_debug = True
        if in_debug:
            if s == "}":
                in_debug = False
            continue
        if not s or s.startswith("//") or s.startswith(".loc") or s.startswith(".file") or SCALAR_CONSTANT.match(s):
            continue
        lines.append(s.split("//")[0].rstrip())
    text = "\n".join(lines)
    if mask:
        text = re.sub(r"(%[a-z]+)\d+\b", r"\1", text)
        text = re.sub(r"\$L__BB\d+_\d+", "$L", text)
        text = re.sub(r"^\.reg .*$", ".reg", text, flags=re.M)
    elif renumber:
        seen: dict[str, str] = {}
        counts: dict[str, int] = {}

        def rename(m):
            key = m.group(0)
            if key not in seen:
                counts[m.group(1)] = counts.get(m.group(1), 0) + 1
                seen[key] = f"{m.group(1)}#{counts[m.group(1)]}"
            return seen[key]

        text = re.sub(r"(%[a-z]+)(\d+)\b", rename, text)
        text = re.sub(r"^\.reg .*$", ".reg", text, flags=re.M)
    return text


def ptx_verdict(before: str, after: str) -> str:
    """same: identical (line info aside); regs: identical once registers are numbered in order of appearance; order:
    the same instructions in the same order, registers aside (two registers numbered the other way round); else
    DIFFERENT."""
    if normalize_ptx(before) == normalize_ptx(after):
        return "same"
    if normalize_ptx(before, renumber=True) == normalize_ptx(after, renumber=True):
        return "regs"
    if normalize_ptx(before, mask=True) == normalize_ptx(after, mask=True):
        return "masked"
    return "DIFFERENT"


def sass_count(cubin: bytes, cuobjdump: str) -> int:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    return sum(1 for line in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+\S", line))


def worker(tree: str, labels: list[str], out: str, sass: bool) -> None:
    if not sass:
        # PTX alone: NVRTC's compile_kernel also runs ptxas for the resource report of a PTX target, which this
        # comparison does not read; skipping it halves the time. Its stand-in log must not reach the shared cache.
        os.environ["TRTFUSE_CACHE"] = os.path.join(tempfile.gettempdir(), "trtfuse-compare-ptx-only")
    import_tree(Path(tree))
    if not sass:
        from trtfuse.plugins import nvrtc

        real = nvrtc.compile_kernel

        def ptx_only(source, defines, arch="sm_90", target="cubin", use_cache=True, *rest, **kw):
            if target == "cubin":
                return nvrtc.CompiledKernel(b"", "cubin", arch, "", {})
            return real(source, defines, arch, target, use_cache, *rest, **kw)

        nvrtc.compile_kernel = ptx_only
    chosen = [(label, t) for label, t in variants() if label in labels]
    result = {}
    for label, tactic in chosen:
        entry = {"ptx": compile_variant(tactic, "ptx").decode(errors="replace").rstrip("\x00")}
        if sass:
            (Path(out).parent / f"{Path(out).stem}-{label.replace(' ', '_')}.cubin").write_bytes(compile_variant(tactic, "cubin"))
        result[label] = entry
    Path(out).write_text(json.dumps(result))


def with_sass(label: str) -> bool:
    """SASS for the table's tactics and the chain builds, the ones that run; the profiling builds' PTX alone says they
    are unchanged."""
    return label.startswith(("table", "chain"))


def run_side(tree: Path, labels: list[str], workdir: Path, name: str, jobs: int, sass: bool) -> dict:
    result = {}
    for kind in (True, False):
        group = [l for l in labels if with_sass(l) == kind]
        procs = []
        for i in range(jobs):
            out = workdir / f"{name}{i}{'s' if kind else 'p'}.json"
            cmd = [sys.executable, __file__, "--worker", str(tree), str(out), json.dumps(group[i::jobs])]
            procs.append((out, subprocess.Popen(cmd + (["--sass"] if sass and kind else []))))
        for out, p in procs:
            if p.wait() != 0:
                raise SystemExit(f"{name} side failed (exit {p.returncode})")
            result.update(json.loads(out.read_text()))
    return result


def list_labels(tree: Path) -> list[str]:
    code = f"import sys; sys.path.insert(0, {str(REPO / 'scripts')!r}); import compare_kernel_code as c; " \
           f"c.import_tree(__import__('pathlib').Path({str(tree)!r})); print('\\n'.join(l for l, _ in c.variants()))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="main", help="the revision to compare against (default: main)")
    ap.add_argument("--only", default="", help="comma-separated labels ('table w70,diag1 t60')")
    ap.add_argument("--no-sass", action="store_true", help="PTX only (no cubins, no instruction counts)")
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", help="write the table here too")
    ap.add_argument("--dump", help="write each differing variant's normalized PTX, before and after, into this folder")
    args = ap.parse_args()
    sass = not args.no_sass
    with tempfile.TemporaryDirectory(prefix="trtfuse-compare-") as tmp:
        tmp = Path(tmp)
        # One folder per base commit, kept: the compile cache keys on the include path, so the next run's base side
        # is read from the cache instead of compiled again
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", args.base], capture_output=True, text=True, check=True).stdout.strip()
        base_tree = Path(tempfile.gettempdir()) / f"trtfuse-compare-base-{commit[:12]}"
        if not base_tree.exists():
            staging = Path(tempfile.mkdtemp(prefix="trtfuse-compare-base-"))
            archive = subprocess.run(["git", "-C", str(REPO), "archive", commit], capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(staging)], input=archive, check=True)
            staging.rename(base_tree)
        after_labels = list_labels(REPO)
        base_labels = set(list_labels(base_tree))
        labels = [l for l in after_labels if l and l in base_labels]
        if args.only:
            wanted = set(args.only.split(","))
            labels = [l for l in labels if l in wanted]
        missing = sorted((base_labels - set(after_labels)) - {""})
        before = run_side(base_tree, labels, tmp, "before", args.jobs, sass)
        after = run_side(REPO, labels, tmp, "after", args.jobs, sass)
        rows = []
        for label in labels:
            b, a = before[label]["ptx"], after[label]["ptx"]
            ptx = ptx_verdict(b, a)
            if ptx == "DIFFERENT" and args.dump:
                Path(args.dump).mkdir(parents=True, exist_ok=True)
                for side, text in (("before", b), ("after", a)):
                    (Path(args.dump) / f"{label.replace(' ', '_')}.{side}.ptx").write_text(normalize_ptx(text, renumber=True))
            row = {"variant": label, "ptx": ptx}
            if sass and with_sass(label):
                key = label.replace(" ", "_")
                for side in ("before", "after"):
                    cubin = next(tmp.glob(f"{side}?s-{key}.cubin"))
                    row[f"sass_{side}"] = sass_count(cubin.read_bytes(), args.cuobjdump)
            rows.append(row)
    width = max(len(r["variant"]) for r in rows)
    print(f"{'variant':{width}}  ptx        sass before  sass after  change")
    for r in rows:
        counts = ""
        if "sass_before" in r:
            change = (r["sass_after"] - r["sass_before"]) / r["sass_before"] * 100
            counts = f"{r['sass_before']:11d}  {r['sass_after']:10d}  {change:+5.1f} %"
        print(f"{r['variant']:{width}}  {r['ptx']:9}  {counts}")
    differing = [r["variant"] for r in rows if r["ptx"] == "DIFFERENT"]
    print(f"{len(rows)} variants, PTX identical (line info aside) in {sum(r['ptx'] == 'same' for r in rows)}, "
          f"identical up to register numbers in {sum(r['ptx'] == 'regs' for r in rows)}, the same instructions with "
          f"registers masked in {sum(r['ptx'] == 'masked' for r in rows)}, different in {len(differing)}"
          + (f"; only in the base: {', '.join(missing)}" if missing else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    sys.exit(1 if differing else 0)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], json.loads(sys.argv[4]), sys.argv[3], "--sass" in sys.argv[5:])
    else:
        main()
