# issue 14 (l5): the phased GDN kernel's V-tile at Dk 64, checked on the GPU first, then timed beside DeltaNet
export PYTHONUNBUFFERED=1
timeout 500 python3 notes/delta_tiles.py --only gdn_v --variants deltanet,gdn --shapes 8,4096,16,64 2>&1 | tee $OUT/tiles.txt
