"""radixlm.radix_cache: prefix cache (radix tree over token ids -> KV pages) and the page free list.

Pure Python, stdlib only: importing this package must never import torch.
"""

from .page_pool import PagePool
from .radix_cache import MatchResult, RadixCache, RadixCacheInvariantError, TreeNode

__all__ = ["MatchResult", "PagePool", "RadixCache", "RadixCacheInvariantError", "TreeNode"]
