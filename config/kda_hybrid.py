# The headline run: the 3:1 KDA:softmax hybrid of Kimi Linear (three KDA layers, then one softmax layer, tiled over
# the 12 layers) at GPT-2-small size on OpenWebText. It is config/owt.py with this mixer (and so KDA's 128-wide
# heads); hardware, data and expected loss as there.
# $ torchrun --standalone --nproc_per_node=8 train.py config/kda_hybrid.py     # -> out-openwebtext-kdax3+softmax
from pathlib import Path

mixer = 'kda*3,softmax'
exec(Path(__file__).with_name('owt.py').read_text())  # the rest: config/owt.py, whose head_dim rule reads mixer
