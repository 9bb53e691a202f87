"""Retrieval throughput benchmark: comments/s and peak memory.

Generates Reddit-like comment dumps (NDJSON, zstandard) in a temporary directory and runs
``rbjax.data.retrieval.run.retrieve`` with the five packaged bias specifications in one pass,
each run in a fresh subprocess so that its peak RSS is its own.

* Comment objects carry the field set of the 2019+ monthly dumps (~1 KB a line).
* Bodies are real Reddit responses (``../shared/dialogpt-6k/human.ref.6k.txt``, 1 to 3
  joined); when that file is absent a small built-in vocabulary is used. 1% of the
  comments get a planted "<query> ... <attribute>" sentence so that matching does real work.
* Sizes: 250k and 1M comments by default (memory must be flat in dump size), plus 100k with
  the prefilter off and 250k compressed with a 2 GiB window like the real monthly dumps
  (``zstd --long=31``: the decoder then holds up to 2 GiB of history, whatever the code does).
* Peak memory is the child's own ``VmHWM`` (``ru_maxrss`` would include the parent's RSS).

* Many files: ``--files`` dumps of ``--file-size`` comments, compressed with 2 GiB
  windows like the monthly dumps, read with 1 and 2 local jobs and on a local Ray cluster
  (2 CPUs, started before the clock starts), in interleaved rounds; the best round of each
  is reported, with the scaling efficiency (rate with 2 jobs / rate with 1 job / 2), each
  worker's peak RSS (``VmHWM``, from the run's per-file records) and a check that all runs
  wrote byte-identical candidates.

Usage::

    python benchmarks/bench_retrieval.py [--sizes 250000 1000000] [--keep DIR]
    python benchmarks/bench_retrieval.py --only-parallel [--files 4 --file-size 250000 --no-ray]

The last line printed is a JSON object with the figures. Every timed retrieval is a section of the load monitor
(``benchmarks/_common.py``; the child processes are its own tree): the foreign CPU of each is in ``"load"``, and the
multi-file ratios (``speedup_2_jobs``, ``efficiency_2_jobs``, ``cpu_efficiency_2_jobs``, ``speedup_ray_2_cpus``) are
under ``"ratios"``, or ``"void_ratios"`` (printed VOID) when the machine had foreign CPU load during those runs.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks._common import LoadMonitor  # noqa: E402

SHARED = Path(os.environ.get("RBJAX_SHARED", ROOT.parent / "shared"))
BIAS_TYPES = ("religion1", "religion2", "race", "gender", "queerness")
FALLBACK_VOCAB = (
    "the a and to of i you it is that in this for was on with but not be have are just like "
    "my so they what if do can at all would your me an one get think people about out time "
    "good really more from or know will how when there up no even game also much make see "
    "because them some only he we then want who well way thing over still going right year"
).split()


def _bodies(rng: random.Random):
    ref = SHARED / "dialogpt-6k" / "human.ref.6k.txt"
    if ref.is_file():
        lines = [ln.strip() for ln in ref.read_text(encoding="utf-8").splitlines() if ln.strip()]
    else:
        lines = [" ".join(rng.choice(FALLBACK_VOCAB) for _ in range(rng.randint(3, 30))) for _ in range(5000)]
    return lines


def _planted(rng: random.Random, specs):
    spec = rng.choice(specs)
    q = rng.choice(spec.queries)
    a = rng.choice(spec.attributes_a1).replace("*", "").replace('"', "")
    return f"I really think {q.title()} so {a} and that is it"


def generate(path: Path, n: int, seed: int = 0, window_log: int | None = None) -> dict:
    """Write ``n`` comment objects to ``path`` (.zst, level 3; ``window_log=31`` like the monthly dumps)."""
    from rbjax.data.dumps import write_zst
    from rbjax.specs import load_spec

    rng = random.Random(seed)
    bodies = _bodies(rng)
    specs = [load_spec(b) for b in BIAS_TYPES]
    subs = ["AskReddit", "politics", "worldnews", "gaming", "funny", "news", "pics", "soccer", "nba", "movies"]
    t_base = 1561939200  # 2019-07-01

    def records():
        for i in range(n):
            k = rng.random()
            body = rng.choice(bodies)
            if k < 0.35:
                body = body + " " + rng.choice(bodies)
            if k < 0.10:
                body = body + "\n\n" + rng.choice(bodies) + " https://www.example.com/some/path?x=1"
            if rng.random() < 0.01:
                body = _planted(rng, specs) if rng.random() < 0.5 else body + ". " + _planted(rng, specs)
            cid = f"f{i:07x}"
            sub = rng.choice(subs)
            author = f"user_{rng.randrange(10**6)}"
            yield {
                "all_awardings": [], "associated_award": None, "author": author,
                "author_created_utc": t_base - rng.randrange(10**8), "author_flair_background_color": None,
                "author_flair_css_class": None, "author_flair_richtext": [], "author_flair_template_id": None,
                "author_flair_text": None, "author_flair_text_color": None, "author_flair_type": "text",
                "author_fullname": f"t2_{rng.randrange(36**6):x}", "author_patreon_flair": False,
                "author_premium": False, "awarders": [], "body": body, "collapsed_because_crowd_control": None,
                "created_utc": t_base + i * 2, "gildings": {}, "id": cid, "is_submitter": False,
                "link_id": f"t3_c{rng.randrange(36**5):x}", "locked": False, "no_follow": True,
                "parent_id": f"t1_e{rng.randrange(36**6):x}",
                "permalink": f"/r/{sub}/comments/c{rng.randrange(36**5):x}/some_thread_title/{cid}/",
                "retrieved_on": t_base + 10**6, "score": rng.randint(-5, 100), "send_replies": True,
                "stickied": False, "subreddit": sub, "subreddit_id": "t5_2qh1i", "total_awards_received": 0,
                "treatment_tags": [],
            }

    t0 = time.perf_counter()
    write_zst(records(), path, level=3, window_log=window_log)
    return {"comments": n, "compressed_bytes": path.stat().st_size, "window_log": window_log,
            "generate_seconds": time.perf_counter() - t0}


CHILD = r"""
import json, resource, sys, time

def peak_rss_mib():
    # VmHWM: this process's own peak. ru_maxrss would also count the parent's RSS at fork
    # time (Linux carries it over exec), which is the benchmark generator's, not ours.
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

sys.path.insert(0, {root!r})
from rbjax.data.retrieval.run import retrieve
from rbjax.specs import load_spec
specs = [load_spec(b) for b in {types!r}]
t0 = time.perf_counter(); c0 = time.process_time()
res = retrieve(specs, {dump!r}, {out!r}, progress=False, prefilter={prefilter!r})
wall = time.perf_counter() - t0; cpu = time.process_time() - c0
print(json.dumps({{"lines": res.stats.lines, "wall_s": wall, "cpu_s": cpu,
    "comments_per_s": res.stats.lines / wall, "comments_per_cpu_s": res.stats.lines / cpu,
    "parsed": res.stats.parsed, "prefiltered": res.stats.prefiltered,
    "candidates": sum(res.candidates.values()), "per_type": res.candidates,
    "peak_rss_mib": peak_rss_mib()}}))
"""


def run_child(dump: Path, outdir: Path, prefilter: bool = True) -> dict:
    # each run its own output folder: retrieve refuses to replace outputs another run (other settings) wrote
    out = outdir / f"out-{dump.stem.split('.')[0]}-{'prefilter' if prefilter else 'no-prefilter'}"
    code = CHILD.format(root=str(ROOT), types=BIAS_TYPES, dump=str(dump), out=str(out / "{bias}.csv"),
                        prefilter=prefilter)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"the retrieval child failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


PAR_CHILD = r"""
import json, sys, time
sys.path.insert(0, {root!r})
from rbjax.data.retrieval.run import retrieve
from rbjax.data.retrieval.scan import peak_rss_mib
from rbjax.specs import load_spec
executor, jobs = {executor!r}, {jobs!r}
if executor == "ray":
    import ray
    t = time.perf_counter()
    ray.init(num_cpus={ray_cpus!r}, include_dashboard=False, log_to_driver=False)
    ray_start = time.perf_counter() - t
specs = [load_spec(b) for b in {types!r}]
t0 = time.perf_counter()
res = retrieve(specs, {dumps!r}, {out!r}, progress=False, jobs=jobs, executor=executor, resume=False)
wall = time.perf_counter() - t0
files = res.files
out = {{"executor": executor, "jobs": res.jobs, "files": len(files), "lines": res.lines_read, "wall_s": wall,
       "comments_per_s": res.lines_read / wall,
       "cpu_s_workers": sum(f["cpu_seconds"] for f in files),
       "comments_per_cpu_s": res.lines_read / sum(f["cpu_seconds"] for f in files),
       "candidates": sum(res.candidates.values()),
       "worker_peak_rss_mib": max(f["worker"]["peak_rss_mib"] or 0 for f in files),
       "workers": sorted({{(f["worker"]["host"], f["worker"]["pid"]) for f in files}}).__len__(),
       "driver_peak_rss_mib": peak_rss_mib()}}
if executor == "ray":
    out["ray_start_s"] = ray_start
    ray.shutdown()
print(json.dumps(out))
"""


def run_parallel(dumps: list[Path], outdir: Path, executor: str, jobs, ray_cpus: int = 2) -> dict:
    """One multi-file retrieval in a fresh process; Ray (if any) is started before the clock starts."""
    code = PAR_CHILD.format(root=str(ROOT), types=BIAS_TYPES, dumps=[str(d) for d in dumps], out=str(outdir),
                            executor=executor, jobs=jobs, ray_cpus=ray_cpus)
    load0 = os.getloadavg()[0]
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"benchmark child failed:\n{p.stderr[-3000:]}")
    res = json.loads(p.stdout.strip().splitlines()[-1])
    res["load_avg_1min"] = [load0, os.getloadavg()[0]]  # before, after: how busy the machine was
    return res


def parallel_bench(base: Path, tmp: Path, n_files: int, n_per_file: int, ray: bool, rounds: int) -> dict:
    """Many files: ``n_files`` dumps (2 GiB windows like the monthly files) with 1 and 2 local jobs
    and on a local Ray cluster (2 CPUs); the candidates must be byte-identical across runs."""
    dumps = []
    for k in range(n_files):
        d = base / f"RC_par_{k}_{n_per_file}_long31.zst"
        if not d.exists():
            generate(d, n_per_file, seed=100 + k, window_log=31)
        dumps.append(d)
    configs = [("local", 1), ("local", 2)] + ([("ray", None)] if ray else [])
    runs, digests = [], set()
    for r in range(rounds):  # interleaved rounds: a busy neighbour hits every configuration alike
        for executor, jobs in configs:
            out = tmp / f"par_{executor}_{jobs}_{r}"
            res = run_parallel(dumps, out, executor, jobs)
            res["round"] = r
            digests.add(hashlib.sha256(b"".join(p.read_bytes() for p in sorted(out.glob("candidates_*.csv"))))
                        .hexdigest())
            runs.append(res)
            print(f"  round {r} {executor:5} jobs={res['jobs']}: {res['comments_per_s']:,.0f} comments/s wall, "
                  f"{res['comments_per_cpu_s']:,.0f} comments/CPU-s, worker peak RSS "
                  f"{res['worker_peak_rss_mib']:.0f} MiB, load {res['load_avg_1min'][0]:.1f}", file=sys.stderr)
    best = {}
    for res in runs:
        key = f"{res['executor']}_{res['jobs']}"
        if key not in best or res["comments_per_s"] > best[key]["comments_per_s"]:
            best[key] = res
    one = best["local_1"]["comments_per_s"]
    summary = {"files": n_files, "comments_per_file": n_per_file, "window_log": 31,
               "identical_outputs": len(digests) == 1, "runs": runs, "best": best,
               "speedup_2_jobs": best["local_2"]["comments_per_s"] / one,
               "efficiency_2_jobs": best["local_2"]["comments_per_s"] / one / 2,
               # work per CPU-second in each worker with 2 jobs vs 1: what scaling would be on idle cores
               "cpu_efficiency_2_jobs": best["local_2"]["comments_per_cpu_s"] / best["local_1"]["comments_per_cpu_s"]}
    if ray:
        summary["speedup_ray_2_cpus"] = best["ray_None"]["comments_per_s"] / one
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[250_000, 1_000_000])
    ap.add_argument("--no-prefilter-size", type=int, default=100_000,
                    help="also time this many comments with the prefilter off (0 = skip)")
    ap.add_argument("--long-window-size", type=int, default=250_000,
                    help="also time this many comments compressed with a 2 GiB window (zstd --long=31) (0 = skip)")
    ap.add_argument("--keep", type=Path, default=None, help="keep the generated dumps in this folder")
    ap.add_argument("--files", type=int, default=4, help="multi-file runs: dump files (0 = skip)")
    ap.add_argument("--file-size", type=int, default=250_000, help="multi-file runs: comments per file")
    ap.add_argument("--rounds", type=int, default=2, help="multi-file runs: interleaved rounds (best reported)")
    ap.add_argument("--no-ray", action="store_true", help="multi-file runs: skip the local Ray cluster")
    ap.add_argument("--only-parallel", action="store_true", help="only the multi-file runs")
    args = ap.parse_args(argv)
    if args.only_parallel:
        args.sizes, args.no_prefilter_size, args.long_window_size = [], 0, 0
    results = {"machine": f"{os.cpu_count()} CPU cores, no GPU; Python {sys.version.split()[0]}",
               "bias_types": list(BIAS_TYPES), "runs": []}
    mon = LoadMonitor()
    ratios = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = args.keep or Path(tmp)
        base.mkdir(parents=True, exist_ok=True)
        for n in args.sizes:
            dump = base / f"RC_bench_{n}.zst"
            gen = generate(dump, n) if not dump.exists() else {"comments": n, "compressed_bytes": dump.stat().st_size}
            with mon.section(f"retrieve {n}"):
                r = run_child(dump, Path(tmp))
            r.update(gen, prefilter=True)
            results["runs"].append(r)
            print(f"{n:>9,} comments: {r['comments_per_s']:,.0f} comments/s (wall), "
                  f"{r['comments_per_cpu_s']:,.0f} comments/CPU-s, peak RSS {r['peak_rss_mib']:.0f} MiB, "
                  f"{r['candidates']} candidates", file=sys.stderr)
        if args.no_prefilter_size:
            n = args.no_prefilter_size
            dump = base / f"RC_bench_{n}.zst"
            gen = generate(dump, n) if not dump.exists() else {"comments": n, "compressed_bytes": dump.stat().st_size}
            with mon.section(f"retrieve {n} prefilter off"):
                r = run_child(dump, Path(tmp), prefilter=False)
            r.update(gen, prefilter=False)
            results["runs"].append(r)
            print(f"{n:>9,} comments, prefilter off: {r['comments_per_s']:,.0f} comments/s, "
                  f"peak RSS {r['peak_rss_mib']:.0f} MiB", file=sys.stderr)
        if args.long_window_size:
            n = args.long_window_size
            dump = base / f"RC_bench_{n}_long31.zst"
            gen = (generate(dump, n, window_log=31) if not dump.exists()
                   else {"comments": n, "compressed_bytes": dump.stat().st_size, "window_log": 31})
            with mon.section(f"retrieve {n} 2 GiB window"):
                r = run_child(dump, Path(tmp))
            r.update(gen, prefilter=True)
            results["runs"].append(r)
            print(f"{n:>9,} comments, 2 GiB window: {r['comments_per_cpu_s']:,.0f} comments/CPU-s, "
                  f"peak RSS {r['peak_rss_mib']:.0f} MiB (the zstd window buffer)", file=sys.stderr)
        if args.files:
            print(f"{args.files} files x {args.file_size:,} comments (2 GiB windows), 1 and 2 jobs"
                  + ("" if args.no_ray else ", local Ray cluster (2 CPUs)") + ":", file=sys.stderr)
            with mon.section("multi-file rounds"):  # dumps generated first, inside: own CPU, not foreign
                par = parallel_bench(base, Path(tmp), args.files, args.file_size, not args.no_ray, args.rounds)
            results["parallel"] = par
            for k in ("speedup_2_jobs", "efficiency_2_jobs", "cpu_efficiency_2_jobs", "speedup_ray_2_cpus"):
                if k in par:
                    ratios[k] = par.pop(k)
            txt = {k: mon.ratio_text(v, spec=".0%" if "efficiency" in k else ".2f",
                                     unit="" if "efficiency" in k else "x", sections=["multi-file rounds"])
                   for k, v in ratios.items()}
            print(f"  2 jobs: {txt['speedup_2_jobs']} one job (efficiency {txt['efficiency_2_jobs']}, "
                  f"per CPU-second {txt['cpu_efficiency_2_jobs']})"
                  + ("" if args.no_ray else f"; Ray, 2 CPUs: {txt['speedup_ray_2_cpus']}")
                  + f"; outputs identical: {par['identical_outputs']}", file=sys.stderr)
    print(json.dumps(mon.finish(results, ratios, {k: ["multi-file rounds"] for k in ratios})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
