#!/usr/bin/env bash
# Run 100 (#48): the conversation recipe's real loop again, six workers twice (A B A B: the run-to-run spread and
# eager's own loss floor) and four once; one run at a time.
set +e
export LOGS=/tmp/dl_conv2
source scripts/device_lib.sh
prologue
{ echo "nproc $(nproc)"; } >> "$LOGS/gpu.txt"
export BRIDGE_CUDAGRAPH_CACHE=/tmp/c_conv
R a_real_loop_w6x2 330 "python3 -m benchmarks.real_loop recipes/tiny_qwen3_vl_conversations.yaml --iters 30 --workers 6 --repeats 2 --out \$LOGS/real_loop_w6x2 --timeout 120 --port 29720"
R b_real_loop_w4 200 "python3 -m benchmarks.real_loop recipes/tiny_qwen3_vl_conversations.yaml --iters 30 --workers 4 --out \$LOGS/real_loop_w4 --timeout 95 --port 29730"
cat "$LOGS"/real_loop_w*/real_loop.md
table
