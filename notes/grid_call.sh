# One device call of issue 20's grids (notes/perf.md 2026-11-25 (u)): MQAR's RetNet / Mamba2 batch-256 rungs
# (--ahead) beside state tracking's LR ladder, both continued with --resume from the runs' ckpt.pt on a warm machine.
# $ bash notes/grid_call.sh TAG SECONDS [mps|nomps] [cut|st256]
#   TAG      names the files written to $OUT: TAG-rm.txt, TAG-st.txt (the grids' output), TAG-mon.txt (GPU, memory
#            and load every 45 s), TAG-logs.tgz (every run's log.txt)
#   SECONDS  when the grids are stopped (their train.py runs keep a ckpt.pt from their last eval)
#   mps      run the grids' processes under CUDA MPS (a user daemon with its pipe in /tmp; no GPU setting changes),
#            so their small kernels share the SMs instead of time-slicing; off again when the call ends
#   cut      (default) the runs cut last session: MQAR's RetNet / Mamba2 batch-256 rungs (out-grid-s/mqar) beside
#            state tracking's LR ladder (out-grid-t/statetrack)
#   st256    state tracking's batch-256 rung at width 256, every mixer (out-grid-t/statetrack)
# Expects those out dirs (carried in the first call, kept on the warm machine after).
set -u
tag=$1; secs=$2; mode=${3:-}; part=${4:-cut}
out=${OUT:-out-call}; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/$tag-env.txt"
python -c "import torch, triton, sys; print(torch.__version__, triton.__version__, sys.version.split()[0])" >> "$out/$tag-env.txt"

if [ "$mode" = mps ]; then
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
    mkdir -p /tmp/mps-pipe /tmp/mps-log
    if command -v nvidia-cuda-mps-control > /dev/null && nvidia-cuda-mps-control -d \
        && timeout 60 python -c "import torch; print('MPS client ok', (torch.ones(1, device='cuda') + 1).item())"; then
        echo "MPS on" >> "$out/$tag-env.txt"
    else
        echo quit | nvidia-cuda-mps-control 2> /dev/null
        unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
        echo "MPS could not start: running without it" >> "$out/$tag-env.txt"
    fi
fi

( while true; do
    date +%T
    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
    free -g | grep Mem
    uptime
    sleep 45
  done ) > "$out/$tag-mon.txt" 2>&1 &
mon=$!

if [ "$part" = cut ]; then
    timeout "$secs" python grid.py --tasks mqar --mixers retnet mamba2 --learning_rates 3e-4 1e-3 --batch_sizes 64 256 \
        --seeds 1337 1338 --max_iters=16000 --lr_decay_iters=16000 --eval_interval=500 --stop_at_val_acc=0.99 \
        --jobs=20 --resume --ahead --out_root out-grid-s --table out-grid-s/rm.md > "$out/$tag-rm.txt" 2>&1 &
    rm_pid=$!
    timeout "$secs" python grid.py --tasks statetrack --learning_rates 3e-4 1e-3 --seeds 1337 1338 \
        --stop_at_val_acc=0.99 --jobs=8 --resume --out_root out-grid-t --table out-grid-t/st.md > "$out/$tag-st.txt" 2>&1 &
    st_pid=$!
else
    rm_pid=
    timeout "$secs" python grid.py --tasks statetrack --widths 256 --learning_rates 3e-4 1e-3 --batch_sizes 64 256 \
        --seeds 1337 1338 --stop_at_val_acc=0.99 --jobs=28 --resume --ahead --out_root out-grid-t \
        --table out-grid-t/st256.md > "$out/$tag-st.txt" 2>&1 &
    st_pid=$!
fi
wait $rm_pid $st_pid
pkill -f "^[^ ]*python[^ ]* train.py"  # anchored: a bare 'train.py' pattern would match this shell's own command line
sleep 5
kill $mon
[ "$mode" = mps ] && [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ] && echo quit | nvidia-cuda-mps-control
tar czf "$out/$tag-logs.tgz" out-grid-*/*/*/log.txt out-grid-*/*.md 2> /dev/null
ls out-grid-s/mqar/*/ckpt.pt out-grid-t/statetrack/*/ckpt.pt 2> /dev/null | wc -l
for f in "$out/$tag"-rm.txt "$out/$tag"-st.txt; do [ -f "$f" ] && tail -n 3 "$f"; done; true
