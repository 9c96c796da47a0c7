"""The ops torch.ops.flash_attn_cuda.* (csrc/api/torch_ops.cpp): schemas, fake implementations, the C++
autograd and torch.compile tracing. On meta tensors (CPU, wherever the extension is built) and
through torch.library.opcheck on CUDA tensors (GPU)."""

import pytest
import torch
from functorch.compile import make_boxed_func
from torch._dynamo import compiled_autograd
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.testing import CompileCounter

from conftest import random_qkv, requires_gpu, skip_unbuilt
from flash_attn_cuda import _extension

needs_extension = pytest.mark.skipif(not _extension.is_built(), reason="the extension is not built")
pytestmark = needs_extension

SCALE = 0.125


def ops():
    return _extension.ops()


def meta_qkv(nheads_k=2):
    shapes = ((2, 65, 4, 64), (2, 81, nheads_k, 64), (2, 81, nheads_k, 64))
    return [torch.empty(s, device="meta", dtype=torch.bfloat16).requires_grad_() for s in shapes]


def options(causal=True, deterministic=False, max_seqlen=0, dropout_p=0.0, return_softmax=False):
    """The ops' trailing options (csrc/api/options.h), padded layout, no window."""
    return (max_seqlen, max_seqlen, SCALE, causal, -1, -1, 0.0, None, deterministic, dropout_p, return_softmax)


def fwd_args(q, k, v, causal=True, deterministic=False):
    return (q, k, v, None, None, *options(causal, deterministic))


def test_forward_and_backward_shapes_on_meta():
    q, k, v = meta_qkv()
    out, lse, *_ = ops().fwd(*fwd_args(q, k, v))
    assert out.shape == q.shape and out.dtype == q.dtype and out.requires_grad
    assert lse.shape == (2, 4, 65) and lse.dtype == torch.float32 and not lse.requires_grad
    grads = torch.autograd.grad(out, (q, k, v), torch.empty_like(out))
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]


@pytest.mark.parametrize("packed_q", [False, True])
def test_packed_gradient_is_one_tensor_on_meta(packed_q):
    """qkv packed (q None) or q with a packed kv: the packed tensor gets one gradient of its shape."""
    q = None if packed_q else torch.empty(2, 65, 4, 64, device="meta", dtype=torch.bfloat16).requires_grad_()
    packed = torch.empty(2, 65, 3 if packed_q else 2, 4, 64, device="meta", dtype=torch.bfloat16).requires_grad_()
    out, *_ = ops().packed_fwd(q, packed, None, None, *options())
    assert out.shape == (2, 65, 4, 64)
    leaves = (packed,) if packed_q else (q, packed)
    grads = torch.autograd.grad(out, leaves, torch.empty_like(out))
    assert [g.shape for g in grads] == [t.shape for t in leaves]


def test_only_inputs_output_lse_and_rng_state_are_saved_on_meta():
    q, k, v = meta_qkv()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        ops().fwd(*fwd_args(q, k, v))
    assert sorted(saved) == sorted([q.shape, k.shape, v.shape, q.shape, (2, 4, 65), (0,)])


@pytest.mark.parametrize("return_softmax", [False, True])
def test_dropout_outputs_on_meta(return_softmax):
    """With dropout the forward also returns its (seed, offset) and, for return_attn_probs, the
    probabilities with seqlen_q and seqlen_k rounded up to 128."""
    q, k, v = meta_qkv()
    out, lse, rng_state, s_dmask = ops().fwd(q, k, v, None, None,
                                             *options(dropout_p=0.1, return_softmax=return_softmax))
    assert rng_state.shape == (2,) and rng_state.dtype == torch.int64
    assert s_dmask.shape == ((2, 4, 128, 128) if return_softmax else (0,)) and s_dmask.dtype == q.dtype


def test_double_backward_raises_on_meta():
    q, k, v = meta_qkv()
    out, *_ = ops().fwd(*fwd_args(q, k, v))
    (dq,) = torch.autograd.grad(out, (q,), torch.empty_like(out), create_graph=True)
    with pytest.raises(RuntimeError, match="derivative for flash_attn_cuda::bwd is not implemented"):
        dq.sum().backward()


def test_compiled_training_step_records_both_ops_on_meta():
    """torch.compile(fullgraph=True) traces the forward op into the forward graph and, through
    the C++ autograd, the backward op into the backward graph."""
    graphs = []

    def keep_targets(gm, _inputs):
        graphs.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return make_boxed_func(gm)

    def step(q, k, v):
        out, *_ = ops().fwd(*fwd_args(q, k, v, deterministic=True))
        return out.float().square().sum()

    backend = aot_autograd(fw_compiler=keep_targets, bw_compiler=keep_targets)
    q, k, v = meta_qkv()
    torch.compile(step, fullgraph=True, backend=backend)(q, k, v).backward()
    assert len(graphs) == 2
    assert "flash_attn_cuda.fwd.default" in graphs[0] and "flash_attn_cuda.bwd.default" not in graphs[0]
    assert "flash_attn_cuda.bwd.default" in graphs[1]
    assert q.grad.shape == q.shape and k.grad.shape == k.shape


def test_compiled_varlen_keeps_max_seqlen_symbolic_on_meta():
    """A varlen batch's longest sequence changes from step to step: under torch.compile(dynamic=True)
    max_seqlen is a SymInt of the schemas, so new values reuse the traced graph."""
    counter = CompileCounter()

    @torch.compile(backend=counter, dynamic=True, fullgraph=True)
    def attend(q, k, v, cu_seqlens, max_seqlen):
        return ops().fwd(q, k, v, cu_seqlens, cu_seqlens, *options(max_seqlen=max_seqlen))[0]

    for max_seqlen in (100, 117, 130):
        q, k, v = (torch.empty(300, 4, 64, device="meta", dtype=torch.bfloat16) for _ in range(3))
        cu_seqlens = torch.empty(4, device="meta", dtype=torch.int32)
        assert attend(q, k, v, cu_seqlens, max_seqlen).shape == q.shape
    assert counter.frame_count == 1


def test_compiled_autograd_runs_the_backward_on_meta():
    """Compiled autograd traces the backward of a forward run eagerly (the C++ Function leaves no
    output marked non-differentiable, which compiled autograd does not allow)."""
    q, k, v = meta_qkv()
    out, lse, *_ = ops().fwd(*fwd_args(q, k, v))
    with compiled_autograd._enable(torch.compile(backend="eager")):
        out.float().sum().backward()
    assert q.grad.shape == q.shape and v.grad.shape == v.shape and not lse.requires_grad


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("causal", [False, True])
def test_opcheck_on_cuda(causal):
    """Schema, autograd registration, fake implementations against the CUDA kernels, and AOT
    dispatch, for each op (deterministic backward, so that eager and traced runs agree bitwise). The
    backward ops get detached inputs, as autograd gives them: they have no derivative."""
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    q, k, v = (t.requires_grad_() for t in random_qkv(2, 97, 130, 4, 2, head_dim, dtype, seed=31))
    torch.library.opcheck(ops().fwd.default, fwd_args(q, k, v, causal))
    out, lse, *_ = ops().fwd(*fwd_args(q, k, v, causal))
    q, k, v, out = (t.detach() for t in (q, k, v, out))
    torch.library.opcheck(ops().bwd.default,
                          (torch.randn_like(out), q, k, v, out, lse, None, None, None, *options(causal, True)))
    qkv = torch.randn(2, 97, 3, 4, head_dim, device="cuda", dtype=dtype).requires_grad_()
    packed_args = (None, qkv, None, None, *options(causal, True))
    torch.library.opcheck(ops().packed_fwd.default, packed_args)
    out, lse, *_ = ops().packed_fwd(*packed_args)
    torch.library.opcheck(ops().packed_bwd.default, (torch.randn_like(out), None, qkv.detach(), out.detach(), lse, None,
                                                     None, None, *options(causal, True)))
