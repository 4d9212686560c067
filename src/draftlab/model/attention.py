"""The attention kernels for work whose shapes change from call to call: training batches, extraction batches, the
graphs generator's prefills and the bench's prompts.

cuDNN's attention, PyTorch's first choice on the H200, builds an execution plan on the host for every new shape:
44 ms a call in the trainer's profile, and the extract stage, whose padded batch lengths vary from batch to batch,
ran 1.8x faster without it. Flash and memory-efficient attention plan nothing. Generate's
decode step keeps PyTorch's choice: its shape never changes, so a plan is built once.

The switch is process-wide (torch.backends flags), not per thread: enter it only on the thread that runs the model
(each stage's main thread), never on reader or writer threads, whose overlapping enters and exits could leave
cuDNN on or off for the others.
"""

from torch.nn.attention import SDPBackend, sdpa_kernel

VARIABLE_SHAPE_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def variable_shape_attention():
    """A context: scaled_dot_product_attention inside it never takes cuDNN."""
    return sdpa_kernel(VARIABLE_SHAPE_ATTENTION)
