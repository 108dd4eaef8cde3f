#!/bin/bash
# one device call (sessions 43-50): env, then the steps named in $@
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -1
export TIKTOKEN_CACHE_DIR=$PWD/scratch/tiktoken PYTHONPATH=/tmp/site NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
nvidia-smi topo -m | head -4
python3 -c "import torch, triton, sys; print('torch', torch.__version__, 'triton', triton.__version__, 'python', sys.version.split()[0])"
dpbench() { timeout ${DP_SECS:-560} python3 bench.py --multi_gpu dp --gpus ${GPUS:-2} --json $OUT/dp.json 2>&1 | tee $OUT/bench-dp.txt | grep -v "^W[0-9][0-9][0-9][0-9] \|Warning"; }
cpbench() {  # --cp_context by card (session 49: 114,688 the longest on an H200, 81,920 on an H100)
  local cpt=${CPT:-$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H200 && echo 114688 || echo 81920)}
  timeout ${CP_SECS:-560} python3 bench.py --multi_gpu cp --gpus ${GPUS:-2} --cp_multiples ${CPM:-1,n} --cp_context $cpt --json $OUT/cp.json 2>&1 | tee $OUT/bench-cp.txt | grep -v "^W[0-9][0-9][0-9][0-9] \|Warning"; }
cptest() { timeout ${TEST_SECS:-300} python3 -m pytest -q -s test_context_parallel.py -k match_one 2>&1 | tee $OUT/cptest.txt | grep "context parallel over\|passed\|failed\|Error" | head; }
logs() { mkdir -p $OUT/logs; for d in /tmp/bench-multi-*; do cp $d/log.txt $OUT/logs/$(basename $d).txt 2>/dev/null; done; tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs; }
final_old() {  # 1 GPU at 98,304 beside FSDP on 1 GPU, then CP over 2 at 98,304, FSDP and DDP on 2, CP at 196,608
  timeout 560 python3 - <<'PY' 2>&1 | grep -v "^W[0-9][0-9][0-9][0-9] \|Warning"
import json, os, sys
from concurrent.futures import ThreadPoolExecutor
sys.argv = ["bench.py", "--multi_gpu", "final"]
import bench
out, res = os.environ["OUT"], {}
def save():
    json.dump(res, open(f"{out}/final.json", "w"), indent=1)
cp = ["--batch_size=1", "--gradient_accumulation_steps=1"]
dp = ["--block_size=1024", "--batch_size=12"]
with ThreadPoolExecutor(2) as pool:
    a = pool.submit(bench.train_run, 1, cp + ["--block_size=98304"], 30, "1GPU-T98304", "0")
    b = pool.submit(bench.train_run, 1, ["--fsdp=True"] + dp + ["--gradient_accumulation_steps=2"], 30, "FSDP-1", "1")
    res["1GPU-T98304"], res["FSDP-1"] = a.result(), b.result()
save()
res["CP2-T98304"] = bench.train_run(2, cp + ["--block_size=98304", "--context_parallel=2"], 30, "CP2-T98304"); save()
res["FSDP-2"] = bench.train_run(2, ["--fsdp=True"] + dp + ["--gradient_accumulation_steps=4"], 30, "FSDP-2"); save()
res["DDP-2"] = bench.train_run(2, dp + ["--gradient_accumulation_steps=4"], 30, "DDP-2"); save()
res["CP2-T196608"] = bench.train_run(2, cp + ["--block_size=196608", "--context_parallel=2"], 20, "CP2-T196608"); save()
PY
}
attn() { timeout 120 python3 scratch/cp_attn.py 2>&1 | grep -v Warn | tee $OUT/cp_attn.txt; }
cprun() {  # CP over 2 at 98,304 (the 1-GPU baseline: call 3, 144,758 tokens/s, 63.5 GiB)
  timeout 300 python3 - <<'PY' 2>&1 | grep -v "^W[0-9][0-9][0-9][0-9] \|Warning"
import json, os, sys
sys.argv = ["bench.py", "--multi_gpu", "cprun"]
import bench
r = bench.train_run(2, ["--batch_size=1", "--gradient_accumulation_steps=1", "--block_size=98304", "--context_parallel=2"], 30, "CP2-T98304")
json.dump(r, open(os.environ["OUT"] + "/cprun.json", "w"), indent=1)
PY
}
cudnn() {  # PrefixCausalAttention on cuDNN vs FA2 vs the lower-right SDPA; on a wrong result the CP runs use FA2
  timeout 240 python3 scratch/cp_cudnn.py 2>&1 | grep -v Warn | tee $OUT/cp_cudnn.txt
  if [ ${PIPESTATUS[0]} -ne 0 ]; then sed -i 's/^CUDNN = True/CUDNN = False/' context_parallel.py; echo "CUDNN -> False"; fi
}
ckpt() {  # one checkpoint through DDP (2 GPUs) -> FSDP (2) -> CP (2) -> one GPU -> sample
  o=/tmp/ckpt-layouts; rm -rf $o
  a="config/kda_hybrid.py --dataset=pystdlib --block_size=1024 --batch_size=4 --gradient_accumulation_steps=$((2 * ${NPROC:-2})) --eval_interval=10 --eval_iters=2 --log_interval=5 --wandb_log=False --compile=False --out_dir=$o"
  tr="timeout ${CK_T:-100} python3 -m torch.distributed.run --standalone --nproc_per_node=${NPROC:-2} train.py"
  { $tr $a --max_iters=10 && $tr $a --max_iters=20 --init_from=resume --fsdp=True &&
    $tr $a --max_iters=30 --init_from=resume --context_parallel=${NPROC:-2} && timeout ${CK_T:-100} python3 train.py $a --max_iters=40 --init_from=resume &&
    timeout 60 python3 sample.py --out_dir=$o --num_samples=1 --max_new_tokens=48 --start="def main():"; echo "ckpt chain rc $?"; } 2>&1 |
    grep -v "^W[0-9][0-9][0-9][0-9] \|Warning\|warn" | tee $OUT/ckpt.txt | grep -E "^iter (0|9|10|19|20|29|30|39)/|val loss|rc|Error|resum|split|fsdp|FSDP|decode|^def" | head -40
}
cp2t() {  # CP over 2 at twice the one-GPU context (196,608), 20 steps, on pystdlib_long
  timeout ${CP2T_SECS:-230} python3 - <<'PY' 2>&1 | grep -v "^W[0-9][0-9][0-9][0-9] \|Warning"
import json, os, sys
sys.argv = ["bench.py", "--multi_gpu", "cp2t"]
import bench
r = bench.train_run(2, ["--batch_size=1", "--gradient_accumulation_steps=1", "--block_size=196608", "--context_parallel=2",
                        f"--dataset={bench.long_rows_dataset()}"], 20, "CP2-T196608")
json.dump(r, open(os.environ["OUT"] + "/cp2t.json", "w"), indent=1)
PY
}
cp4t() {  # CP over 2 at 4 x the one-GPU context (393,216) with activation checkpointing, 12 steps
  timeout ${CP4T_SECS:-300} python3 - <<'PY' 2>&1 | grep -v "^W[0-9][0-9][0-9][0-9] \|Warning"
import json, os, sys
sys.argv = ["bench.py", "--multi_gpu", "cp4t"]
import bench
r = bench.train_run(2, ["--batch_size=1", "--gradient_accumulation_steps=1", f"--block_size={os.environ.get('CP4T', 393216)}",
                        "--context_parallel=2", "--activation_checkpointing=True", f"--dataset={bench.long_rows_dataset()}"],
                    12, "CP2-T%s-AC" % os.environ.get('CP4T', 393216))
json.dump(r, open(os.environ["OUT"] + "/cp4t.json", "w"), indent=1)
PY
}
pair() {  # CP over 2 at 196,608 on GPUs 0,1 beside CP over 2 at 393,216 with activation checkpointing on GPUs 2,3
  timeout ${PAIR_SECS:-340} python3 - <<'PY' 2>&1 | grep -v "^W[0-9][0-9][0-9][0-9] \|Warning"
import json, os, sys
from concurrent.futures import ThreadPoolExecutor
sys.argv = ["bench.py", "--multi_gpu", "pair"]
import bench
c = ["--batch_size=1", "--gradient_accumulation_steps=1", "--context_parallel=2", f"--dataset={bench.long_rows_dataset()}"]
def run(a):
    r = bench.train_run(*a)
    json.dump(r, open(os.environ["OUT"] + f"/{a[3]}.json", "w"), indent=1)
with ThreadPoolExecutor(2) as pool:
    list(pool.map(run, [(2, c + ["--block_size=196608"], 20, "CP2-T196608", "0,1"),
                        (2, c + ["--block_size=393216", "--activation_checkpointing=True"], 12, "CP2-T393216-AC", "2,3")]))
PY
}
dp4() {  # DDP then FSDP on 4 GPUs, as bench.py --multi_gpu dp does them
  timeout ${DP4_SECS:-220} python3 - <<'PY' 2>&1 | grep -v "^W[0-9][0-9][0-9][0-9] \|Warning"
import json, os, sys
sys.argv = ["bench.py", "--multi_gpu", "dp4"]
import bench
for layout, flag in (("DDP", []), ("FSDP", ["--fsdp=True"])):
    r = bench.train_run(4, flag + ["--block_size=1024", "--batch_size=12", "--gradient_accumulation_steps=8"], 60, f"{layout}-4")
    json.dump(r, open(os.environ["OUT"] + f"/{layout}-4.json", "w"), indent=1)
PY
}
samp() { timeout 90 python3 sample.py --out_dir=/tmp/ckpt-layouts --num_samples=1 --max_new_tokens=48 --start="def main():" 2>&1 | grep -v Warn | tee $OUT/sample.txt | tail -8; }
prof() {  # one step's time split (GPU busy / NCCL / idle, host ops) on 2 GPUs: DDP, FSDP as in session 44
  # (train_s44.py, carried), FSDP with the all-gather issued after the optimizer step (train.py): scratch/prof_train.py
  cp scratch/train_s44.py train_s44.py  # (train.py reads data beside itself)
  for v in "train.py:" "train_s44.py:--fsdp=True" "train.py:--fsdp=True"; do
    t=${v%%:*}; f=${v#*:}; echo "-- $t $f"
    PROF_TRAIN=$t PROF_AFTER=20 PROF_STEPS=5 PROF_OUT=$OUT/prof-${t%.py}${f:+-fsdp} timeout ${PROF_SECS:-200} \
      python3 -m torch.distributed.run --standalone --nproc_per_node=2 scratch/prof_train.py config/kda_hybrid.py \
      --dataset=pystdlib --block_size=1024 --batch_size=12 --gradient_accumulation_steps=4 --max_iters=30 \
      --eval_interval=1000000 --eval_iters=1 --log_interval=1 --wandb_log=False --out_dir=/tmp/prof-${t%.py}$f $f 2>&1 |
      grep -v "^W[0-9][0-9][0-9][0-9] \|Warning" | grep -E "^== rank|step wall|GPU per step|ms/step|^iter (25|29)/|Error" ; cleanup
  done
}
keeptest() {  # issue 41, TUNING keep, kda_grads mid and gate, grams chunk on the GPU: their tests first, then every kernel test (session 46's prediction)
  timeout ${KT_SECS:-150} python3 -m pytest -q -n 8 test_kernels.py -k "keep or compile or fake or midpoint or wide or inside or by_chunk" 2>&1 | tee $OUT/keeptest.txt | tail -4
  timeout ${KA_SECS:-300} python3 -m pytest -q -n 8 test_kernels.py ${KSEL:+-k "$KSEL"} 2>&1 | tee $OUT/kerneltests.txt | tail -4
}
keepbench() {  # the kernel table in both settings (fla in the first run only: its compile is slow), then the scalar decay
  timeout ${KB_SECS:-280} python3 bench.py --variants ${KV:-kda,deltanet,gdn} 2>&1 | grep -v Warn | tee $OUT/bench-keep-off.txt
  PYTHONPATH= timeout ${KB_SECS:-280} python3 bench.py --tuning recompute --variants ${KV:-kda,deltanet,gdn} 2>&1 | grep -v Warn | tee $OUT/bench-keep-on.txt
}
keepscalar() { for k in default recompute; do PYTHONPATH= timeout 200 python3 bench.py --tuning $k --variants retnet,mamba2 2>&1 | grep -v Warn | tee $OUT/bench-scalar-keep-$k.txt; done; }
keeptrain() {  # the models under the presets side by side
  local mix="${MIX:-softmax kda*3,softmax kda}"; set -f  # (no globbing of 'kda*3,softmax')
  timeout ${KTR_SECS:-560} python3 bench.py --train --contexts ${CTX:-1024,4096} --mixers $mix --tuning ${PRESETS:-default recompute} \
    --jobs 3 --json $OUT/train-keep.json 2>&1 | grep -v Warn | tee $OUT/train-keep.txt | grep -E "^\||^measure|^device"
  set +f
}
kt() {  # every kernel test (session 47: the four settings on by default, the replaced forms removed); on a several-GPU
  # kind 8 workers a GPU, each worker's GPU set by scratch/gpu_spread.py (more than 8 on one 80 GB card run out of memory)
  local g=$(nvidia-smi -L | wc -l) nw=${NW:-8}; [ -n "$CUDA_VISIBLE_DEVICES" ] && g=1; [ $nw -gt $((8 * g)) ] && nw=$((8 * g))
  SPREAD_GPUS=$g PYTHONPATH=$PYTHONPATH:$PWD/scratch timeout ${KA_SECS:-330} python3 -m pytest -q -p gpu_spread -n $nw test_kernels.py ${KSEL:+-k "$KSEL"} 2>&1 | tee $OUT/kerneltests.txt | tail -4
}
trainctx() {  # the README's training table: softmax and the hybrid at every context, one bench.py --train run
  local mix="${MIX:-softmax kda*3,softmax}"; set -f
  timeout ${TC_SECS:-580} python3 bench.py --train --contexts ${CTX:-1024,4096,8192,16384,32768} --mixers $mix \
    --jobs ${JOBS:-3} --json $OUT/${TC_OUT:-train-ctx}.json 2>&1 | grep -v Warn | tee $OUT/${TC_OUT:-train-ctx}.txt | grep -E "^\||^measure|^device|^command"
  set +f
}
cp4() {  # issue 45: CP over 4 GPUs. 1 GPU at 98,304 and 114,688 and CP over 2 at 98,304 side by side (GPUs 0 | 1 | 2,3),
  # then CP over 4 at 98,304, then the longest over 4 with recompute: 12 x 98,304 (a fallback to 8 x on an error)
  timeout ${CP4_SECS:-585} python3 - <<'PY' 2>&1 | grep -v "^W[0-9][0-9][0-9][0-9] \|Warning"
import json, os, sys
from concurrent.futures import ThreadPoolExecutor
sys.argv = ["bench.py", "--multi_gpu", "cp4"]
import bench
out, res = os.environ["OUT"], {}
def save():
    json.dump(res, open(f"{out}/cp4.json", "w"), indent=1)
c = ["--batch_size=1", "--gradient_accumulation_steps=1", f"--dataset={bench.long_rows_dataset()}"]
ac = ["--activation_checkpointing=True"]
runs = [(1, c + ["--block_size=98304"], 30, "1GPU-T98304", "0"), (1, c + ["--block_size=114688"], 30, "1GPU-T114688", "1"),
        (2, c + ["--block_size=98304", "--context_parallel=2"], 30, "CP2-T98304", "2,3")]
with ThreadPoolExecutor(3) as pool:
    for a, r in zip(runs, pool.map(lambda a: bench.train_run(*a), runs)):
        res[a[3]] = r
save()
res["CP4-T98304"] = bench.train_run(4, c + ["--block_size=98304", "--context_parallel=4"], 30, "CP4-T98304"); save()
for m, steps in ((12, 8), (8, 12)):
    T = m * 98304
    r = res[f"CP4-T{T}-AC"] = bench.train_run(4, c + [f"--block_size={T}", "--context_parallel=4"] + ac, steps, f"CP4-T{T}-AC"); save()
    if "tokens_s" in r:
        break
one = res["1GPU-T98304"]
for k, r in res.items():
    if "tokens_s" in r and "tokens_s" in one:
        print(f"{k}: x1GPU {r['tokens_s'] / one['tokens_s']:.2f}, peak/1GPU {r['peak_gib'] / one['peak_gib']:.2f}")
for k in ("CP2-T98304", "CP4-T98304"):
    same = [abs(res[k]["losses"][i] - one["losses"][i]) for i in one.get("losses", {}) if i in res[k].get("losses", {})]
    if same:
        print(f"losses 1GPU vs {k}: largest difference {max(same):.4f} over {len(same)} steps")
PY
}
cpbase() {  # issue 45 (57): one GPU at 98,304 and at 114,688 side by side, then CP over 2 at 98,304 (two visible GPUs)
  timeout ${CPB_SECS:-560} python3 - <<'PY' 2>&1 | grep -v "^W[0-9][0-9][0-9][0-9] \|Warning"
import json, os, sys
from concurrent.futures import ThreadPoolExecutor
sys.argv = ["bench.py", "--multi_gpu", "cpbase"]
import bench
out, res = os.environ["OUT"], {}
g = os.environ.get("CUDA_VISIBLE_DEVICES", "0,1").split(",")
c = ["--batch_size=1", "--gradient_accumulation_steps=1", f"--dataset={bench.long_rows_dataset()}"]
runs = [(1, c + ["--block_size=98304"], 30, "1GPU-T98304", g[0]), (1, c + ["--block_size=114688"], 30, "1GPU-T114688", g[1])]
with ThreadPoolExecutor(2) as pool:
    for a, r in zip(runs, pool.map(lambda a: bench.train_run(*a), runs)):
        res[a[3]] = r
json.dump(res, open(f"{out}/cpbase.json", "w"), indent=1)
res["CP2-T98304"] = bench.train_run(2, c + ["--block_size=98304", "--context_parallel=2"], 30, "CP2-T98304", ",".join(g[:2]))
json.dump(res, open(f"{out}/cpbase.json", "w"), indent=1)
PY
}
cp4long() {  # issue 45 (57): the longest context over 4 GPUs (CPN: ranks) with recompute (CPL: multiples of 98,304 to try, longest
  # first, until one trains), then CP over 4 at 98,304 (against cpbase's one GPU and CP over 2 on the same machine)
  timeout ${CPL_SECS:-560} python3 - <<'PY' 2>&1 | grep -v "^W[0-9][0-9][0-9][0-9] \|Warning"
import json, os, sys
sys.argv = ["bench.py", "--multi_gpu", "cp4long"]
import bench
out, res = os.environ["OUT"], {}
def save():
    json.dump(res, open(f"{out}/cp4long.json", "w"), indent=1)
n = int(os.environ.get("CPN", 4))  # ranks (8 on an 8-GPU host)
c = ["--batch_size=1", "--gradient_accumulation_steps=1", f"--dataset={bench.long_rows_dataset()}", f"--context_parallel={n}"]
for m in [int(x) for x in os.environ.get("CPL", "12,8").split(",")]:
    T = m * 98304
    r = res[f"CP{n}-T{T}-AC"] = bench.train_run(n, c + [f"--block_size={T}", "--activation_checkpointing=True"], 8, f"CP{n}-T{T}-AC"); save()
    if "tokens_s" in r:
        break
res[f"CP{n}-T98304"] = bench.train_run(n, c + ["--block_size=98304"], 20, f"CP{n}-T98304"); save()
PY
}
prof1() {  # session 49: DDP and FSDP on one GPU (FSDP-1 ran at 0.77x DDP-1 in the dp table), 5 steps each profiled
  for f in "" "--fsdp=True"; do echo "-- $f"
    PROF_AFTER=20 PROF_STEPS=5 PROF_OUT=$OUT/prof1${f:+-fsdp} PROF_TRACE=$OUT/trace1${f:+-fsdp}.json timeout ${PROF_SECS:-200} \
      python3 -m torch.distributed.run --standalone --nproc_per_node=1 scratch/prof_train.py config/kda_hybrid.py \
      --dataset=pystdlib --block_size=1024 --batch_size=12 --gradient_accumulation_steps=2 --max_iters=30 \
      --eval_interval=1000000 --eval_iters=1 --log_interval=1 --wandb_log=False --out_dir=/tmp/prof1$f $f 2>&1 |
      grep -v "^W[0-9][0-9][0-9][0-9] \|Warning" | grep -E "^== rank|step wall|GPU per step|ms/step|^iter (25|29)/|Error" ; cleanup
  done
}
ablate() {  # session 49's plan for issue 41: where _grads_bwd's time goes (the value loop, the Gram dots), two gates
  timeout ${AB_SECS:-400} python3 notes/runs/grads-ablation-2026-11-26-49/ablate_grads.py ${AB_SHAPES:-} 2>&1 | grep -v Warn | tee $OUT/ablate.txt
}
gtiles() {  # session 49: _grads_bwd's tile candidates (key tile 32: 4 B spilled offline against 672 B at 64)
  timeout ${GT_SECS:-400} python3 bench.py --tiles delta --only kda_grads --jobs 8 2>&1 | grep -v Warn | tee $OUT/tiles-kda-grads.txt | tail -30
}
cmp() {  # session 50: _grads_bwd before (scratch/kernels-before/kernels.py) and after (the Gram backward's pair tiles)
  timeout ${CMP_SECS:-300} python3 notes/runs/grads-reload-2026-11-27-50/compare_grads.py $PWD/scratch/kernels-before 2>&1 | grep -v Warn | tee $OUT/compare.txt
}
ro4k() {  # session 50's next: every mixer at 4k with and without CUDA graphs (GDN, DeltaNet wait on the host 12-17 ms)
  set -f; timeout ${RO_SECS:-590} python3 bench.py --train --contexts ${CTX:-4096} --mixers ${MIX:-softmax gdn deltanet} \
    --compile_mode default reduce-overhead --jobs ${JOBS:-4} --json $OUT/train-ro4k.json 2>&1 | grep -v Warn | tee $OUT/train-ro4k.txt | grep -E "^\||^measure|^device|^command"; set +f
}
lag() {  # session 51: train.py's step reading its numbers a step late (bench.py mirrors it) against the step before (scratch/before)
  set -f
  for v in before after; do
    d=.; [ $v = before ] && d=scratch/before
    (cd $d && timeout ${LAG_SECS:-290} python3 bench.py --train --contexts ${CTX:-1024,4096} --mixers ${MIX:-softmax kda*3,softmax} \
      --jobs ${JOBS:-4} --json $OUT/train-lag-$v.json 2>&1 | grep -v Warn | tee $OUT/train-lag-$v.txt | grep -E "^\||^measure|^device|^command")
  done; set +f
}
confirm() {  # issue 41's plain train.py runs: softmax and the hybrid at 4k (B 8) and 16k (B 2), median tok/s of iters 10-30
  local common="--dataset=pystdlib --gradient_accumulation_steps=1 --max_iters=31 --eval_interval=100000 --eval_iters=1 --log_interval=1 --wandb_log=False --overwrite=True"
  for pass in warm time; do  # warm: the four compile side by side (2 steps each); time: each alone from the caches
    for T in ${CTX:-4096 16384}; do
      for m in owt kda_hybrid; do
        local args="config/$m.py $common --block_size=$T --batch_size=$((32768 / T)) --out_dir=/tmp/confirm-$m-$T"
        [ $m = owt ] && args="$args --mixer=softmax"
        if [ $pass = warm ]; then python3 train.py $args --max_iters=2 > /tmp/confirm-warm-$m-$T.log 2>&1 &
        else echo "python train.py $args"; timeout ${CF_SECS:-150} python3 train.py $args > $OUT/confirm-$m-$T.log 2>&1; fi
      done
    done; wait
  done
  python3 - <<'PY'
import glob, os, re, statistics
for f in sorted(glob.glob(os.environ["OUT"] + "/confirm-*.log")):
    t = [float(x.replace(",", "")) for i, x in re.findall(r"^iter (\d+)/\d+: .*?tok/s ([\d,]+)", open(f).read(), re.M) if 10 <= int(i) <= 30]
    print(os.path.basename(f), f"median tok/s of iters 10-30: {statistics.median(t):,.0f} ({len(t)} iters)" if t else "no iters")
PY
}
fwdtiles() {  # session 51's prepared patch (TUNING['cumsum'], TUNING['wy_fwd']: KDA's forward kernels by column tiles),
  # its GPU tests, then its candidates timed kernel by kernel (fwd_tiles.py)
  local p=notes/runs/train-lag-2026-11-27-51/fwd_tiles.patch
  git apply $p 2>/dev/null || patch -p1 --forward < $p || { echo "fwdtiles: the patch did not apply"; return; }
  timeout 240 python3 -m pytest -q -n 4 test_kernels.py -k "cumsum or wy_fwd or gate_in_kernel or bounded" 2>&1 | tail -3 | tee $OUT/fwdtiles-tests.txt
  timeout ${FT_SECS:-300} python3 notes/runs/train-lag-2026-11-27-51/fwd_tiles.py 2>&1 | grep -v Warn | tee $OUT/fwdtiles.txt
}
fwdpick() {  # session 52: the fastest candidates of fwdtiles (if its tests passed) into kernels.py's TUNING, then every kernel test
  python3 scratch/fwdpick.py $OUT/fwdtiles.txt $OUT/fwdtiles-tests.txt kernels.py 2>&1 | tee $OUT/fwdpick.txt
  cp kernels.py $OUT/kernels-picked.py; git diff --stat | tail -1
}
dnprof() {  # session 52's next: DeltaNet (and KDA) per kernel beside fla's at the two Dk = 128 shapes
  for sh in 8,4096,16,128 2,16384,16,128; do
    timeout ${DP_SECS:-200} python3 bench.py --profile --variants ${PV:-deltanet} --shape $sh 2>&1 | grep -v Warn | tee $OUT/profile-${PV:-deltanet}-$sh.txt | head -40
  done
}
wysplit() {  # session 52's prepared patch: _wy_grads_bwd by key halves (TUNING['wy_grads'] split / maxnreg / stages),
  # its GPU tests, then the candidates checked against fp64 and timed beside the default (DeltaNet, GDN; bench.py's shapes)
  local p=notes/runs/fwd-tiles-2026-11-27-52/wy_grads_split.patch
  grep -q split_min_k kernels.py || git apply $p || { echo "wysplit: the patch did not apply"; return; }  # (in kernels.py since session 53)
  timeout 200 python3 -m pytest -q -n 3 test_kernels.py -k "wy_grads_key_split" 2>&1 | tail -3 | tee $OUT/wysplit-tests.txt
  timeout ${WS_SECS:-400} python3 bench.py --tiles delta --only "wy_grads split,wy_grads stages" --variants ${WSV:-deltanet,gdn} \
    --jobs 8 2>&1 | grep -v Warn | tee $OUT/tiles-wy-split.txt | tail -30
}
smallv() {  # session 52: the state passes at 3 stages where the V-tile is 32 (2 x 16384 x 16 x 128), checked and timed
  timeout ${SV_SECS:-300} python3 bench.py --tiles delta --only "state small-v,state v 64" --variants deltanet,gdn,kda --jobs ${SVJ:-6} 2>&1 |
    grep -v Warn | tee $OUT/tiles-small-v.txt | tail -32
}
wybwd() {  # session 52: KDA's _wy_bwd (two programs an SM) and _grams_chunk (four) with registers capped at 128 at the hybrid's 1k shape, then bench.py's
  for sh in 32,1024,6,128 ""; do
    timeout ${WB_SECS:-200} python3 bench.py --tiles delta --only "kda_grads wy maxnreg,grams chunk maxnreg" --variants kda ${sh:+--shape $sh} \
      --jobs 2 2>&1 | grep -v Warn | tee -a $OUT/tiles-wy-bwd.txt | tail -8
  done
}
gnahead() {  # session 53: KDA's state passes with G_n loaded a chunk ahead (TUNING['state']['gn_ahead']): its GPU test,
  # then checked against fp64 and timed beside the default at bench.py's shapes and the hybrid's 32k layer (1 x 32768 x 6 x 128)
  timeout 240 python3 -m pytest -q -n 4 test_kernels.py -k "gn_ahead or one_wave" 2>&1 | tail -3 | tee $OUT/gn-ahead-tests.txt
  for sh in "" 1,32768,6,128; do
    timeout ${GA_SECS:-240} python3 bench.py --tiles delta --only "state gn ahead off,state one-wave off" --variants kda ${sh:+--shape $sh} \
      --jobs ${GAJ:-4} 2>&1 | grep -v Warn | tee -a $OUT/tiles-gn-ahead.txt | tail -14
  done
}
patched() {  # a copy of the tree with one prepared patch applied (each on its own: the patches touch the same lines)
  local p=$1 d=/tmp/tree-$(basename $1 .patch)
  rm -rf $d && cp -a . $d && (cd $d && git apply $p) || { echo "the patch $p did not apply"; return 1; }
  echo $d
}
gsplit() {  # session 53: a helper's patch, KDA's _grads_bwd as two kernels (TUNING['kda_grads']['split']): its GPU test,
  # then its candidates checked against fp64 and timed beside the default at bench.py's shapes and the hybrid's 1k layer
  local d; d=$(patched notes/runs/state-pass-2026-11-27-53/grads-bwd-split.patch | tail -1) || return
  (cd $d && timeout 240 python3 -m pytest -q -n 4 test_kernels.py -k "grads_split" 2>&1 | tail -3 | tee $OUT/gsplit-tests.txt
  for sh in "" 32,1024,6,128; do
    timeout ${GS_SECS:-240} python3 bench.py --tiles delta --only "kda_grads split" --variants kda ${sh:+--shape $sh} \
      --jobs ${GSJ:-4} 2>&1 | grep -v Warn | tee -a $OUT/tiles-gsplit.txt | tail -14
  done)
}
cgfuse() {  # session 53: a helper's patch, KDA's gate cumsum formed inside _grams_chunk (TUNING['grams']['fuse_cumsum']):
  # its GPU tests, then its candidates checked and timed beside the default at bench.py's shapes
  local d; d=$(patched notes/runs/state-pass-2026-11-27-53/cumsum-grams.patch | tail -1) || return
  (cd $d && timeout 240 python3 -m pytest -q -n 4 test_kernels.py -k "fused_cumsum or grams_by_chunk" 2>&1 | tail -3 | tee $OUT/cgfuse-tests.txt
  timeout ${CG_SECS:-240} python3 bench.py --tiles delta --only "grams fuse cumsum" --variants kda --jobs ${CGJ:-4} 2>&1 |
    grep -v Warn | tee $OUT/tiles-cgfuse.txt | tail -10)
}
kprof() {  # session 54: per kernel beside fla's where issue 41's kernel targets are short (DeltaNet fwd+bwd, KDA fwd at Dk 64)
  for vs in deltanet:8,4096,16,128 kda:8,4096,16,64; do
    timeout ${KP_SECS:-200} python3 bench.py --profile --variants ${vs%%:*} --shape ${vs#*:} 2>&1 | grep -v Warn | tee $OUT/profile-${vs%%:*}-$(echo ${vs#*:} | tr , x).txt | head -60
  done
}
fwd64() {  # session 54: KDA's _wy_fwd and cumsum tiles at Dk 64 (its forward ÷ fla 0.78, _wy_fwd 0.334 ms of 0.91), then
  # DeltaNet's state-pass tiles with W, U formed in the pass (fwd+bwd ÷ fla 0.67 at 8 x 4096 x 16 x 128)
  timeout ${F6_SECS:-280} python3 bench.py --tiles delta --only "wy_fwd,cumsum" --variants kda --jobs ${F6J:-6} 2>&1 |
    grep -v Warn | tee $OUT/tiles-fwd64.txt | tail -24
  timeout ${F6_SECS:-280} python3 bench.py --tiles delta --only "state out_warps 8,state v 64,state warps 8,state wu in pass off" \
    --variants deltanet --jobs ${F6J:-6} 2>&1 | grep -v Warn | tee $OUT/tiles-dnstate.txt | tail -18
}
wfree() {  # session 54: DeltaNet's forward without W, its backward pass forming W^T dDelta from A, beta, K
  # (TUNING['state']['w_free']): its GPU test, then checked against fp64 and timed beside the default
  timeout 240 python3 -m pytest -q -n 4 test_kernels.py -k "w_free" 2>&1 | tail -3 | tee $OUT/wfree-tests.txt
  timeout ${WF_SECS:-240} python3 bench.py --tiles delta --only "state w free,state bwd warps 8" --variants deltanet --jobs ${WFJ:-4} 2>&1 |
    grep -v Warn | tee $OUT/tiles-wfree.txt | tail -10
}
mix4k() {  # issue 41: every mixer at 4k, one bench.py --train run (TC_OUT: beside trainctx on another GPU)
  CTX=4096 MIX="softmax kda*3,softmax kda gdn deltanet mamba2 retnet" JOBS=4 TC_OUT=train-4k-mixers trainctx
}
losscheck() {  # issue 41 point 5: the hybrid's 200-step loss check (compiled and eager, side by side on one GPU) against
  # the stored runs of 2026-11-26 (notes/perf.md, "The loss check"), compared by notes/loss_compare.py
  local a="config/kda_hybrid.py --dataset=pystdlib --batch_size=16 --block_size=1024 --gradient_accumulation_steps=1 --max_iters=200 --lr_decay_iters=200 --warmup_iters=20 --eval_interval=1000 --eval_iters=10 --log_interval=1 --wandb_log=False"
  timeout ${LC_SECS:-280} python3 train.py $a --out_dir=/tmp/lc-now > $OUT/losscheck-now.txt 2>&1 &
  timeout ${LC_SECS:-280} python3 train.py $a --compile=False --out_dir=/tmp/lc-now-eager > $OUT/losscheck-now-eager.txt 2>&1 &
  wait
  python3 notes/loss_compare.py notes/runs/losscheck-2026-11-26-{before,after,eager}.txt $OUT/losscheck-now{,-eager}.txt | tee $OUT/losscheck-compare.txt
}
lcold() {  # (57): the loss check of 11-24's code (6f04bad, the stored 'after' run, scratch/old) beside today's, compiled,
  # and today's with the chunked torch kernels (--kernels=torch, eager): same data, same init, one GPU
  local a="config/kda_hybrid.py --dataset=pystdlib --batch_size=16 --block_size=1024 --gradient_accumulation_steps=1 --max_iters=200 --lr_decay_iters=200 --warmup_iters=20 --eval_interval=1000 --eval_iters=10 --log_interval=1"
  (cd scratch/old && timeout ${LC_SECS:-330} python3 train.py $a --out_dir=/tmp/lc-old > $OUT/losscheck-old-6f04bad.txt 2>&1) &
  timeout ${LC_SECS:-330} python3 train.py $a --wandb_log=False --out_dir=/tmp/lc-now > $OUT/losscheck-now.txt 2>&1 &
  [ $(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1) -lt 100000 ] && wait  # (three fit an H200, two an H100)
  timeout ${LC_SECS:-330} python3 train.py $a --wandb_log=False --kernels=torch --compile=False --out_dir=/tmp/lc-torch > $OUT/losscheck-now-torch.txt 2>&1 &
  wait
  python3 notes/loss_compare.py notes/runs/losscheck-2026-11-26-{before,after}.txt $OUT/losscheck-{old-6f04bad,now,now-torch}.txt | tee $OUT/losscheck-compare.txt
}
lastdt() {  # (57): train.py's step times read off the GPU's timeline: the last step's time against the others',
  # compiled at 4k (as confirm) and eager with evals every 5 steps
  timeout 200 python3 train.py config/kda_hybrid.py --dataset=pystdlib --gradient_accumulation_steps=1 --max_iters=31 --eval_interval=100000 --eval_iters=1 --log_interval=1 --wandb_log=False --block_size=4096 --batch_size=8 --out_dir=/tmp/lastdt-c > $OUT/lastdt-compiled.txt 2>&1
  timeout 100 python3 train.py config/kda_hybrid.py --dataset=pystdlib --gradient_accumulation_steps=1 --max_iters=16 --eval_interval=5 --eval_iters=2 --log_interval=1 --wandb_log=False --block_size=1024 --batch_size=8 --compile=False --out_dir=/tmp/lastdt-e > $OUT/lastdt-eager.txt 2>&1
  grep -hE "^iter|^step|Error" $OUT/lastdt-*.txt | cut -c1-100 | tail -40
}
confirmlc() { confirm; losscheck; }  # (one GPU's share of a two-GPU call)
grams64() {  # session 55: KDA's _grams_chunk at Dk 64 by its own key tile and warps (TUNING['grams']['chunk_k_d64'], ...)
  timeout 200 python3 -m pytest -q -n 4 test_kernels.py -k "grams_chunk_d64" 2>&1 | tail -3 | tee $OUT/grams64-tests.txt
  timeout ${G64_SECS:-240} python3 bench.py --tiles delta --only "grams chunk d64" --variants kda --shape 8,4096,16,64 \
    --jobs ${G64J:-5} 2>&1 | grep -v Warn | tee $OUT/tiles-grams64.txt | tail -8
}
kbench() {  # the kernel table, one bench.py run with its warm phase (session 48)
  timeout ${KBT_SECS:-590} python3 bench.py --jobs ${KJOBS:-6} ${KARGS:-} 2>&1 | grep -v Warn | tee $OUT/bench.txt
}
cleanup() { pkill -9 -f "[t]rain\.py"; pkill -9 -f "[t]orch\.distributed\.run"; sleep 2; }
cleanup  # a warm machine may hold the previous call's orphans (session 44, call C)
pair_steps() {  # "a+b+...": step a on GPU 0, b on GPU 1, ... at once (a several-GPU kind; each times against its own
  # baseline); "a+b+c@2,3": step c on GPUs 2 and 3
  local IFS=+ i=0 s n g; local steps=($1); unset IFS
  for s in "${steps[@]}"; do n=${s%@*}; g=${s#*@}; [ "$g" = "$s" ] && g=$i
    (export CUDA_VISIBLE_DEVICES=$g; $n > $OUT/pair-$n.log 2>&1) & i=$((i + 1)); done
  wait; i=0; for s in "${steps[@]}"; do n=${s%@*}; g=${s#*@}; [ "$g" = "$s" ] && g=$i
    echo "-- $n (GPU $g)"; tail -n ${PAIR_TAIL:-40} $OUT/pair-$n.log; i=$((i + 1)); done
}
for step in "$@"; do echo "== $step $(date +%T)"; case $step in *+*) pair_steps $step;; *) $step;; esac; cleanup; done
logs
