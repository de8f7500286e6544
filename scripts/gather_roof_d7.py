"""How fast can the D7 shapes' key bytes be *gathered* at all?  A roof for #35 that copy bandwidth is not.

    python scripts/gather_roof_d7.py [--shapes 1,2,3,4]

D7's `roof_fraction` divides the bytes a call must read by stage 00's copy bandwidth (a 1 GiB sequential copy).  The
decode reads them as 584-byte pieces at random addresses of a 768k-key cache (448 MB): at B ≥ 64 every SM is busy and
ours (45.5 µs at B128 H64) and FlashMLA (48.7) sit at ~1.05 TB/s, where splitting the same work over more CTAs gains
nothing (session 39).  This times torch's own gather of exactly those bytes — each listed key's 576-byte part and
8-byte scale group, from the same caches by the same indices (page and slot precomputed outside the timing), into
fresh tensors — by CUDA-graph replay over the same rotating input sets, beside ours and FlashMLA in the same run.
torch's index kernel is no perfect gather (one 4-byte element a thread), so its time is an upper bound on the roof:
if it is not much below ours, the 1.5x over FlashMLA that #35 asks at B ≥ 64 is past what the reads allow."""
import argparse

import torch

from dsv4lib import bench
from dsv4lib.bench import d7
from dsv4lib.reference.model1 import PART_BYTES, SCALE_GROUP_BYTES


def words(cache):
    """(parts (pages, page_size, 144), scale groups (pages, page_size, 2)) int32 views of a Model1Cache's pages."""
    pages = cache.data.view(cache.data.shape[0], -1).view(torch.int32)          # (pages, page_bytes / 4)
    ps, stride = cache.page_size, pages.stride(0)
    parts = pages.as_strided((pages.shape[0], ps, PART_BYTES // 4), (stride, PART_BYTES // 4, 1))
    groups = pages.as_strided((pages.shape[0], ps, SCALE_GROUP_BYTES // 4), (stride, SCALE_GROUP_BYTES // 4, 1),
                              storage_offset=pages.storage_offset() + ps * PART_BYTES // 4)
    return parts, groups


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1,2,3,4", help="indices into bench.d7.SHAPES, or BxHxWINxCMP")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    window = d7.filled_cache(256 << 10, 64, gen)
    compressed = d7.filled_cache(512 << 10, 64, gen)
    (wp, wg), (cp, cg) = words(window), words(compressed)
    fm = d7.flashmla()
    print(f"{torch.cuda.get_device_name()}: device µs per call (graph replay); gather = torch indexing of the same "
          f"key parts + scale groups")
    for text in args.shapes.split(","):
        case = d7.make_case(*d7.parse_shape(text), window, compressed)
        ps1, ps2 = window.page_size, compressed.page_size
        sets = [(i1.long() // ps1, i1.long() % ps1, i2.long() // ps2, i2.long() % ps2) for _, i1, _, i2, _ in case.sets]
        gather = lambda p1, s1, p2, s2: (wp[p1, s1], wg[p1, s1], cp[p2, s2], cg[p2, s2])
        fns, inputs = {"gather": gather, "ours": d7.ours_fn(case)}, {"gather": sets, "ours": case.sets}
        if fm is not None:
            fns["flashmla"], inputs["flashmla"] = d7.flashmla_fn(case, fm), case.sets
        times = bench.time_graph_interleaved(fns, inputs)        # one slow spell reaches every column alike
        us = {name: t.per_call_ms * 1e3 for name, t in times.items()}
        nbytes = case.B * case.keys_per_token * (PART_BYTES + SCALE_GROUP_BYTES)
        print(f"B{case.B:<4} H{case.H:<4} {case.n_win}+{case.n_cmp}: gather {us['gather']:7.1f} µs "
              f"({nbytes / us['gather'] / 1e3:5.0f} GB/s)  ours {us['ours']:7.1f}  FlashMLA "
              f"{us.get('flashmla', float('nan')):7.1f}  ours / gather {us['ours'] / us['gather']:5.2f}", flush=True)


if __name__ == "__main__":
    main()
