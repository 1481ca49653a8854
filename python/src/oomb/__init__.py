# SPDX-License-Identifier: Apache-2.0
"""oomb for PyTorch: chunk-recurrent training of Hugging Face causal LMs over oomb's paged memory.

``oomb.torch.ChunkRecurrent`` is the driver; ``oomb.ops`` the torch.library ops it is built on;
``oomb.pages.PagedStore`` the library's paged KV cache and gradient mirror. docs/pytorch.md has
the whole story.
"""
from . import _lib
from ._lib import OombError

__version__ = _lib.version()
__all__ = ["OombError", "__version__"]
