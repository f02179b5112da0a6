#!/usr/bin/env bash
# The GPU table of the peers' scale features: SD3.5-Medium (512 px), FLUX.1-dev (1024 px) and Wan2.1-1.3B (480x832,
# 33 frames) sized denoisers through flowrl's rollout and GRPO update in bf16 with LoRA, eager with torch's SDPA and
# then compiled with the best attention backend this machine has (FA3 on Hopper when flash_attn_interface is
# installed, else FlashAttention 2, else torch's native): throughput, peak memory and MFU per row, each row under
# its own time limit. No network; random weights.
# Usage: bash benchmarks/gpu_peers.sh [OUTDIR]   (default benchmarks/results/gpu_peers; CPU dry run: TINY=1)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-benchmarks/results/gpu_peers}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
tiny=${TINY:+--tiny}
best=$(python - <<'PY'
import importlib.util, torch
if not torch.cuda.is_available():
    print("native")
elif importlib.util.find_spec("flash_attn_interface") and torch.cuda.get_device_capability()[0] == 9:
    print("_flash_3")
elif importlib.util.find_spec("flash_attn"):
    print("flash")
else:
    print("native")
PY
)
echo "best attention backend here: $best"
for model in sd3.5-medium flux1-dev wan2.1-1.3b; do
    batch=8; [ "$model" = sd3.5-medium ] || batch=4
    # SD3's joint attention calls torch's SDPA directly (no dispatcher backend applies): compiled with sdpa
    backend=$best; [ "$model" = sd3.5-medium ] && backend=sdpa
    for setting in "eager --attention sdpa" "compiled --compile --attention $backend"; do
        name=${setting%% *}; flags=${setting#* }
        timeout "${GPU_PEERS_ROW_S:-170}" python benchmarks/gpu_check.py --model "$model" --batch "$batch" $tiny $flags \
            --out "$out/$model.$name.json" > "$out/$model.$name.log" 2>&1
        echo "$model $name rc=$?"
    done
done
python - "$out" <<'PY'
import json, sys
from pathlib import Path
rows = [json.loads(f.read_text()) for f in sorted(Path(sys.argv[1]).glob("*.json"))]
print("| model | attention | compiled | rollout samples/s | update items/s | peak GiB | rollout MFU | update MFU |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    peak = "-" if r["peak_gpu_gib"] is None else f'{r["peak_gpu_gib"]:.1f}'
    print(f'| {r["model"]} | {r["attention"]} | {r["compiled"]} | {r["rollout_samples_per_s"]:.2f} | '
          f'{r["update_items_per_s"]:.2f} | {peak} | {r["rollout_mfu"]:.3f} | {r["update_mfu"]:.3f} |')
PY
