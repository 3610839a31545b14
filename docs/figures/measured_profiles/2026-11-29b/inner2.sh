#!/bin/bash
# The quiet window's measurements (run by window.sh at nice -10, already paused others).
set -u
cd /work/wt/prof
export OMP_NUM_THREADS=1 PYTHONPATH=/work/wt/prof
PY=/work/main/.venv/bin/python
W=/work/runs_prof/w2
snap() { echo "== $1 $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"; head -1 /proc/stat;
         ps -eo pid,ni,pcpu,stat,etime,comm --sort=-pcpu | head -6; }
snap start
$PY -m daemon.cli profile --device cpu --repeats 3 --chunk-size 512 --max-num-seqs 32 \
    --max-model-len 1024 --num-kv-blocks 2048 --torch-threads 1 --out $W/p2.json 2>&1 | grep -v '%|'
for run in S1 S2 S3; do
    rate=14.1
    snap $run
    $PY -m bench.studies.measured_loop --profile $W/p.json --rates $rate --num-requests 400 \
        --step-log --out $W/$run 2>&1 | tail -2
done
snap end
