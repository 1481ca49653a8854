# SPDX-License-Identifier: Apache-2.0
"""oomb for PyTorch: chunk-recurrent training of Hugging Face causal LMs over oomb's paged memory.

``oomb.torch.ChunkRecurrent`` is the driver (``oomb.hf.ChunkRecurrentTrainer`` inside HF's Trainer,
``oomb.distributed`` for data parallelism); ``oomb.ops`` the torch.library ops of dense attention in
place over ``oomb.pages.PagedStore`` (the library's paged KV cache and gradient mirror);
``oomb.paged.PagedSession`` the C++ trainer's paged attention, for offload and page-sparse attention
on either device. docs/pytorch.md has the whole story.
"""
from . import _lib
from ._lib import OombError

__version__ = _lib.version()
__all__ = ["OombError", "__version__"]
