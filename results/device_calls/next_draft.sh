#!/usr/bin/env bash
# Draft of the next session's device calls (not yet run), what runs 87-89 left (results/gpu-suites/run87,
# results/padded-gradients/run89). In the order they decide things, each under the 600 s call limit:
#   C  the packed MoE branch's suites (#47; about 6 min): if they pass, merge moe-packed into main here, no GPU needed
#   all_suites_draft.sh at that final commit (every one-GPU suite, about 7 min; add test_packed_moe.py's lane)
#   A  the 2B padded ladder and the step-loss floor (#46; about 9 min, alone)
#   D  the 30B-A3B layer shape under an 80 GiB cap (#47; about 5 min, alone)
#   B  teardown, the deterministic photo train, module_path (#50) where time is left
# Copy this to .snap/ (results/ stays home: the call's 64 MiB), then
#   bash .devwheels/install.sh >/dev/null 2>&1; bash .snap/next_draft.sh C    (C and D from the branch's archive, made
#     first: git archive --format=tar.gz -o .snap/moe-packed.tgz moe-packed -- . ':(exclude)results')
set +e
export LOGS=/tmp/dl_next_$1
source scripts/device_lib.sh
prologue
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=8'
case "$1" in
A)  # #46 to its end: the padded ladder beside megatron-core's helper (the measured reason for one engine or two), the
    # step-loss floor (eager_padded_repeat, which run 89 did not reach), ours_packed's gradients, 17 steps, alone.
    R a_ut_2b 560 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut --model small --seq 4096 --mbs 2 --num-mb 2 --steps 17 --warmup 3 --profile-steps 0 --no-paired --no-control --variants eager_packed,eager_padded,ours_padded,ours_padded_megatron,eager_padded_repeat,ours_packed"
    sed -n '/^| variant/,/^$/p' "$LOGS/ut/useful_tokens.md" | cut -c1-330 ;;
B)  # The corrected 4096-patch claim (run 89 lost it to a port in use), teardown with fewer lanes beside it (it timed
    # out at 400 s under six in run 87), #50's module path (now through sys.monitoring), the deterministic vision
    # ladder of the photo recipe through train (det_vision_draft.sh's step).
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1
      R b_teardown 480 "BRIDGE_CUDAGRAPH_LOGS=\$LOGS/teardown BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_teardown.json $PYT tests/gpu/test_teardown.py" ) &
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c2 NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
      R c_reference_det 200 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_reference_det.json $PYT tests/gpu/test_bridge_reference.py"
      R d_train_det 240 "MASTER_ADDR=127.0.0.1 MASTER_PORT=29671 python3 -m bridge_cudagraph train recipes/tiny_qwen3_vl_photos.yaml train.train_iters=12" ) &
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c3
      R e_module_path 240 "MASTER_ADDR=127.0.0.1 MASTER_PORT=29681 python3 -m benchmarks.module_path recipes/tiny_qwen3_vl_photos.yaml --out \$LOGS/module_path train.train_iters=6" ) &
    wait
    grep -H " passed\| failed\| error" "$LOGS"/*.log | grep -v "PASSED\|FAILED" | cut -c1-200
    grep -h "capture failed\|eager fallbacks" "$LOGS/d_train_det.log" | cut -c1-250 | tail -4
    cat "$LOGS/module_path/module_path.json" | head -12 ;;
C)  # #47: the packed MoE branch in its second form (each MoE layer's attention graphed, the rest of the layer eager on
    # the micro-batch's own rows), from its archive under /tmp/moe: its suite under deterministic kernels (is it
    # Bridge's step bit for bit now?) and then without, beside the MoE recipe through Bridge's loop (it packs now).
    # Lane limits: run 87 took 110 s for the suite and 247 s for the loop under six lanes.
    mkdir -p /tmp/moe && tar -xzf .snap/moe-packed.tgz -C /tmp/moe && cp -r .whl /tmp/moe/ 2>/dev/null
    cd /tmp/moe && export PYTHONPATH=/tmp/moe
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c4
      R c_moe_packed_det 220 "NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_moe_packed_det.json $PYT tests/gpu/test_packed_moe.py"
      R c_moe_packed 180 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_moe_packed.json $PYT tests/gpu/test_packed_moe.py" ) &
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c5
      R c_moe_loop 420 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_moe_loop.json $PYT tests/gpu/test_bridge_loop.py -k moe" ) &
    wait
    grep -H " passed\| failed\| error" "$LOGS"/*.log | grep -v "PASSED\|FAILED" | cut -c1-200 ;;
D)  # #47: the issue's 30B-A3B layer shape under an 80 GiB cap, alone (memory and speed are claimed), from the branch's
    # archive (or main, once merged).
    mkdir -p /tmp/moe && tar -xzf .snap/moe-packed.tgz -C /tmp/moe && cp -r .whl /tmp/moe/ 2>/dev/null
    cd /tmp/moe && export PYTHONPATH=/tmp/moe
    R d_30b_shape_80g 540 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut_30b --model moe-30b-a3b-shape \
      --variants eager_packed,ours_packed,ours_padded --no-paired --no-control --steps 4 --profile-steps 0 --gpu-memory 80" ;;
esac
table
