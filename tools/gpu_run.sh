#!/usr/bin/env bash
# The prepared device run (one call of the device tool, at most ~8 min: each part has
# its own limit, 150 + 60 + 90 + 120 + 80 + 45 s (~4.7 min in all on an H200 at stop 38, before
# gpu_graphs.py); nothing to install):
#   run(command="bash tools/gpu_run.sh", timeout_s=600)
# 1. tools/gpu_check.py: plain greedy on CUDA vs the CPU, EAGLE-3.1 / PR lossless in fp32 and bf16,
#    batch-1 speed interleaved (JSON: $OUT/gpu_check.json).
# 2. gambit.bench.cuda_check: logits and greedy output against transformers on CUDA, engine tok/s in bf16.
# 2b. tools/gpu_graphs.py: decode steps as CUDA graphs (EngineConfig.decode_graphs="cuda", first run
#    pending) against eager: equal greedy tokens, tok/s at batch 1/16/64/256 (JSON: $OUT/gpu_graphs.json).
# 3. gambit bench search, hard problems, no batch cap (trees at every batch size, as a GPU wants):
#    tournament overhead share, Gambit + PR against Gambit (JSON: $OUT/bench_search_gpu.json).
# 4. tools/spec_batch_speed.py at batch 1, 8, 32: where a tree per trace stops paying on the GPU
#    (what spec.max_batch should be there). 5. tools/gpu_profile.py: where a step's time goes.
# 6. Beside them on the CPU: tools/target_repro_dtype.py, the target's training history on this CPU kind.
# Logs of each in $OUT. Each part has its own time limit, so one that hangs leaves the others' output.
set -u
export PYTHONPATH=services PYTHONUNBUFFERED=1
OUT=${OUT:-results/gpu}
mkdir -p "$OUT"
PY=${PY:-python3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee /tmp/gpu.txt
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" | tee -a /tmp/gpu.txt
# meanwhile, on 2 of the machine's 16 CPU cores: the target's first 200 training steps on another CPU kind
# (stop 38: float32 step 200 = 1.46379 on an AVX2 AMD EPYC, 1.51775 on an AVX-512 one, 1.45465 with
# --isa compatible on the AVX2 one; does the compatible mode give 1.45465 here too?)
(timeout 330 $PY tools/target_repro_dtype.py --steps 201 --threads 2 --dtypes float32 --isa compatible \
    > /tmp/repro_compatible.log 2>&1; timeout 120 $PY tools/target_repro_dtype.py --steps 201 --threads 2 \
    --dtypes float32 > /tmp/repro_machine.log 2>&1) &
repro=$!
timeout 150 $PY tools/gpu_check.py --per 2 --max-tokens 64 --reps 3 --json "$OUT/gpu_check.json" 2>&1 | tee "$OUT/gpu_check.log"
check=${PIPESTATUS[0]}
timeout 60 $PY -m gambit.bench.cuda_check 2>&1 | tee "$OUT/cuda_check.log"
cuda=${PIPESTATUS[0]}
timeout 90 $PY tools/gpu_graphs.py --json "$OUT/gpu_graphs.json" 2>&1 | tee /tmp/gpu_graphs.log
graphs=${PIPESTATUS[0]}
timeout 120 $PY -m gambit.cli bench search --quick --problems 12 --concurrency 6 --capacity 16 \
    --difficulties hard --no-sensitivity --no-frontier --spec-max-batch 0 \
    --json "$OUT/bench_search_gpu.json" --plots /tmp/gpu_plots 2>&1 | grep -v "^bench search" | tee "$OUT/bench_search_gpu.log"
search=${PIPESTATUS[0]}
rm -f "$OUT"/*.partial  # a call returns at most 8 files
timeout 80 $PY tools/spec_batch_speed.py 1,8,32 --reps 2 2>&1 | tee "$OUT/spec_batch_gpu.log"
timeout 45 $PY tools/gpu_profile.py --out "$OUT/gpu_profile.txt" > /tmp/gpu_profile.log 2>&1
grep -A1 "^==" "$OUT/gpu_profile.txt"
wait $repro; grep -h -A3 "^| arithmetic" /tmp/repro_compatible.log /tmp/repro_machine.log
$PY -c "import torch; print('CPU capability', torch.backends.cpu.get_cpu_capability())"; grep -m1 "model name" /proc/cpuinfo
echo "gpu_check exit $check, cuda_check exit $cuda, gpu_graphs exit $graphs, bench search exit $search"
[ "$check" = 0 ] && [ "$cuda" = 0 ] && [ "$graphs" = 0 ] && [ "$search" = 0 ]
