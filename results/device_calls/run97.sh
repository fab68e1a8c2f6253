#!/usr/bin/env bash
# Run 97 (2026-12-05, eighth session, H100, warm after run 96): the outside-memory stages again, unbound and shared
# (run 95's unbound mode stopped on the draft's own benchmark arguments; the benchmark part is left out here, runs 95
# and 96 ran the benchmark with the unbound world). .snap/outside_memory_draft.py is
# results/device_calls/outside_memory_draft.py with its benchmark branch switched off by the sed below.
sed -i 's/^if mode == "unbound":/if mode == "unbound-with-benchmark":/' .snap/outside_memory_draft.py
export PYTHONPATH=$PWD
for m in unbound shared; do
  timeout 80 python3 .snap/outside_memory_draft.py $m /tmp/o_$m 2>&1 | grep "^\[outside\]"
done | tee "$OUT/outside_stages.txt"
