# several GPUs (nvidia-h100-x2 or more): Muon against AdamW under FSDP and DDP (tools/bench_multi.py opt)
t0=$(date +%s); source .gpu/setup.sh
nvidia-smi -L
python data/pystdlib/prepare.py 2>&1 | tail -2
n=$(nvidia-smi -L | wc -l); g=$(( n >= 4 ? n / 2 : n ))
timeout $(( ${BUDGET:-570} - $(el) - 10 )) python tools/bench_multi.py opt --gpus $g --json $OUT/opt.json 2>&1 | grep -v Warn | tee $OUT/opt.txt
echo "done at $(el) s"
