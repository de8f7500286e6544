"""The profiled range the ``ncu_d*.py`` scripts share: every call warmed up (compiled, plans made) outside it, then
one call of each inside ``cudaProfilerStart`` / ``Stop`` — what ``ncu --profile-from-start off`` captures."""

from typing import Callable

import torch


def profile_once(calls: dict[str, Callable[[], object]], warmup: int = 3) -> None:
    for call in calls.values():
        for _ in range(warmup):
            call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for call in calls.values():
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print("profiled:", ", ".join(calls))
