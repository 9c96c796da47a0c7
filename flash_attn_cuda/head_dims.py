"""The kernel head dims and the rule that maps a head dim to one: the one place both are written.
csrc/generate_kernels.py (and through it setup.py and the C++ dispatch) reads this file; the
interface pads q, k, v to kernel_head_dim(head_dim) with zeros."""

# The FA2 family (sm80) has a kernel for each; the Hopper family serves the subset it was built
# for (generate_kernels.FAMILIES) and the FA2 family the rest.
KERNEL_HEAD_DIMS = (32, 64, 96, 128, 160, 192, 224, 256)
MAX_HEAD_DIM = KERNEL_HEAD_DIMS[-1]


def kernel_head_dim(head_dim):
    """The smallest kernel head dim >= head_dim (head_dim in [1, MAX_HEAD_DIM])."""
    return next(d for d in KERNEL_HEAD_DIMS if d >= head_dim)
