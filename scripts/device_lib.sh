# Helpers for one call on the device machine (sourced): every step runs under its own timeout with its own log,
# logs and results go to $LOGS (outside $OUT) and are packed into $OUT/all.tgz after each step (only a few files
# come back from a call), and a table of steps (name, exit code, seconds) is printed last. Usage, from the repository root on the device:
#   source scripts/device_lib.sh; R NAME TIMEOUT_S 'command'; ...; table
# Steps may run in parallel lanes: ( CUDA_VISIBLE_DEVICES=1 R vision 240 '...' ) & ... wait.
: "${OUT:?OUT must name the folder whose files come back}"
export LOGS="${LOGS:-/tmp/device_logs}"
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

R() {
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS rc=0 packer
  echo "[device] $(date -u +%H:%M:%S) start $name (limit ${limit}s)"
  # Packed every 30 s while the step runs too: a step the call's own limit kills keeps its log so far (run 49 lost a
  # benchmark's whole log that way).
  ( while sleep 30; do pack; done ) &
  packer=$!
  timeout -k 15 "$limit" bash -c "$*" >"$LOGS/$name.log" 2>&1 || rc=$?
  kill "$packer" 2>/dev/null; wait "$packer" 2>/dev/null
  echo "$name $rc $((SECONDS - t0))" >>"$LOGS/steps.txt"
  echo "[device] $(date -u +%H:%M:%S) end $name rc=$rc $((SECONDS - t0))s"
  pack
  return 0
}

# Each packer writes its own part (lanes pack at the same time; one shared part name raced: "mv: cannot stat").
pack() {
  local part="$OUT/all.tgz.part.$BASHPID"
  tar -czf "$part" -C "$(dirname "$LOGS")" "$(basename "$LOGS")" 2>/dev/null && mv -f "$part" "$OUT/all.tgz"
  rm -f "$part"
}

table() {
  printf '%-28s %5s %6s\n' step rc seconds
  sort -k1,1 "$LOGS/steps.txt" | while read -r n r s; do printf '%-28s %5s %6s\n' "$n" "$r" "$s"; done
  for f in "$LOGS"/*.log; do echo "== tail $(basename "$f")"; tail -n 6 "$f"; done | cut -c1-300
}

# What every call's script did first (runs 18-29 repeated these lines): the plugin's wheel, offline Hugging Face,
# and the GPU and stack versions into $LOGS.
prologue() {
  python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v -i warn
  export HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$LOGS/gpu.txt"
  python3 -c "import torch, transformer_engine, megatron.core, megatron.bridge as b; print(torch.__version__, transformer_engine.__version__, megatron.core.__version__, b.__version__)" >"$LOGS/versions.txt" 2>&1
}

