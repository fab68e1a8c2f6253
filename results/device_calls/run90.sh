#!/usr/bin/env bash
# Draft of the next session's device calls (not yet run), what runs 87-89 left (results/gpu-suites/run87,
# results/padded-gradients/run89). The session of 2026-12-05 (fifth) got no machine: 19 calls started none and spent its
# 1,800 s down to 209 s (a try that starts nothing costs 90-180 s, a refusal inside the wait window 15 s); its
# continuation, the sixth, was refused a start with the 210 s left. So the first call decides the most:
#   S  every one-GPU suite from branch moe-packed checked out (main is its ancestor: a pass makes it main's final
#      commit by fast-forward), the packed MoE suite with and without deterministic kernels, the deterministic photo
#      train, and on an H200 #46's 2B gradients beside them (speeds not claimed); lanes balanced on run 87's times
#      (about 9.5 min: alone in its call)
#   C  (when less than about 5 min of device time is left) only the packed MoE suites and the MoE loop, from the
#      branch's archive: the branch's open question, whose answer every later call depends on
#   A  the 2B benchmark alone (#46's speeds, ours_padded_megatron and ours_packed; about 9 min)
#   D  the 30B-A3B layer shape under an 80 GiB cap (#47; about 5 min, alone)
#   B  teardown, module_path (#50) where time is left
# Copy this to .snap/ and keep results/ out of the call (the staged stack and the tree are over the call's 64 MiB with
# it): `git rm -r --cached -q results; echo /results/ >> .git/info/exclude`, undone after the call with
# `git reset -q -- results` and that line removed. Then
#   bash .devwheels/install.sh >/dev/null 2>&1; bash .snap/next_draft.sh S    (C and D from the branch's archive, made
#     first: git archive --format=tar.gz -o .snap/moe-packed.tgz moe-packed -- . ':(exclude)results')
set +e
export LOGS=/tmp/dl_next_$1
source scripts/device_lib.sh
prologue
PYT='python3 -m pytest -q -rA -p no:cacheprovider --durations=8'
case "$1" in
S)  # Drafted for the 779 s left after ten tries (never started): seven lanes from the branch's tree, its
    # all_suites_draft.sh's lanes rebalanced for the three added ones (a change to a suite's lane belongs in both).
    DET=NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
    # Lane 7 only where the card has the H200's memory (an 80 GiB H100 holds the 2B variants but not beside six lanes).
    [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -gt 100000 ] && ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c7
      R l7_ut_2b 500 "python3 -m benchmarks.useful_tokens --out \$LOGS/ut --model small --seq 4096 --mbs 2 --num-mb 2 --steps 17 --warmup 3 --profile-steps 0 --no-paired --no-control --variants eager_packed,eager_padded,ours_padded,eager_padded_repeat" ) &
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1
      R l1_bridge_loop 450 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_bridge_loop.json $PYT tests/gpu/test_bridge_loop.py -k 'not moe'"
      R l1_faults 100 "$PYT tests/gpu/test_faults.py" ) &
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c2
      R l2_bridge_loop_moe 400 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_bridge_loop_moe.json $PYT tests/gpu/test_bridge_loop.py -k moe"
      R l2_optimizer 150 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_optimizer.json $PYT tests/gpu/test_optimizer_host_step.py tests/gpu/test_optimizer_graph.py" ) &
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c3
      R l3_run_sh 150 "MASTER_ADDR=127.0.0.1 MASTER_PORT=29641 bash scripts/run.sh"
      R l3_moe_packed_det 220 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_moe_packed_det.json $PYT tests/gpu/test_packed_moe.py"
      R l3_moe_packed 150 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_moe_packed.json $PYT tests/gpu/test_packed_moe.py" ) &
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c4
      R l4_language 250 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_language.json $PYT tests/gpu/test_language_capture.py tests/gpu/test_plan_helpers.py"
      R l4_vision 220 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_vision.json $PYT tests/gpu/test_vision_capture.py" ) &
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c5
      R l5_packed_det 300 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_packed_det.json $PYT tests/gpu/test_packed_language.py"
      R l5_reference_det 200 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_reference_det.json $PYT tests/gpu/test_bridge_reference.py" ) &
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c6 $DET
      R l6_train_photos_det 200 "MASTER_ADDR=127.0.0.1 MASTER_PORT=29671 python3 -m bridge_cudagraph train recipes/tiny_qwen3_vl_photos.yaml train.train_iters=12"
      R l6_vision_padding_det 120 "$DET BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_vision_padding_det.json $PYT tests/gpu/test_vision_padding.py" ) &
    wait
    grep -H " passed\| failed\| error" "$LOGS"/l*.log | grep -v "PASSED\|FAILED" | cut -c1-200
    grep -h "^FAILED\|^ERROR\|^E  " "$LOGS"/l*.log | cut -c1-300 | head -30
    grep -h "capture failed\|eager fallbacks" "$LOGS/l6_train_photos_det.log" | cut -c1-250 | tail -4
    sed -n '/^| variant/,/^$/p' "$LOGS/ut/useful_tokens.md" | cut -c1-330 ;;
A)  # #46 to its end: the padded ladder beside megatron-core's helper (the measured reason for one engine or two), the
    # step-loss floor (eager_padded_repeat, which run 89 did not reach), ours_packed's gradients, 17 steps, alone
    # (S's lane 7 has the padded part's gradients and floors; this call adds the speeds and the other two).
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
    # the micro-batch's own rows), from its archive under /tmp/moe, whatever tree the call carries: its suite under
    # deterministic kernels (is it Bridge's step bit for bit now?) and without, beside the MoE recipe through Bridge's
    # loop (it packs now), three lanes side by side (about 4 min). Run 87 took 110 s for the suite and 247 s for the
    # loop under six lanes.
    mkdir -p /tmp/moe && tar -xzf .snap/moe-packed.tgz -C /tmp/moe && cp -r .whl /tmp/moe/ 2>/dev/null
    cd /tmp/moe && export PYTHONPATH=/tmp/moe
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c1
      R c_moe_packed_det 200 "NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_moe_packed_det.json $PYT tests/gpu/test_packed_moe.py" ) &
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c2
      R c_moe_packed 200 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_moe_packed.json $PYT tests/gpu/test_packed_moe.py" ) &
    ( export BRIDGE_CUDAGRAPH_CACHE=/tmp/c3
      R c_moe_loop 230 "BRIDGE_CUDAGRAPH_RESULTS=\$LOGS/gpu_moe_loop.json $PYT tests/gpu/test_bridge_loop.py -k moe" ) &
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
