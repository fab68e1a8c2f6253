"""Each variant's own peak memory in run 66: its recorded peak minus what was allocated when it started.

The MoE models outlive the useful-tokens benchmark's teardown (each leaves about 13.6 GiB allocated on the 30B-A3B
shape, ``left_allocated_bytes``), so every later variant's recorded peak includes the earlier ones' leftovers. The
control (eager_packed_repeat, the same variant as eager_packed, run last) checks the subtraction.

    python3 results/run66/memory_own_peaks.py > results/run66/memory_own_peaks.txt
"""

import gzip
import json
from pathlib import Path

G = 2**30
HERE = Path(__file__).parent
print(__doc__.strip().splitlines()[0] + "\n")
for m in ("ut_moe_tiny", "ut_moe_30b"):
    d = json.load(gzip.open(HERE / m / "useful_tokens.json.gz"))
    print(m)
    head = ("variant", "tok/s", "at start", "peak alloc", "own alloc", "peak resv", "own resv")
    print(f"  {head[0]:>20s} " + " ".join(f"{h:>10s}" for h in head[1:]) + "  (GiB)")
    for v, r in d["variants"].items():
        if "peak_memory_bytes" not in r:
            continue
        s = r["allocated_at_start_bytes"]
        peak, resv = r["peak_memory_bytes"], r["peak_reserved_bytes"]
        cells = (f"{r['useful_tokens_per_s']:.0f}", *(f"{b / G:.1f}" for b in (s, peak, peak - s, resv, resv - s)))
        print(f"  {v:>20s} " + " ".join(f"{c:>10s}" for c in cells))
