"""What one argument of a TVM-FFI launch costs the host: a torch tensor against its data pointer (#28; ~1 min on a GPU).

    python scripts/probe_ffi_args.py [--rounds R] [--compile-only]

The plans pass every tensor of a launch to the compiled function as a ``torch.Tensor``: TVM-FFI takes each through
torch's DLPack exchange and checks its dtype, rank, extents, strides, device and alignment in C.  A plan's key
already holds all of that (``launch.tensor_sig``), so a build could take the addresses instead (``cute.Pointer``
parameters: CuTeDSL's TVM-FFI ABI takes a Python int for them, ``tensor.data_ptr()``) and rebuild its layouts from
the plan's extents.  This measures whether that pays: the same trivial kernel (one thread copies one element between
the first and last argument) built three times — ten ``cute.Tensor`` parameters; ten ``cute.Pointer`` parameters and
the length; the same with 36 more ints (what a plan's pointer build also takes: extents and strides) — called with
the same tensors, with a fresh output (``torch.empty`` each call, as a public call's output is), and with
``data_ptr()`` ints, each the lowest of R round medians (``bench.host_us``), alternating.  Expected from the host
log (session 29: ~30 tensors ~27 µs of checks): ~0.9 µs a tensor against ~0.1 an int.
``--compile-only``: build the three for sm_90a on the CPU and stop (tests/test_foundation.py runs it)."""
import argparse
import json

import cutlass
import cutlass.cute as cute
import torch

ELEMENTS = 1024
N_ARGS = 10


@cute.kernel
def copy_one(src: cute.Tensor, dst: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    if tidx == 0:
        dst[0] = src[0]


# ten arguments written out (sparse_decode's launch takes ten tensors): flat positional parameters, as the plans
# call their builds — a tuple parameter would go through an ffi.Array of its own
@cute.jit
def launch_tensors(t0: cute.Tensor, t1: cute.Tensor, t2: cute.Tensor, t3: cute.Tensor, t4: cute.Tensor,
                   t5: cute.Tensor, t6: cute.Tensor, t7: cute.Tensor, t8: cute.Tensor, t9: cute.Tensor, stream):
    copy_one(t0, t9).launch(grid=(1, 1, 1), block=(32, 1, 1), stream=stream)


EXTRA_INTS = 36      # a plan's pointer build also takes the tensors' extents and strides: ~36 ints at sparse_decode


def launch_pointers(extra_ints: int = 0):
    """The pointer build's jit function: ten ``cute.Pointer`` parameters, the length, ``extra_ints`` more Int32
    parameters (unused: their cost is the argument passing), the stream — written out as source (a jit function's
    parameters are its signature) and traced without the AST pass (no control flow); the length rebuilds the
    layouts, as a plan's extents would."""
    extra = "".join(f"x{i}, " for i in range(extra_ints))
    source = (f"def launch(p0, p1, p2, p3, p4, p5, p6, p7, p8, p9, n, {extra}stream):\n"
              "    layout = cute.make_layout((n,))\n"
              "    copy_one(cute.make_tensor(p0, layout), cute.make_tensor(p9, layout)).launch(\n"
              "        grid=(1, 1, 1), block=(32, 1, 1), stream=stream)\n")
    scope = {"cute": cute, "copy_one": copy_one}
    exec(compile(source, f"<probe: pointers and {extra_ints} ints>", "exec"), scope)
    return cute.jit(preprocess=False)(scope["launch"])


def compile_both(arch: str = "sm_90a"):
    """The two builds, TVM-FFI functions (compiled for ``arch``; on a CPU inside ``compile.cute_arch``)."""
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor, make_ptr
    n = cute.sym_int()
    fakes = tuple(make_fake_tensor(cutlass.Float32, (n,), stride=(1,), assumed_align=16) for _ in range(N_ARGS))
    ptrs = tuple(make_ptr(cutlass.Float32, 0, cute.AddressSpace.gmem, assumed_align=16) for _ in range(N_ARGS))
    options = f"--gpu-arch {arch} --enable-tvm-ffi"
    stream = make_fake_stream()
    as_tensors = cute.compile(launch_tensors, *fakes, stream, options=options)
    as_pointers = cute.compile(launch_pointers(), *ptrs, cutlass.Int32(ELEMENTS), stream, options=options)
    with_ints = cute.compile(launch_pointers(EXTRA_INTS), *ptrs, cutlass.Int32(ELEMENTS),
                             *(cutlass.Int32(i) for i in range(EXTRA_INTS)), stream, options=options)
    unwrap = lambda f: getattr(f, "_tvm_ffi_function", None) or f
    return unwrap(as_tensors), unwrap(as_pointers), unwrap(with_ints)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--compile-only", action="store_true")
    args = ap.parse_args()
    if args.compile_only:
        from dsv4lib.kernels.compile import cute_arch
        with cute_arch("sm_90a"):
            compile_both()
        print(json.dumps({"compiled": True, "args": N_ARGS}))
        return
    from dsv4lib import bench
    from dsv4lib.ops.launch import raw_stream
    as_tensors, as_pointers, with_ints = compile_both()
    device = torch.device("cuda", torch.cuda.current_device())   # raw_stream needs the index
    ts = [torch.randn(ELEMENTS, device=device) for _ in range(N_ARGS)]
    stream = raw_stream(device)
    as_tensors(*ts, stream)
    as_pointers(*(t.data_ptr() for t in ts), ELEMENTS, stream)
    torch.cuda.synchronize()
    assert ts[-1][0].item() == ts[0][0].item(), "the tensor build did not copy"

    def fresh_tensors():
        out = torch.empty(ELEMENTS, device=device)
        as_tensors(*ts[:-1], out, stream)

    def fresh_pointers():
        out = torch.empty(ELEMENTS, device=device)
        as_pointers(*(t.data_ptr() for t in ts[:-1]), out.data_ptr(), ELEMENTS, stream)
    ready = tuple(ts)
    addresses = tuple(t.data_ptr() for t in ts)
    calls = {
        "tensors, the same every call": lambda: as_tensors(*ready, stream),
        "pointers, the same ints every call": lambda: as_pointers(*addresses, ELEMENTS, stream),
        "pointers, data_ptr() read every call": lambda: as_pointers(*(t.data_ptr() for t in ts), ELEMENTS, stream),
        "tensors, a fresh output every call": fresh_tensors,
        "pointers, a fresh output every call": fresh_pointers,
        "torch.empty alone": lambda: torch.empty(ELEMENTS, device=device),
        f"pointers + {EXTRA_INTS} ints, data_ptr() read every call": lambda: with_ints(
            *(t.data_ptr() for t in ts), ELEMENTS, *range(EXTRA_INTS), stream),
    }
    best = bench.host_us_interleaved(calls, {name: [()] for name in calls}, rounds=args.rounds)
    for name, us in best.items():
        print(json.dumps({"call": name, "args": N_ARGS, "host_us": round(us, 2)}), flush=True)
    per_arg = (best["tensors, the same every call"] - best["pointers, the same ints every call"]) / N_ARGS
    print(json.dumps({"tensor_over_pointer_us_per_arg": round(per_arg, 3),
                      "fresh_output_extra_us": round(best["tensors, a fresh output every call"]
                                                     - best["torch.empty alone"]
                                                     - best["tensors, the same every call"], 2)}))


if __name__ == "__main__":
    main()
