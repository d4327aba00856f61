"""Benchmark harness shared by every bench/bench_<area>.py.

Timing: each measurement runs `calls` back-to-back calls between two device events (rotating through
input sets whose total size exceeds the L2 cache several times, so every call reads from HBM), and
reports the median per-call time over `repeats` such measurements. Our kernels are timed twice on a
GPU: "dsv4ops" replays the calls from a CUDA graph (the device time of one launch, as in a serving
stack that captures its decode step), "dsv4ops back-to-back" issues them from Python (adds the host
cost of each call, which bounds small calls). Peers are timed back-to-back: the references synchronize
with the host and cannot be captured. The ceiling (device copy bandwidth,
bytes read + written) is measured in the same run. Every row names its peers and the speedup over each.
Outputs: markdown table, JSON lines and (where matplotlib is installed) a PNG bar chart.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import statistics
import time
from typing import Callable, Dict, List, Sequence

import torch

L2_BYTES = 60 * 2**20  # H200; rotation targets a multiple of this


@dataclasses.dataclass
class Row:
    op: str
    case: str  # DSv4 block and size, e.g. "wo_a Flash [8192,4096]"
    impl: str
    time_us: float
    bytes_moved: int
    gbps: float
    pct_of_copy: float
    speedups: Dict[str, float]  # peer impl -> peer time / this time (only on the dsv4ops row)


def synchronize(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_per_call(fn: Callable, arg_sets: Sequence[tuple], device: torch.device, repeats: int = 15,
                  min_calls: int = 10, target_seconds: float = 0.02) -> float:
    """Median seconds per call of fn(*args), args rotating through arg_sets."""
    for args in arg_sets:  # warm up (and compile, for torch.compile peers)
        fn(*args)
    synchronize(device)
    start = time.perf_counter()
    fn(*arg_sets[0])
    synchronize(device)
    single = max(time.perf_counter() - start, 1e-6)
    calls = max(min_calls, min(2000, int(target_seconds / single)))
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            for i in range(calls):
                fn(*arg_sets[i % len(arg_sets)])
            end.record()
            end.synchronize()
            samples.append(begin.elapsed_time(end) / 1e3 / calls)
        else:
            t0 = time.perf_counter()
            for i in range(calls):
                fn(*arg_sets[i % len(arg_sets)])
            samples.append((time.perf_counter() - t0) / calls)
    return statistics.median(samples)


def time_graph_replay(fn: Callable, arg_sets: Sequence[tuple], device: torch.device, seconds_hint: float,
                      repeats: int = 15, target_seconds: float = 0.002) -> float:
    """Median seconds per call of fn(*args) replayed from one CUDA graph that holds `calls` calls."""
    calls = max(len(arg_sets), min(1000, int(target_seconds / max(seconds_hint, 1e-7))))
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for args in arg_sets:
            fn(*args)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(*arg_sets[i % len(arg_sets)])
    graph.replay()
    synchronize(device)
    samples = []
    for _ in range(repeats):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(begin.elapsed_time(end) / 1e3 / calls)
    del graph
    return statistics.median(samples)


OURS = "dsv4ops"


def time_ours(fn: Callable, arg_sets: Sequence[tuple], device: torch.device) -> Dict[str, float]:
    """Our kernel's rows: graph replay (GPU only) and back-to-back calls."""
    back_to_back = time_per_call(fn, arg_sets, device)
    if device.type != "cuda":
        return {OURS: back_to_back}
    return {OURS: time_graph_replay(fn, arg_sets, device, back_to_back), f"{OURS} back-to-back": back_to_back}


def time_matched_copy(nbytes: int, device: torch.device) -> Dict[str, float]:
    """A device copy moving the same bytes (nbytes/2 read + nbytes/2 written), timed like our kernels: the
    ceiling at this size, where launch and latency weigh more than at the 1 GiB of the headline ceiling."""
    half = max(nbytes // 2, 1)
    sets = input_sets(lambda: (torch.empty(half, dtype=torch.uint8, device=device),
                               torch.empty(half, dtype=torch.uint8, device=device)), nbytes, device)
    copy = lambda src, dst: dst.copy_(src)  # noqa: E731
    back_to_back = time_per_call(copy, sets, device)
    seconds = time_graph_replay(copy, sets, device, back_to_back) if device.type == "cuda" else back_to_back
    return {COPY_PEER: seconds}


COPY_PEER = "device copy of the same bytes"
FAILED_PEERS: Dict[str, str] = {}
# Lines a bench adds to the output header while it runs (a ceiling it measured, a row it could not time).
HEADER_NOTES: List[str] = []


def time_peer(times: Dict[str, float], name: str, fn: Callable, arg_sets: Sequence[tuple], device: torch.device,
              case: str = ""):
    """Times a peer into times[name]; a peer that fails to run (e.g. a torch.compile error) is reported in
    the output header instead of aborting the run."""
    try:
        times[name] = time_per_call(fn, arg_sets, device)
    except Exception as error:  # noqa: BLE001 - any failure of a peer is reported, not fatal
        first_line = (str(error).splitlines() or [""])[0][:200]
        FAILED_PEERS[f"{name}' on '{case}" if case else name] = f"{type(error).__name__}: {first_line}"


def input_set_count(bytes_per_call: int, device: torch.device) -> int:
    """How many independent input sets cover 4x the L2 (at least 2, at most 64: calls of under L2_BYTES / 64,
    ~1 MB, are then timed with their inputs in the L2, as the results' header says)."""
    count = 2 if device.type != "cuda" else max(2, math.ceil(4 * L2_BYTES / max(bytes_per_call, 1)))
    return min(count, 64)


def input_sets(make: Callable[[], tuple], bytes_per_call: int, device: torch.device) -> List[tuple]:
    """Enough independent input sets to cover 4x the L2 (see input_set_count for the smallest calls)."""
    return [make() for _ in range(input_set_count(bytes_per_call, device))]


def copy_bandwidth_gbps(device: torch.device, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy rate, counting bytes read plus bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = time_per_call(lambda: dst.copy_(src), [()], device, repeats=10, min_calls=5)
    return 2 * nbytes / seconds / 1e9


def make_rows(op: str, case: str, bytes_moved: int, times: Dict[str, float], ours: str, ceiling_gbps: float):
    """One row per impl; the rows of `ours` (its graph-replayed and back-to-back timings) carry the speedup
    over every peer."""
    rows = []
    for impl, seconds in times.items():
        gbps = bytes_moved / seconds / 1e9
        is_ours = impl.startswith(ours)
        speedups = {peer: t / seconds for peer, t in times.items() if not peer.startswith(ours)} if is_ours else {}
        rows.append(Row(op, case, impl, seconds * 1e6, bytes_moved, gbps, 100 * gbps / ceiling_gbps, speedups))
    return rows


def bench_main(description: str, area: str, benches: Sequence[Callable], shrink: Callable[[], None],
               extra_header: Sequence[str] = ()):
    """The command line every bench_<area>.py shares: --device, --out, --no-compile, --smoke (calls
    `shrink` to cut the sizes). Each bench is bench(device, ceiling_gbps, compile_peers) -> rows."""
    import argparse
    import platform as host_platform

    import dsv4ops

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results"))
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile peers")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: check that the script runs")
    args = parser.parse_args()
    if args.smoke:
        shrink()
    device = torch.device(args.device)
    ceiling = copy_bandwidth_gbps(device, 1 << 30 if device.type == "cuda" else 1 << 26)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else host_platform.processor() or "cpu"
    header = [
        f"device: {name} ({dsv4ops.device_arch(device)}); dsv4ops {dsv4ops.__version__}; torch {torch.__version__}",
        f"ceiling: device copy bandwidth {ceiling:.0f} GB/s (read + write, measured in this run)",
        "time: median per call between device events; inputs rotated over 4x the L2 or 64 input sets, whichever"
        " is less (calls of under ~1 MB then run from a warm L2); 'dsv4ops' = calls replayed from a CUDA graph,"
        " 'back-to-back' = calls issued from Python (peers: back-to-back)",
        *extra_header,
    ]
    print("\n".join(header))
    rows = []
    for bench in benches:
        rows += bench(device, ceiling, not args.no_compile)
    title = f"{area}_{device.type}"
    write_outputs(rows, pathlib.Path(args.out), title, header)
    print((pathlib.Path(args.out) / f"{title}.md").read_text())


def write_outputs(rows: List[Row], out_dir: pathlib.Path, title: str, header_lines: Sequence[str]):
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / title
    with open(f"{stem}.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(dataclasses.asdict(row)) + "\n")
    failed = [f"peer '{name}' could not run: {why}" for name, why in FAILED_PEERS.items()] + HEADER_NOTES
    lines = [f"# {title}", ""] + [f"- {line}" for line in list(header_lines) + failed] + [""]
    lines.append("| op | case | impl | time (us) | GB/s | % of copy BW | speedup over peers |")
    lines.append("|---|---|---|---:|---:|---:|---|")
    for r in rows:
        speed = ", ".join(f"{v:.1f}x vs {k}" for k, v in r.speedups.items())
        lines.append(f"| {r.op} | {r.case} | {r.impl} | {r.time_us:.1f} | {r.gbps:.0f} | {r.pct_of_copy:.1f} | {speed} |")
    pathlib.Path(f"{stem}.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no PNG written")
        return
    labels = [f"{r.op}\n{r.case}\n{r.impl}" for r in rows]
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(rows) + 1.5))
    ax.barh(range(len(rows)), [r.pct_of_copy for r in rows], color=["C0" if r.speedups else "C7" for r in rows])
    ax.set_yticks(range(len(rows)), labels, fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("% of measured device copy bandwidth")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(f"{stem}.png", dpi=120)
