"""EM routing, layers and models off the CPU and under autocast: everything runs with model
and inputs on the meta device (a tensor made without ``device=`` lands on the CPU and the op
fails), index tensors are built once per device, and the EM statistics stay in fp32 under
bf16 autocast."""

from __future__ import annotations

import pytest
import torch

import capsnet.nn.routing.em as em
from capsnet import models
from capsnet.nn import losses
from capsnet.nn.em_layers import ClassCaps, ConvMatrixCaps, PrimaryMatrixCaps, coordinate_bias
from capsnet.nn.routing import conv_scope, em_routing

META = torch.device("meta")
TINY = {"A": 8, "B": 4, "C": 4, "D": 4, "input_size": 24, "num_classes": 5}


def _em_model_names() -> list[str]:
    """Every registered model of the EM family (capsnet/models/em.py)."""
    return [n for n in models.names() if models.spec(n).model_cls.__module__ == "capsnet.models.em"]


def _inputs(device, batch=3, n_in=18, n_out=4, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    tensors = (
        torch.randn(batch, n_in, 16, generator=g, dtype=dtype),
        torch.rand(batch, n_in, generator=g, dtype=dtype),
        torch.randn(n_in, n_out, 4, 4, generator=g, dtype=dtype) / 2,
        0.1 * torch.randn(n_out, generator=g, dtype=dtype),
        0.1 * torch.randn(n_out, generator=g, dtype=dtype),
    )
    return [t.to(device).requires_grad_() for t in tensors]


def test_the_em_models_are_all_here():
    assert set(_em_model_names()) == {"em-capsnet", "em-capsnet-small", "smallnorb-cnn"}


@pytest.mark.parametrize("scoped", [False, True])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("block", [None, 2])
def test_em_routing_runs_on_meta(scoped, bias, block):
    """Forward and backward of the routing (eager steps, recomputed per block in the
    backward pass) with every tensor on the meta device, per group and with a scope."""
    inputs = _inputs(META)
    scope = conv_scope(1, 3, 4, 2, 3, 1, META) if scoped else None  # 2 windows of 18 slots
    if scoped:
        inputs = _inputs(META, batch=2)
    vote_bias = torch.randn(18, 1, 16, device=META) if bias else None
    pose, act = em_routing(*inputs, 3, vote_bias=vote_bias, scope=scope, block=block)
    assert pose.device == act.device == META
    assert pose.shape == (inputs[0].shape[0], 4, 16) and act.shape == (inputs[0].shape[0], 4)
    (pose.sum() + act.sum()).backward()
    for t in inputs:
        assert t.grad is not None and t.grad.device == META and t.grad.shape == t.shape


def test_em_steps_run_on_meta():
    """The step functions the compiled path compiles, called eagerly on meta."""
    children, acts, weight, beta_v, beta_a = _inputs(META)
    kids = em.expand_poses(children, 4)  # (N, I, 4, 16)
    w = em.expand_weight(weight, 4)  # (I, J, 4, 16)
    logits = torch.zeros(3, 18, 4, device=META)
    log_total = torch.zeros(3, 18, device=META)
    lam = torch.tensor(0.01, device=META)
    out, peak, sumexp = em.em_step(kids, w, None, acts, logits, log_total, beta_v, beta_a, lam,
                                   em.EM_MIN_VAR)  # fmt: skip
    assert out.shape == (3, 18, 4) and peak.shape == sumexp.shape == (3, 18)
    pose, act = em.em_last_step(kids, w, None, acts, out, log_total, beta_v, beta_a, lam,
                                em.EM_MIN_VAR)  # fmt: skip
    (pose.sum() + act.sum()).backward()
    assert children.grad.device == META and weight.grad.device == META


@pytest.mark.parametrize("scope", ["global", "window"])
def test_em_layers_run_on_meta(scope):
    primary = PrimaryMatrixCaps(8, 2).to(META)
    conv = ConvMatrixCaps(2, 3, kernel=3, stride=2, routing_scope=scope).to(META)
    classes = ClassCaps(3, 5).to(META)
    x = torch.rand(2, 8, 9, 9, device=META)
    poses, acts = primary(x)  # (2, 9, 9, 2, 16)
    poses, acts = conv(poses, acts)  # (2, 4, 4, 3, 16)
    assert poses.shape == (2, 4, 4, 3, 16) and acts.device == META
    offsets = torch.rand(4, 4, 2, device=META)
    class_poses, scores = classes(poses, acts, offsets)
    assert class_poses.shape == (2, 5, 16) and scores.device == META
    scores.sum().backward()
    for layer in (primary, conv, classes):
        assert all(p.grad is not None and p.grad.device == META for p in layer.parameters())
    assert coordinate_bias(offsets, 3, (3, 7)).device == META


@pytest.mark.parametrize("name", _em_model_names())
@pytest.mark.parametrize("scope", ["global", "window"])
def test_em_models_train_a_step_on_meta(name, scope):
    """Every registered EM-family model: forward, spread loss and backward on meta."""
    overrides = {"routing_scope": scope} if "routing_scope" in models.config_fields(name) else {}
    model = models.build(name, **overrides).to(META)
    x = torch.rand(2, 1, 28, 28, device=META)
    target = torch.tensor([1, 7], device=META)
    out = model(x)
    assert out.scores.shape == (2, 10) and out.scores.device == META
    losses.spread_loss(out.scores, target, 0.5).backward()
    assert all(p.grad is not None and p.grad.device == META for p in model.parameters())


def test_index_tensors_are_built_once_per_device_and_shape():
    """The global scope (child index, per-child counts) and the inverse temperatures are
    cached per (shape, device): built on their device once, not copied every step."""
    a = conv_scope(2, 7, 7, 2, 3, 2, torch.device("cpu"))
    assert conv_scope(2, 7, 7, 2, 3, 2, torch.device("cpu")) is a
    on_meta = conv_scope(2, 7, 7, 2, 3, 2, META)
    assert on_meta is not a and on_meta.index.device == META
    lams = em._inverse_temperature_tensor(3, 0.01, META, torch.float32)
    assert lams.device == META and lams.shape == (3,)
    model = models.build("em-capsnet-small", **TINY)
    first = model.coordinate_offsets(2, 2, 24, 24, META)
    assert first.device == META and model.coordinate_offsets(2, 2, 24, 24, META) is first


def test_cached_tensors_made_in_inference_mode_still_train():
    """A first forward under inference_mode (evaluation) must not cache inference tensors
    that a later training step would save for its backward pass."""
    model = models.build("em-capsnet-small", **{**TINY, "input_size": 25})  # a fresh shape
    x = torch.rand(2, 1, 25, 25)
    with torch.inference_mode():
        model(x)
    losses.spread_loss(model(x).scores, torch.tensor([0, 1]), 0.5).backward()
    assert all(p.grad is not None for p in model.parameters())


# ---- precision -------------------------------------------------------------------------------


def test_routing_statistics_are_fp32_under_bf16_autocast():
    """bf16 inputs under bf16 autocast: the steps' logits, maxima and normalisers and the
    routed poses and activations are fp32, equal (to fp32 rounding) to routing the same
    bf16 values converted to fp32; a bf16 computation would be off by about 1e-2."""
    children, acts, weight, beta_v, beta_a = [t.detach() for t in _inputs("cpu", batch=4)]
    low = [t.to(torch.bfloat16) for t in (children, acts, weight, beta_v, beta_a)]
    expected = em_routing(*[t.float() for t in low], 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = em_routing(*low, 3)
        kids = em.expand_poses(low[0].float(), 4)
        logits, peak, sumexp = em.em_step(
            kids, em.expand_weight(low[2], 4), None, low[1], torch.zeros(4, 18, 4),
            torch.zeros(4, 18), low[3], low[4], torch.tensor(0.01), em.EM_MIN_VAR,
        )  # fmt: skip
    assert got[0].dtype == got[1].dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert logits.dtype == peak.dtype == sumexp.dtype == torch.float32


@pytest.mark.parametrize("compiled", [False, True])
def test_model_under_bf16_autocast_routes_in_fp32(compiled, tmp_path, monkeypatch):
    """The convolutions run in bf16, routing in fp32: fp32 scores and poses close to the
    fp32 model's (compiled routing on CPU too, compiled afresh: a long CI worker's earlier
    compiles once made this one fail, InductorError, and fall back to eager)."""
    torch.manual_seed(0)
    model = models.build("em-capsnet-small", **TINY)
    if compiled:
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
        torch._dynamo.reset()
        model.compile_routing()
    x = torch.rand(4, 1, 24, 24)
    with torch.no_grad():
        expected = model(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = model(x)
    assert got.scores.dtype == got.poses.dtype == torch.float32
    torch.testing.assert_close(got.scores, expected.scores, rtol=0, atol=1e-2)
    torch.testing.assert_close(got.poses, expected.poses, rtol=0.05, atol=0.05)
    assert model.caps1.compiled == compiled  # no fallback to eager


@pytest.mark.parametrize("impl", ["eager", "reference"])
def test_em_benchmark_worker_assumes_no_cpu(impl, capsys):
    """benchmarks/em_throughput.py's training step (model, data, Adam, the loop reference)
    on the meta device: nothing in it is made on the CPU by default, so --device cuda works.
    The worker's entry point runs in this process (its threads setting restored after)."""
    import json

    from benchmarks import em_throughput

    threads = torch.get_num_threads()
    try:
        em_throughput.main(
            ["--model", "em-capsnet-small", "--input-size", "24", "--batch-size", "2",
             "--steps", "1", "--warmup", "1", "--iterations", "2", "--device", "meta",
             "--worker", impl]
        )  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (result["impl"], result["device"], result["peak_gpu_gib"]) == (impl, "meta", None)


def test_em_benchmark_refuses_cuda_without_a_gpu(capsys):
    """The argument check in this process (tests/test_bench.py runs the script itself)."""
    from benchmarks import em_throughput

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(SystemExit) as exited:
        em_throughput.main(["--device", "cuda"])
    assert exited.value.code == 2
    assert "--device cuda: no CUDA device is available here" in capsys.readouterr().err
