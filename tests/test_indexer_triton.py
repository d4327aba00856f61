"""The Triton fallback of the indexer logits (python/dsv4ops/indexer_triton.py) and its dispatch.

  * compile: both kernels compiled for gfx942 and gfx950 (target hip, wave 64) and sm_90 (target cuda) on a
    machine without a GPU, with the operand modes the host picks for each target; the expected matrix
    instructions are in the code (FP8 MFMA on gfx942/gfx950, FP8 wgmma on sm_90, fp16 wgmma for FNUZ
    operands there) and the AMD kernels use no scratch;
  * interpreter (CPU, TRITON_INTERPRET=1, in a child pytest: the variable must be set before triton is
    imported): the kernels' logic against the reference, in the fp16 operand mode and in the OCP FP8 mode
    (the interpreter has no FNUZ FP8 type, so the gfx942 bitcast mode is only compiled here);
  * gpu: the compiled kernels against the reference on the same inputs, both encodings (the criteria of
    test_indexer.py: -inf mask bit-equal, calc_diff < 1e-3), and the public wrappers routed to Triton when
    dispatch finds no kernel;
  * dispatch (CPU): "no kernel built for the device, triton importable" simulated; the path and the reason
    logged once.
Tests that need triton skip only when it is not installed."""

import logging
import os
import re
import subprocess
import sys

import pytest
import torch

import dsv4ops
from dsv4ops import dispatch, indexer, indexer_triton
from dsv4ops.reference import indexer as reference
from test_indexer import DTYPES, assert_logits_match, fp8_tensor, paged_cache, paged_lens, windows

needs_triton = pytest.mark.skipif(not indexer_triton.available(), reason="triton is not installed")

# ----------------------------------------------------------------------------------------------------------
# compile for gfx942 / gfx950 / sm_90 without a GPU

PREFILL_ARGS = {"q_ptr": "*u8", "k_ptr": "*u8", "k_scale_ptr": "*fp32", "w_ptr": "*fp32", "ks_ptr": "*i32",
                "ke_ptr": "*i32", "out_ptr": "*fp32", "M": "i32", "N": "i32", "H": "i32", "D": "i32",
                "stride_qm": "i32", "stride_qh": "i32", "stride_kn": "i32", "stride_om": "i32",
                "scale_multiplier": "fp32"}
PAGED_ARGS = {"q_ptr": "*u8", "cache_ptr": "*u8", "w_ptr": "*fp32", "lens_ptr": "*i32", "table_ptr": "*i32",
              "out_ptr": "*fp32", "num_blocks": "i32", "block_size": "i32", "block_stride": "i32",
              "table_stride": "i32", "table_cols": "i32", "max_model_len": "i32", "H": "i32", "D": "i32",
              "scale_multiplier": "fp32"}

# (backend, arch, warp size, q fnuz, k fnuz, pattern of the matrix instruction)
TARGETS = [
    ("hip", "gfx942", 64, True, True, r"v_mfma_f32_\w+_fp8_fp8"),
    ("hip", "gfx942", 64, False, False, r"v_mfma_f32_\w+_fp8_fp8"),  # OCP bytes bitcast to FNUZ
    ("hip", "gfx942", 64, True, False, r"v_mfma_f32_\w+_fp8_fp8"),
    ("hip", "gfx950", 64, False, False, r"v_mfma_f32_\w+_(f8f6f4|fp8_fp8)"),
    ("cuda", 90, 32, False, False, r"wgmma\.mma_async\S*\.f32\.e4m3\.e4m3"),
    ("cuda", 90, 32, True, False, r"wgmma\.mma_async\S*\.f32\.f16\.f16"),  # FNUZ operand: fp16 path
]


def _target_id(t):
    return f"{t[1] if t[0] == 'hip' else 'sm_' + str(t[1])}-q{'fnuz' if t[3] else 'fn'}-k{'fnuz' if t[4] else 'fn'}"


def _compile(kernel, args, constexprs, backend, arch, warp):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = dict(args)
    signature.update({name: "constexpr" for name in constexprs})
    source = ASTSource(kernel, signature, constexprs)
    return triton.compile(source, target=GPUTarget(backend, arch, warp),
                          options={"num_warps": indexer_triton.NUM_WARPS})


@needs_triton
@pytest.mark.parametrize("which", ["prefill", "paged"])
@pytest.mark.parametrize("target", TARGETS, ids=[_target_id(t) for t in TARGETS])
def test_compiles_for_target_with_matrix_instructions(target, which):
    backend, arch, warp, q_fnuz, k_fnuz, pattern = target
    arch_name = arch if backend == "hip" else f"sm_{arch}"
    q_mode, k_mode, multiplier = indexer_triton.operand_modes(q_fnuz, k_fnuz, arch_name)
    block_h, block_d = indexer_triton.block_sizes(64, 128)
    prefill, paged = indexer_triton.kernels()
    common = dict(Q_MODE=q_mode, K_MODE=k_mode, CLEAN=True, BLOCK_H=block_h, BLOCK_D=block_d,
                  BLOCK_N=indexer_triton.BLOCK_N)
    if which == "prefill":
        compiled = _compile(prefill, PREFILL_ARGS, dict(common, ROWS=indexer_triton.ROWS_PER_PROGRAM), backend, arch,
                            warp)
    else:
        compiled = _compile(paged, PAGED_ARGS, dict(common, NEXT_N=2, LENS_PER_ROW=False), backend, arch, warp)
    assembly = compiled.asm["amdgcn"] if backend == "hip" else compiled.asm["ptx"]
    assert re.search(pattern, assembly), f"no {pattern} in the {arch_name} code"
    if backend == "hip":
        assert compiled.asm["hsaco"], "no code object"
        scratch = [int(x) for x in re.findall(r"ScratchSize: (\d+)", assembly)]
        assert scratch and max(scratch) == 0, f"scratch use on {arch_name}: {scratch}"
    else:
        assert compiled.asm["cubin"], "no cubin"


def test_operand_modes():
    fnuz, ocp = indexer_triton.MODE_FNUZ, indexer_triton.MODE_OCP
    assert indexer_triton.operand_modes(True, True, "gfx942") == (fnuz, fnuz, 1.0)
    assert indexer_triton.operand_modes(True, False, "gfx942") == (fnuz, fnuz, 2.0)
    assert indexer_triton.operand_modes(False, False, "gfx942") == (fnuz, fnuz, 4.0)
    assert indexer_triton.operand_modes(False, False, "gfx950") == (ocp, ocp, 1.0)
    assert indexer_triton.operand_modes(False, False, "sm_90") == (ocp, ocp, 1.0)
    f16_ocp, f16_fnuz = indexer_triton.MODE_F16_FROM_OCP, indexer_triton.MODE_F16_FROM_FNUZ
    assert indexer_triton.operand_modes(True, False, "sm_90") == (f16_fnuz, f16_ocp, 1.0)
    assert indexer_triton.operand_modes(False, True, "gfx950") == (f16_ocp, f16_fnuz, 1.0)
    assert indexer_triton.operand_modes(False, False, "sm_80") == (f16_ocp, f16_ocp, 1.0)
    assert indexer_triton.operand_modes(True, True, "gfx90a") == (f16_fnuz, f16_fnuz, 1.0)


# ----------------------------------------------------------------------------------------------------------
# shared checks (interpreter on the CPU, compiled on the GPU)

def assert_spec_match(got, want, window=None, strict=True):
    """strict: test_indexer's assert_logits_match in full (the largest relative difference <= 1e-4 too);
    else the spec §3.7 criteria alone (the compiled GPU kernels: tensor-core FP8 accumulation is not plain
    fp32)."""
    assert_logits_match(got, want, window, max_relative=1e-4 if strict else None)


def check_prefill(run, q_dtype, k_dtype, m, n, heads, dim, clean, device):
    q = fp8_tensor((m, heads, dim), q_dtype, seed=m)
    k = fp8_tensor((n, dim), k_dtype, seed=n)
    q.view(torch.uint8)[:, :, ::7] = 0x80
    k.view(torch.uint8)[:, ::5] = 0x80
    k_scale = torch.pow(2.0, torch.randint(-3, 3, (n,), generator=torch.Generator().manual_seed(1)).float())
    weights = torch.randn(m, heads, generator=torch.Generator().manual_seed(2))
    ks, ke = windows(m, n, seed=3)
    scale_arg = k_scale.view(torch.uint8).reshape(n, 4) if m % 2 else k_scale[:, None]
    got = run(*(t.to(device) for t in (q, k, scale_arg, weights, ks, ke)), clean).cpu()
    want = reference.fp8_mqa_logits(q, k, k_scale, weights, ks, ke)
    assert got.shape == (m, n) and got.dtype == torch.float32
    strict = device == "cpu"
    if clean:
        assert_spec_match(got, want, strict=strict)
    else:
        columns = torch.arange(n)[None, :]
        window = (columns >= ks.long().clamp(0, n)[:, None]) & (columns < ke.long().clamp(0, n)[:, None])
        assert_spec_match(got, want, window, strict=strict)


def check_paged(run, dtype, next_n, lens_shape, block_size, clean, device, heads=8, dim=64):
    batch, max_len = 3, 200
    cache, table, _ = paged_cache([150, 70, 199], block_size, dim, dtype, seed=next_n * block_size)
    table[2, 199 // block_size] = 1 << 20  # a block outside the cache (positions 192..199): never read, -inf
    lens = paged_lens(next_n, lens_shape)
    q = fp8_tensor((batch, next_n, heads, dim), dtype, seed=9)
    weights = torch.randn(batch * next_n, heads, generator=torch.Generator().manual_seed(10))
    got = run(*(t.to(device) for t in (q, cache, weights, lens, table)), max_len, clean, dtype).cpu()
    want = reference.fp8_paged_mqa_logits(q, cache, weights, lens, table, max_len, True, dtype)
    assert got.shape == (batch * next_n, max_len)
    strict = device == "cpu"
    if clean:
        assert_spec_match(got, want, strict=strict)
    else:
        row_lens = reference.paged_row_lengths(lens, batch, next_n, max_len)
        window = torch.arange(max_len)[None, :] < row_lens[:, None]
        assert_spec_match(got, want, window, strict=strict)
        assert torch.equal(torch.isinf(got[window]), torch.isinf(want[window]))


PREFILL_SHAPES = [(7, 50, 8, 32), (9, 130, 64, 128), (1, 1, 4, 64), (5, 70, 12, 80)]
PAGED_FORMS = [(1, "B"), (2, "B1"), (2, "Bn"), (4, "B")]


INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"


@needs_triton
def test_interpreted_kernels_match_reference():
    env = dict(os.environ, TRITON_INTERPRET="1")
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
                             "interpreter_"],
                            env=env, cwd=os.path.dirname(__file__), capture_output=True, text=True, timeout=900)
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert re.search(r"\d+ passed", summary) and "skipped" not in summary and "failed" not in summary, summary


def _as_arch(monkeypatch, arch):
    """Operand modes as on `arch` (the interpreter runs on the CPU)."""
    modes = indexer_triton.operand_modes
    monkeypatch.setattr(indexer_triton, "operand_modes", lambda q_fnuz, k_fnuz, _: modes(q_fnuz, k_fnuz, arch))


@needs_triton
@pytest.mark.parametrize("arch", ["sm_90", "generic"])
@pytest.mark.parametrize("q_dtype", DTYPES)
@pytest.mark.parametrize("k_dtype", DTYPES)
@pytest.mark.parametrize("m,n,heads,dim", PREFILL_SHAPES)
@pytest.mark.parametrize("clean", [True, False])
def _interpreted_prefill_matches_reference(monkeypatch, arch, q_dtype, k_dtype, m, n, heads, dim,
                                               clean):
    _as_arch(monkeypatch, arch)
    check_prefill(indexer_triton.fp8_mqa_logits, q_dtype, k_dtype, m, n, heads, dim, clean, "cpu")


@needs_triton
@pytest.mark.parametrize("arch", ["sm_90", "generic"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("next_n,lens_shape", PAGED_FORMS, ids=[f"n{n}-{s}" for n, s in PAGED_FORMS])
@pytest.mark.parametrize("block_size", [32, 64])
@pytest.mark.parametrize("clean", [True, False])
def _interpreted_paged_matches_reference(monkeypatch, arch, dtype, next_n, lens_shape, block_size,
                                             clean):
    _as_arch(monkeypatch, arch)
    check_paged(indexer_triton.fp8_paged_mqa_logits, dtype, next_n, lens_shape, block_size, clean, "cpu")


@needs_triton
def _interpreted_empty_shapes():
    q = fp8_tensor((0, 4, 32), torch.float8_e4m3fn, seed=6)
    k = fp8_tensor((9, 32), torch.float8_e4m3fn, seed=7)
    empty = torch.empty(0, dtype=torch.int32)
    assert indexer_triton.fp8_mqa_logits(q, k, torch.ones(9), torch.ones(0, 4), empty, empty).shape == (0, 9)
    q = fp8_tensor((3, 4, 32), torch.float8_e4m3fn, seed=8)
    out = indexer_triton.fp8_mqa_logits(q, k[:0], torch.ones(0), torch.ones(3, 4), torch.zeros(3, dtype=torch.int32),
                                        torch.full((3,), 4, dtype=torch.int32))
    assert out.shape == (3, 0)


@needs_triton
def _interpreted_compiled_calls_match_reference():
    """Under torch.compile(fullgraph=True) the Triton functions run as opaque ops that launch eagerly: their
    results match the reference as the eager calls' do, and the ops' fakes agree with them (opcheck)."""
    def run(function, *args):
        torch._dynamo.reset()
        got = torch.compile(lambda *a: function(*a), fullgraph=True)(*args)
        torch._dynamo.reset()
        return got

    check_prefill(lambda *a: run(indexer_triton.fp8_mqa_logits, *a), torch.float8_e4m3fn, torch.float8_e4m3fnuz,
                  9, 130, 64, 128, True, "cpu")
    for dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):  # q and the cache in that encoding
        check_paged(lambda *a: run(indexer_triton.fp8_paged_mqa_logits, *a), dtype, 2, "Bn", 32, True, "cpu")
    # Invalid inputs: refused by the launch's checks when the graph runs, or by the fake while tracing.
    q, k = fp8_tensor((5, 4, 32), torch.float8_e4m3fn, seed=1), fp8_tensor((40, 32), torch.float8_e4m3fn, seed=2)
    ks, ke = windows(5, 40, seed=3)
    with pytest.raises(ValueError, match=r"weights must be \[5, 4\] fp32"):
        run(indexer_triton.fp8_mqa_logits, q, k, torch.ones(40), torch.ones(5, 4, dtype=torch.float64), ks, ke)
    cache, table, _ = paged_cache([150, 70, 199], 16, 32, torch.float8_e4m3fn, seed=4)
    q4 = fp8_tensor((3, 2, 4, 32), torch.float8_e4m3fn, seed=5)
    with pytest.raises(RuntimeError, match="max_model_len must be >= 0, got -1"):
        run(indexer_triton.fp8_paged_mqa_logits, q4, cache, torch.randn(6, 4), paged_lens(2, "Bn"), table, -1)
    # test_schema is left out: it multiplies the inputs, which torch cannot do for float8 tensors on the CPU.
    # clean_logits: unwritten columns would differ between any two runs.
    checks = ("test_faketensor", "test_aot_dispatch_dynamic")
    for rows in (5, 0):
        torch.library.opcheck(torch.ops.dsv4_triton.fp8_mqa_logits.default,
                              (q[:rows], k, torch.rand(40) + 0.5, torch.randn(rows, 4), ks[:rows], ke[:rows], True),
                              test_utils=checks)
    for max_len, kv_dtype in ((200, torch.float8_e4m3fn), (0, torch.float8_e4m3fnuz)):
        torch.library.opcheck(torch.ops.dsv4_triton.fp8_paged_mqa_logits.default,
                              (q4, cache, torch.randn(6, 4), paged_lens(2, "Bn"), table, max_len, True, kv_dtype),
                              test_utils=checks)


if INTERPRETING:  # collected only in the child process (names: test_interpreter_*)
    test_interpreter_prefill = _interpreted_prefill_matches_reference
    test_interpreter_paged = _interpreted_paged_matches_reference
    test_interpreter_empty_shapes = _interpreted_empty_shapes
    test_interpreter_compiled_calls = _interpreted_compiled_calls_match_reference


# ----------------------------------------------------------------------------------------------------------
# GPU: the compiled kernels

@needs_triton
@pytest.mark.gpu
@pytest.mark.parametrize("q_dtype", DTYPES)
@pytest.mark.parametrize("k_dtype", DTYPES)
@pytest.mark.parametrize("m,n,heads,dim", PREFILL_SHAPES + [(300, 2000, 64, 128)])
@pytest.mark.parametrize("clean", [True, False])
def test_gpu_prefill_matches_reference(q_dtype, k_dtype, m, n, heads, dim, clean):
    check_prefill(indexer_triton.fp8_mqa_logits, q_dtype, k_dtype, m, n, heads, dim, clean, "cuda")


@needs_triton
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("next_n,lens_shape", PAGED_FORMS, ids=[f"n{n}-{s}" for n, s in PAGED_FORMS])
@pytest.mark.parametrize("block_size", [32, 64])
@pytest.mark.parametrize("clean", [True, False])
@pytest.mark.parametrize("heads,dim", [(8, 64), (64, 128)])
def test_gpu_paged_matches_reference(dtype, next_n, lens_shape, block_size, clean, heads, dim):
    check_paged(indexer_triton.fp8_paged_mqa_logits, dtype, next_n, lens_shape, block_size, clean, "cuda", heads,
                dim)


def _no_kernel_here(monkeypatch, arch, fake_device=True):
    """Dispatch as on a GPU of `arch` (faked on a machine without one) for which this build has no kernel."""
    if fake_device:
        real = dsv4ops.platform.device_arch
        monkeypatch.setattr(dsv4ops.platform, "device_arch",
                            lambda device: arch if torch.device(device).type == "cuda" else real(device))
    monkeypatch.setattr(dsv4ops.platform, "built_arch_for",
                        lambda a, _real=dsv4ops.platform.built_arch_for: None if a == arch else _real(a))


@needs_triton
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_wrappers_use_triton_without_a_kernel(dtype, monkeypatch, caplog):
    _no_kernel_here(monkeypatch, dsv4ops.platform.device_arch("cuda"), fake_device=False)
    with caplog.at_level(logging.WARNING, logger="dsv4ops"):
        check_prefill(dsv4ops.fp8_mqa_logits, dtype, dtype, 33, 300, 64, 128, True, "cuda")
        check_paged(lambda *a: dsv4ops.fp8_paged_mqa_logits(*a[:7], kv_format=a[7]), dtype, 2, "Bn", 64, True, "cuda")
    assert any("uses the Triton fallback" in r.getMessage() for r in caplog.records)
    counts = dispatch.fallback_counts()
    assert any(op == "fp8_mqa_logits" and reason.startswith("Triton fallback") for op, reason in counts)
    assert any(op == "fp8_paged_mqa_logits" and reason.startswith("Triton fallback") for op, reason in counts)


# ----------------------------------------------------------------------------------------------------------
# dispatch on the CPU: no kernel for the device, triton importable (simulated)

@pytest.mark.parametrize("op", ["fp8_mqa_logits", "fp8_paged_mqa_logits"])
def test_dispatch_picks_triton_without_a_kernel(op, monkeypatch, caplog):
    _no_kernel_here(monkeypatch, "gfx942")
    monkeypatch.setattr(indexer_triton, "available", lambda: True)
    cuda = torch.device("cuda", 0)
    path, reason = indexer.logits_path(op, cuda)
    assert path == indexer.TRITON
    assert "no kernel built for gfx942" in reason
    with caplog.at_level(logging.WARNING, logger="dsv4ops"):
        for _ in range(3):
            assert indexer._choose_logits_path(op, cuda) == indexer.TRITON
    messages = [r.getMessage() for r in caplog.records if "Triton fallback" in r.getMessage()]
    assert len(messages) == 1, messages  # logged once per (op, reason)
    assert messages[0].startswith(f"dsv4ops: {op} on gfx942 uses the Triton fallback: no kernel built for gfx942")
    assert dispatch.fallback_counts() == {(op, f"Triton fallback: {reason}"): 3}

    # Without triton: the reference, and the reason says why.
    monkeypatch.setattr(indexer_triton, "available", lambda: False)
    path, reason = indexer.logits_path(op, cuda)
    assert path == indexer.REFERENCE and "triton is not installed" in reason

    # DSV4OPS_DISABLE still means the reference; DSV4OPS_FORCE still demands the kernel.
    monkeypatch.setattr(indexer_triton, "available", lambda: True)
    monkeypatch.setenv("DSV4OPS_DISABLE", op)
    assert indexer.logits_path(op, cuda) == (indexer.REFERENCE, "disabled by DSV4OPS_DISABLE")
    monkeypatch.delenv("DSV4OPS_DISABLE")
    monkeypatch.setenv("DSV4OPS_FORCE", op)
    with pytest.raises(RuntimeError, match="forced by DSV4OPS_FORCE"):
        indexer.logits_path(op, cuda)


@pytest.mark.parametrize("op", ["fp8_mqa_logits", "fp8_paged_mqa_logits"])
def test_dispatch_cpu_keeps_the_kernel(op):
    assert indexer.logits_path(op, "cpu") == (indexer.KERNEL, None)


def test_wrapper_routes_to_triton(monkeypatch):
    """The public wrappers hand every argument to the Triton functions when that path is chosen."""
    calls = []
    monkeypatch.setattr(indexer, "_choose_logits_path", lambda op, device, triton_unsupported=None: indexer.TRITON)
    monkeypatch.setattr(indexer_triton, "fp8_mqa_logits", lambda *a: calls.append(("prefill", a)) or "prefill")
    monkeypatch.setattr(indexer_triton, "fp8_paged_mqa_logits", lambda *a: calls.append(("paged", a)) or "paged")
    q = fp8_tensor((2, 4, 32), torch.float8_e4m3fnuz, seed=1)
    s = torch.ones(3)
    assert dsv4ops.fp8_mqa_logits(q, "k", s, "w", "ks", "ke", False) == "prefill"
    assert calls[-1] == ("prefill", (q, "k", s, "w", "ks", "ke", False))
    q4 = q.reshape(1, 2, 4, 32)
    c = torch.zeros(1, 16 * 36, dtype=torch.uint8)
    assert dsv4ops.fp8_paged_mqa_logits(q4, c, "w", "l", "t", 7, True, kv_format="fnuz") == "paged"
    assert calls[-1] == ("paged", (q4, c, "w", "l", "t", 7, True, torch.float8_e4m3fnuz))
    assert dsv4ops.fp8_paged_mqa_logits(q4, c, "w", "l", "t", 7)
    assert calls[-1][1][-1] == torch.float8_e4m3fn  # the cache defaults to OCP, as for the kernel


def test_compiled_wrappers_call_the_triton_ops(monkeypatch):
    """The public wrappers on the Triton path compile with fullgraph: the launches are the dsv4_triton ops (Dynamo
    cannot trace triton's import, its @triton.jit definitions or the launch-side checks), which launch eagerly
    (here the launch is the reference's math, so this runs without triton and without a GPU)."""
    launched = []

    def prefill(q, k, k_scale, weights, ks, ke, clean_logits):
        launched.append("prefill")
        return reference.fp8_mqa_logits(q, k, k_scale, weights, ks, ke, clean_logits)

    def paged(q, cache, weights, lens, table, max_len, clean_logits, kv_dtype):
        launched.append(("paged", kv_dtype))
        return reference.fp8_paged_mqa_logits(q, cache, weights, lens, table, max_len, clean_logits, kv_dtype)

    monkeypatch.setattr(indexer, "_choose_logits_path", lambda op, device, triton_unsupported=None: indexer.TRITON)
    monkeypatch.setattr(indexer_triton, "_launch_mqa_logits", prefill)
    monkeypatch.setattr(indexer_triton, "_launch_paged_mqa_logits", paged)
    torch._dynamo.reset()
    m, n, heads, dim = 5, 40, 4, 32
    q, k = fp8_tensor((m, heads, dim), torch.float8_e4m3fn, seed=1), fp8_tensor((n, dim), torch.float8_e4m3fn, seed=2)
    k_scale = torch.rand(n) + 0.5
    weights = torch.randn(m, heads, requires_grad=True)  # as from a projection in a graph that is not no_grad
    ks, ke = windows(m, n, seed=3)
    compiled = torch.compile(lambda q_: dsv4ops.fp8_mqa_logits(q_, k, k_scale, weights, ks, ke), fullgraph=True)
    got = compiled(q)
    assert not got.requires_grad  # the logits carry no gradient, as in eager calls
    assert torch.equal(got, reference.fp8_mqa_logits(q, k, k_scale, weights.detach(), ks, ke))
    assert launched == ["prefill"]

    cache, table, _ = paged_cache([150, 70, 199], 16, dim, torch.float8_e4m3fn, seed=4)
    lens = paged_lens(2, "Bn")
    q4 = fp8_tensor((3, 2, heads, dim), torch.float8_e4m3fn, seed=5)
    w4 = torch.randn(6, heads)
    compiled = torch.compile(lambda q_: dsv4ops.fp8_paged_mqa_logits(q_, cache, w4, lens, table, 200), fullgraph=True)
    want = reference.fp8_paged_mqa_logits(q4, cache, w4, lens, table, 200, True, torch.float8_e4m3fn)
    assert torch.equal(compiled(q4), want)
    assert launched[1:] == [("paged", torch.float8_e4m3fn)]
    torch._dynamo.reset()


def test_module_imports_without_triton():
    """indexer_triton imports triton only inside kernels()/available()."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(indexer_triton))
    top_level = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    names = [alias.name for node in top_level for alias in node.names] + [
        node.module or "" for node in top_level if isinstance(node, ast.ImportFrom)]
    assert not any(name.startswith("triton") for name in names), names
