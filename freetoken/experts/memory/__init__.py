"""Where experts live: the host pool, the slot table and its policies, the cache, one layer's decision, copies and page-locking."""
