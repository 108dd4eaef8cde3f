# issue 14 (l4): where the phased GDN kernel takes <S, dS'>, A/B (checked on the GPU first), then profiles of both
export PYTHONUNBUFFERED=1
timeout 400 python3 notes/delta_tiles.py --only gdn_sds --variants deltanet,gdn --shapes 8,4096,16,64:8,4096,16,128 2>&1 | tee $OUT/tiles.txt
