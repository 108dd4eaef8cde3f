# Softmax attention on MQAR's hardest cells (width 256 with 8 and 16 pairs: both seeds at chance at LR 3e-4 and 1e-3
# in the grid), seed 1338, under variants of the protocol: what makes the induction circuit form?
#   lr3e-3       a higher LR (Zoology sweeps up to 1e-2)
#   bs256        4x the sequences (and answers) per step, at LR 1e-3 and 3e-4
#   wd0          no weight decay
#   head1        one 256-wide head instead of eight 32-wide ones (Zoology's attention baseline uses one head)
# Same 1,024 val sequences as the grid (eval_iters x batch_size = 1,024). All runs at once, in the background.
# $ bash notes/softmax_probe.sh OUT_ROOT       (then: grep 'val acc' OUT_ROOT/*/log.txt)
set -u
root=${1:-out-probe}
common="config/mqar.py --mixer=softmax --n_embd=256 --seed=1338 --max_iters=16000 --lr_decay_iters=16000
        --eval_interval=500 --stop_at_val_acc=0.99"
launch() {  # name, overrides...
    local name=$1; shift
    mkdir -p "$root/$name"
    TORCHINDUCTOR_COMPILE_THREADS=1 python train.py $common --out_dir="$root/$name" "$@" > "$root/$name/stdout.txt" 2>&1 &
}
for n in 8 16; do
    launch lr3e-3_n${n} --mqar_num_pairs=$n --n_head=8 --learning_rate=3e-3 --min_lr=3e-4
    launch bs256-lr1e-3_n${n} --mqar_num_pairs=$n --n_head=8 --learning_rate=1e-3 --min_lr=1e-4 --batch_size=256 --eval_iters=4
    launch bs256-lr3e-4_n${n} --mqar_num_pairs=$n --n_head=8 --learning_rate=3e-4 --min_lr=3e-5 --batch_size=256 --eval_iters=4
    launch wd0_n${n} --mqar_num_pairs=$n --n_head=8 --learning_rate=1e-3 --min_lr=1e-4 --weight_decay=0.0
    launch head1_n${n} --mqar_num_pairs=$n --n_head=1 --learning_rate=1e-3 --min_lr=1e-4
done
wait
