#!/usr/bin/env bash
# One GPU session's checks, in order of value, each under its own time limit so a slow stage cannot eat the rest:
#   1. the GPU check (benchmarks/gpu_check.py): an SD3.5-Medium-sized transformer's rollout and GRPO update in bf16
#   2. the main job (configs/shapes_grpo.yaml) for 4 updates on the GPU, evaluations off: seconds per update
#   2b. the main job twice with run.deterministic=true, 8 updates each: do the two give the same numbers (without it,
#       two GPU runs part from update 3)
#   3. the whole test suite on the GPU machine: the tests that run the trainer (the shipped real-model configs on tiny
#      instances of the real diffusers classes, placement, precision, memory controls) run on the GPU, the trainer's
#      default device; files whose optional packages are missing there fail to collect
# Usage: bash benchmarks/gpu_session.sh [OUTDIR]   (default benchmarks/results/gpu; logs and JSON land there)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-benchmarks/results/gpu}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
workers="${GPU_SESSION_WORKERS:-12}"

nvidia-smi -L 2>&1 | tee "$out/machine.txt"
python -c "import torch, diffusers, transformers, peft, accelerate; print('torch', torch.__version__, 'diffusers',
diffusers.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'accelerate',
accelerate.__version__, 'cuda', torch.cuda.is_available())" 2>&1 | tee -a "$out/machine.txt"

echo "== 1. GPU check"
timeout 240 python benchmarks/gpu_check.py --out "$out/gpu_check.json" > "$out/gpu_check.log" 2>&1
echo "rc=$?"; tail -25 "$out/gpu_check.log"
# GPU_SESSION_MODELS="flux1-dev wan2.1-1.3b": the other families at their anchors' sizes too (about 2 minutes each on
# an H200 by their FLOPs; their logs join gpu_check.log)
for model in ${GPU_SESSION_MODELS:-}; do
    timeout 300 python benchmarks/gpu_check.py --model "$model" --batch 4 --out "$out/gpu_check_$model.json" \
        >> "$out/gpu_check.log" 2>&1
    echo "$model rc=$?"; cat "$out/gpu_check_$model.json" 2>/dev/null
done

echo "== 2. main job, 4 updates"
runs="$(mktemp -d)"
timeout 180 python -m flowrl train configs/shapes_grpo.yaml train.updates=4 eval.enabled=false \
    run.out_dir="$runs" > "$out/main_job.log" 2>&1
echo "rc=$?"; tail -5 "$out/main_job.log"
cp "$runs"/shapes_grpo/metrics.csv "$out/main_job_metrics.csv" 2>/dev/null
python - "$out/main_job_metrics.csv" <<'EOF'
import csv, sys
rows = [row for row in csv.DictReader(open(sys.argv[1])) if row.get("seconds")]
print("seconds per update:", [round(float(row["seconds"]), 2) for row in rows])
EOF

echo "== 2b. main job twice with deterministic kernels, 8 updates each"
for copy in a b; do
    timeout 150 python -m flowrl train configs/shapes_grpo.yaml train.updates=8 eval.enabled=false \
        run.deterministic=true run.name="det_$copy" run.out_dir="$runs" > "$out/deterministic_$copy.log" 2>&1
    echo "$copy rc=$?"; tail -3 "$out/deterministic_$copy.log"; cp "$runs/det_$copy/metrics.csv" "$out/deterministic_$copy.csv" 2>/dev/null
done
python - "$out/deterministic_a.csv" "$out/deterministic_b.csv" <<'EOF'
import csv, sys
a, b = ([{k: v for k, v in row.items() if k != "seconds"} for row in csv.DictReader(open(f))] for f in sys.argv[1:])
first = next((i + 1 for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
print(f"{len(a)} / {len(b)} updates; identical" if first is None and len(a) == len(b) else f"first difference: update {first}")
print("seconds per update:", [round(float(row["seconds"]), 2) for row in csv.DictReader(open(sys.argv[1]))])
EOF

echo "== 3. whole suite"
# -v: each result is logged as it comes, so a stage cut off by its time limit still names what failed
timeout "${GPU_SESSION_SUITE_S:-240}" python -m pytest -v -n "$workers" -p no:cacheprovider \
    --continue-on-collection-errors > "$out/tests_all.log" 2>&1
echo "rc=$?"; grep -E "(FAILED|ERROR) tests/|passed|failed" "$out/tests_all.log" | tail -80
