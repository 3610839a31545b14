#!/bin/bash
# Live ESP on CPU: a Poisson short stream (ascendra bench) plus long prompts (openai client).
cd /work/wt/integ
export PYTHONPATH=$PWD
PY=/work/main/.venv/bin/python
OUT=${OUT:-/work/live_esp}
rm -f $OUT/port $OUT/*.json
$PY -m daemon.cli serve --layout ${LAYOUT:-3xsarathi} --executor torch --device cpu \
   --esp-max-degree 3 --esp-min-tokens 1000 --ttft-slo 60 --tbt-slo 5 \
   --port 0 --port-file $OUT/port > $OUT/serve.log 2>&1 &
SERVE=$!
for i in $(seq 1 120); do [ -s $OUT/port ] && curl -sf localhost:$(cat $OUT/port)/health >/dev/null && break; sleep 1; done
PORT=$(cat $OUT/port); echo "port $PORT"
$PY /work/live_esp/long.py $PORT > $OUT/long.log 2>&1 &
LONG=$!
$PY -m daemon.cli bench --url http://127.0.0.1:$PORT --qps 1 --num-requests 40 --max-model-len 1024 \
   --length-scale 0.1 --ttft-slo 60 --tbt-slo 5 --seed 3 --json $OUT/bench.json > $OUT/bench.log 2>&1
wait $LONG
curl -s localhost:$PORT/metrics | grep -E "^ascendra_esp|^ascendra_requests" > $OUT/metrics.txt
curl -s localhost:$PORT/health > $OUT/health.json
kill -INT $SERVE; wait $SERVE
echo done
