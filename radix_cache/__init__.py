"""radixlm.radix_cache: prefix cache (radix tree over token ids -> KV pages) and the page free list.

Pure Python, stdlib only: importing this package must never import torch.
"""

from .page_pool import PagePool
from .radix_cache import MatchResult, RadixCache, RadixCacheInvariantError, TreeNode
from .tiers import HostTierIndex, TierListener, page_digests

__all__ = ["HostTierIndex", "MatchResult", "PagePool", "RadixCache", "RadixCacheInvariantError", "TierListener", "TreeNode",
           "page_digests"]
