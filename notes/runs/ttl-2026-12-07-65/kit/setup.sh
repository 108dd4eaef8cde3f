# sourced first by every call script (t0 set before): environment, the card, versions
set -o pipefail
export PYTHONUNBUFFERED=1 TIKTOKEN_CACHE_DIR=$PWD/.gpu/tiktoken
el() { echo $(( $(date +%s) - t0 )); }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python -c "import torch, triton, sys; print('torch', torch.__version__, 'triton', triton.__version__, 'python', sys.version.split()[0])"
git log --oneline -1
tokenize() {  # the pkgtext shards from the carried archive (~15 s; kept on a warm machine: checked, not rebuilt)
  if [ "$(sha256sum data/pkgtext/*.bin 2>/dev/null | cut -c1-16 | tr '\n' ' ')" != "9f77ecd74f2df784 7e2d331bcfee371e " ]; then
    python data/pkgtext/prepare.py --from_archive data/pkgtext/pkgtext.jsonl.xz --num_proc 16 2>&1 | grep -v "it/s\]" | tail -3
  fi
  sha256sum data/pkgtext/*.bin | cut -c1-16
  echo "tokenized at $(el) s"
}
