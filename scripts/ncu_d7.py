import torch, dsv4lib
from dsv4lib.bench import d7
g = torch.Generator(device="cuda").manual_seed(0)
w = d7.filled_cache(256 << 10, 64, g); c = d7.filled_cache(512 << 10, 64, g)
case = d7.make_case(64, 64, 128, 512, w, c, sets=1)
f = d7.ours_fn(case)
for n in (1, 2):
    for _ in range(3): f(*case.sets[0]) if n == 1 else dsv4lib.sparse_decode(case.sets[0][0], w, case.sets[0][1], case.sets[0][2], extra_k_cache=c, extra_indices=case.sets[0][3], extra_topk_length=case.sets[0][4], sink=case.sink, num_splits=1)
torch.cuda.synchronize()
